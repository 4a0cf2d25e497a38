"""What a model family cannot run, as data: checked when a scenario is validated, before any engine starts; and how
its config.json states its rope.

Gemma 2 and 3 produce activations beyond float16's range: transformers gives NaN (transformers#36822) and vLLM
refuses float16 for them (its _FLOAT16_NOT_SUPPORTED_MODELS), so a float16 run would only measure the overflow.
"""

from __future__ import annotations

FLOAT16_OVERFLOWS = frozenset({"gemma2", "gemma3", "gemma3_text"})


def dtype_problem(family: str | None, dtype: str) -> str | None:
    """Why a model of this family cannot run in this dtype, or None."""
    if dtype == "float16" and family in FLOAT16_OVERFLOWS:
        return (f"model type {family} overflows float16 (transformers gives NaN, vLLM refuses it): "
                "use float32 or bfloat16")
    return None


def rope_parameters(config: dict) -> dict:
    """The rope's parameters from config.json: `rope_parameters` (transformers 5; a per-layer-type dict's
    full_attention entry) or the older `rope_scaling`, with its kind under `rope_type` (older files: `type`)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope = dict(rope.get("full_attention", rope))
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope
