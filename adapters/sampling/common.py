"""Shared by the engines' sampling modules (hf_sampling, vllm_sampling, lmdeploy_sampling): where an effective
param came from, and the recorder a sampler transplant writes into (processed scores per step, inf/NaN per
operation, failures of the engine's own sampling op)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REQUEST, MODEL_JSON, DEFAULT = "request", "generation_config.json", "engine default"


def source_of(field: str, sent: dict[str, Any], model_json: dict[str, Any]) -> str:
    """Where the engine took a param's value from: the request, the model's generation_config.json, or its own
    default."""
    if sent.get(field) is not None:
        return REQUEST
    return MODEL_JSON if model_json.get(field) is not None else DEFAULT


class Recorder:
    """Collects what an engine's sampling code did to each step's logits. Hazards are kept once per operation (the
    first step it happened at, and on how many steps)."""

    def __init__(self):
        self.scores: list[Any] = []
        self.sampling: list[bool] = []
        self.hazards: dict[str, dict[str, Any]] = {}

    def op(self, step: int, name: str, tensor: Any) -> None:
        """Check one operation's output for inf/NaN."""
        import torch

        finite = torch.isfinite(tensor)
        if bool(finite.all()):
            return
        values = tensor[~finite]
        pos_inf = int((values == float("inf")).sum())
        nan = int(torch.isnan(values).sum())
        if nan == 0 and pos_inf == 0:
            return  # -inf is how samplers mask tokens out: not a hazard
        self._hazard(step, name, {"+inf": pos_inf, "nan": nan, "dtype": str(tensor.dtype).removeprefix("torch.")})

    def failure(self, step: int, name: str, exc: BaseException) -> None:
        self._hazard(step, name, {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]})

    def _hazard(self, step: int, name: str, details: dict[str, Any]) -> None:
        entry = self.hazards.setdefault(name, {"op": name, "first_step": step, "steps": 0, **details})
        entry["steps"] += 1

    def step(self, step: int, scores: Any, sampling: bool) -> None:
        """The processed scores the engine samples from (or takes the argmax of) at this step."""
        import torch

        self.scores.append(scores.detach().to(torch.float32).reshape(-1).clone())
        self.sampling.append(sampling)

    def save(self, path: Path) -> dict[str, Any]:
        """Processed scores as [steps, vocab] float32 safetensors; returns the JSON summary."""
        import torch
        from safetensors.torch import save_file

        if self.scores:
            save_file({"scores": torch.stack(self.scores)}, str(path))
        return {"path": str(path) if self.scores else "", "steps": len(self.scores), "sampling": self.sampling,
                "hazards": list(self.hazards.values())}


def sent_fields(params: Any, taken: tuple[str, ...], skip_default: bool | None = True,
                stop_included: bool | None = False) -> dict[str, Any]:
    """The constraint and detokenisation settings (Effective's fields) of an engine that takes the `taken` params
    as the request sets them: one it does not take is None (no such knob); unset skip_special_tokens is the
    engine's default, and include_stop_str_in_output (only meaningful with stop strings) its rule."""
    def value(name: str, default: Any = None) -> Any:
        given = getattr(params, name)
        return (default if given is None else given) if name in taken else None

    skip = value("skip_special_tokens", skip_default)
    included = value("include_stop_str_in_output", stop_included) if "include_stop_str_in_output" in taken \
        else stop_included
    return {"stop_token_ids": value("stop_token_ids"), "no_repeat_ngram_size": value("no_repeat_ngram_size"),
            "constraint": params.constraint.described() if params.constraint and "constraint" in taken else None,
            "logit_bias": value("logit_bias"), "bad_words": None, "skip_special_tokens": skip,
            "include_stop_str_in_output": included if params.stop or skip is False else None,
            "spaces_between_special_tokens": None if skip is not False
            else value("spaces_between_special_tokens", True)}


# generation_config.json keys that change no generated token (ids used for padding or the prompt, bookkeeping)
INERT_KEYS = frozenset({"bos_token_id", "pad_token_id", "decoder_start_token_id", "transformers_version",
                        "_from_model_config", "use_cache", "return_dict_in_generate", "output_attentions",
                        "output_hidden_states", "output_scores", "output_logits", "cache_implementation"})


def model_settings(model_path: Path) -> dict[str, Any]:
    """The token-changing fields of the model folder's generation_config.json that the canonical params do not
    cover (no_repeat_ngram_size, suppress_tokens, eos_token_id, ...), as written in the file."""
    import json

    from harness.core.vocabulary import PARAMS

    path = Path(model_path) / "generation_config.json"
    if not path.exists():
        return {}
    config = json.loads(path.read_text())
    return {k: v for k, v in config.items() if k not in INERT_KEYS and k not in PARAMS}


def settings_table(model_path: Path, applies: Any) -> dict[str, Any]:
    """One Setting per token-changing generation_config.json field: applies(key, value) -> (applied, note), where
    applied is "yes", "no" or "unknown"."""
    from harness.core.types import Setting

    table = {}
    for key, value in model_settings(model_path).items():
        applied, note = applies(key, value)
        table[key] = Setting(value=value, applied=applied, source=f"generation_config.json: {key}", note=note)
    return table
