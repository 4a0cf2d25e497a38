"""The values of a model folder's config.json that the harness and the engines' writers read themselves, checked where
the scenario is read: the rope (`rope_parameters`, the older `rope_scaling`, per layer type or not, and the top-level
rope_theta) and the mixture-of-experts fields (expert counts, experts per token, group routing, the scaling factor).
An odd value is one sentence naming its key; a key left out or null is not checked (the family's default applies)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Check = tuple[Callable[[Any], bool], str]  # (the value is usable, what belongs there)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


POSITIVE: Check = (lambda v: _number(v) and v > 0, "a positive number")
NUMBER: Check = (_number, "a number")
FRACTION: Check = (lambda v: _number(v) and 0 < v <= 1, "a number above 0, at most 1")
POSITIVE_INT: Check = (lambda v: _integer(v) and v > 0, "a positive integer")
COUNT: Check = (lambda v: _integer(v) and v >= 0, "an integer, 0 or more")
FLAG: Check = (lambda v: isinstance(v, bool), "true or false")
NAME: Check = (lambda v: isinstance(v, str) and bool(v), "a name (text)")
FACTORS: Check = (lambda v: isinstance(v, list) and bool(v) and all(POSITIVE[0](f) for f in v),
                  "a list of positive numbers")
LAYERS: Check = (lambda v: isinstance(v, list) and all(COUNT[0](i) for i in v), "a list of layer indices")

ROPE = {"rope_type": NAME, "type": NAME, "rope_theta": POSITIVE, "factor": POSITIVE, "attention_factor": POSITIVE,
        "beta_fast": NUMBER, "beta_slow": NUMBER, "low_freq_factor": POSITIVE, "high_freq_factor": POSITIVE,
        "mscale": NUMBER, "mscale_all_dim": NUMBER, "partial_rotary_factor": FRACTION,
        "original_max_position_embeddings": POSITIVE_INT, "short_factor": FACTORS, "long_factor": FACTORS}
TOP = {"rope_theta": POSITIVE, "partial_rotary_factor": FRACTION, "max_position_embeddings": POSITIVE_INT,
       "num_local_experts": COUNT, "num_experts": COUNT, "n_routed_experts": COUNT, "num_experts_per_tok": POSITIVE_INT,
       "moe_intermediate_size": POSITIVE_INT, "shared_expert_intermediate_size": POSITIVE_INT,
       "n_shared_experts": COUNT, "first_k_dense_replace": COUNT, "n_group": POSITIVE_INT, "topk_group": POSITIVE_INT,
       "routed_scaling_factor": POSITIVE, "norm_topk_prob": FLAG, "decoder_sparse_step": POSITIVE_INT,
       "mlp_only_layers": LAYERS}
EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")


def config_problem(config: dict[str, Any]) -> str | None:
    """The first odd rope or mixture-of-experts value of a config.json (and of its text_config), as "KEY is VALUE,
    where WHAT belongs", or None."""
    for prefix, part in (("", config), ("text_config.", config.get("text_config"))):
        if isinstance(part, dict):
            problem = _checked(part, TOP, prefix) or _rope_problem(part, prefix) or _routing_problem(part, prefix)
            if problem:
                return problem
    return None


def _checked(values: dict[str, Any], checks: dict[str, Check], prefix: str) -> str | None:
    for key, (usable, what) in checks.items():
        value = values.get(key)
        if value is not None and not usable(value):
            return _odd(prefix + key, value, what)
    return None


def _rope_problem(config: dict[str, Any], prefix: str) -> str | None:
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            return _odd(prefix + key, rope, "an object of rope settings (rope_type, rope_theta, factor, ...)")
        # transformers 5 keeps one rope per layer type ({"full_attention": {...}, "sliding_attention": {...}})
        per_layer_type = not set(rope) & set(ROPE) and any(isinstance(value, dict) for value in rope.values())
        for name, part in rope.items() if per_layer_type else [("", rope)]:
            where = f"{prefix}{key}.{name}." if name else f"{prefix}{key}."
            if not isinstance(part, dict):
                return _odd(where.rstrip("."), part, "an object of rope settings, one per layer type")
            problem = _checked(part, ROPE, where)
            if problem:
                return problem
    return None


def _routing_problem(config: dict[str, Any], prefix: str) -> str | None:
    """Experts per token within the experts there are, groups within the groups there are."""
    experts = next((config[key] for key in EXPERT_COUNTS if config.get(key)), None)
    per_token = config.get("num_experts_per_tok")
    if experts and per_token and per_token > experts:
        return _odd(f"{prefix}num_experts_per_tok", per_token, f"at most the {experts} experts the config names")
    groups, top_groups = config.get("n_group"), config.get("topk_group")
    if groups and top_groups and top_groups > groups:
        return _odd(f"{prefix}topk_group", top_groups, f"at most n_group ({groups})")
    return None


def _odd(key: str, value: Any, what: str) -> str:
    shown = repr(value)
    return f"{key} is {shown if len(shown) <= 40 else shown[:37] + '...'}, where {what} belongs"
