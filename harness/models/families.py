"""What a model family cannot run, as data: checked when a scenario is validated, before any engine starts; and how
its config.json states its rope (rope_parameters: the kind, read without transformers) and how the installed
transformers reads it (hf_rope_parameters: every parameter HF computes with).

Gemma 2 and 3 produce activations beyond float16's range: transformers gives NaN (transformers#36822) and vLLM
refuses float16 for them (its _FLOAT16_NOT_SUPPORTED_MODELS), so a float16 run would only measure the overflow.
"""

from __future__ import annotations

import copy

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


def hf_rope_parameters(config: dict, layer_type: str = "full_attention") -> dict:
    """The rope's parameters as the installed transformers computes with them: its config class for the model type
    reads config.json and standardises the rope (standardize_rope_params, run here, never rewritten), and every rope
    function of its models standardises it again when the model is built, as done here. So: the class's default theta
    where config.json gives none (Mixtral's 1e6, not 10000); original_max_position_embeddings from the top of
    config.json where it is there (by the second standardisation it is an attribute of the config, and it wins over
    the rope dict's), else the rope dict's, else the class's own default or max_position_embeddings; a per-layer-type
    dict only where the class declares those layer types (then `layer_type`'s entry). Raises ValueError with
    transformers' reason where it refuses the config."""
    from transformers import CONFIG_MAPPING, AutoConfig

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"model type {model_type!r} is not one transformers knows")
    kwargs = copy.deepcopy({key: value for key, value in config.items() if key != "model_type"})
    try:
        hf = AutoConfig.for_model(model_type, **kwargs)
        hf.standardize_rope_params()  # as each rope function does when the model is built
    except Exception as exc:  # transformers raises its own error types for a config it cannot read
        raise ValueError(f"transformers cannot read its config ({type(exc).__name__}: {exc})".splitlines()[0]) \
            from None
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    if hf.nested_rope_parameter_keys(rope):
        rope = dict(rope.get(layer_type) or {})
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope
