"""Rope as llama.cpp holds it, in the GGUF files written here: a Llama's q and k rows permuted into llama.cpp's rope
layout, and a scaled rope as llama.cpp's converter writes it (linear and yarn as rope.scaling keys, llama3 as a
rope_freqs tensor, LongRoPE as rope_factors_long/_short tensors with its attention factor), a rope llama.cpp would
compute differently refused in one line. Every rope parameter is read as the installed transformers reads it
(read_rope), so the file holds the rope HF computes with."""

from __future__ import annotations

import math

import numpy as np

from adapters.engines.gguf_writer import Hparams, refuse, require
from harness.models.families import hf_rope_parameters


def rope_layout(rows: np.ndarray, n_head: int) -> np.ndarray:
    """HF -> llama.cpp for a q or k projection weight [n_head*d, in]: within each head, rows (j, j + d/2) become
    (2j, 2j + 1) (llama.cpp's rope rotates adjacent pairs, HF's rotate_half the two halves of a head)."""
    head_dim = rows.shape[0] // n_head
    return rows.reshape(n_head, 2, head_dim // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


PLAIN_ROPES = frozenset({"default", "linear", "yarn"})  # rope scalings every llama.cpp graph applies (ggml_rope_ext)
# the Llama graph also multiplies each frequency's wavelength by a per-layer factor tensor: llama3's rope_freqs, and
# LongRoPE's rope_factors_long / rope_factors_short (loaded when the file's rope.scaling.type is longrope)
LLAMA_ROPES = PLAIN_ROPES | {"llama3", "longrope"}


def read_rope(config: dict, layer_type: str = "full_attention") -> dict:
    """The rope's parameters as the installed transformers reads config.json (harness.models.families
    .hf_rope_parameters: its default theta, its choice of original_max_position_embeddings); a config transformers
    refuses is refused here too, in one line."""
    try:
        return hf_rope_parameters(config, layer_type)
    except ValueError as exc:
        refuse(config, str(exc))


def one_rope(config: dict) -> dict:
    """The rope of a graph that rotates every layer alike (llama.cpp's llama, qwen2, qwen3moe): refused where a
    per-layer-type config gives its layer types different ropes."""
    rope = read_rope(config)
    differ = sorted({kind for kind in config.get("layer_types") or () if read_rope(config, kind) != rope})
    require(not differ, config, f"{', '.join(differ)} layers have a rope of their own (llama.cpp's "
            f"{config.get('model_type')} graph rotates every layer alike)")
    return rope


def original_context(config: dict, rope: dict) -> int:
    """The context the scaled rope was trained for, as transformers settles it (read_rope)."""
    value = rope.get("original_max_position_embeddings")
    if value is None:
        refuse(config, f"{rope['rope_type']} rope scaling without original_max_position_embeddings")
    return int(value)


def rope_factor(config: dict, rope: dict) -> float:
    """The scaling factor as HF reads it: `factor`, else max_position_embeddings over the original context (how
    transformers' yarn and longrope fill a missing factor)."""
    if rope.get("factor") is not None:
        return float(rope["factor"])
    return config.get("max_position_embeddings", 2048) / original_context(config, rope)


def rope_scaling(config: dict) -> Hparams:
    """llama.cpp's rope scaling keys for the config's rope (none for default rope and for llama3, whose scaling is
    the rope_freqs tensor rope_tensors writes): linear -> type and factor; yarn -> type, factor, original context
    and the betas the config sets (as llama.cpp's converter writes them); longrope -> type,
    original context (the length llama.cpp compares its context with to choose the long or short factors) and the
    attention factor HF scales cos and sin by. Refuses what llama.cpp would compute differently."""
    rope = one_rope(config)
    kind = rope["rope_type"]
    if kind == "linear":
        return {"rope_scaling_type": "linear", "rope_scaling_factor": rope_factor(config, rope)}
    if kind == "yarn":
        return yarn_scaling(config, rope)
    if kind == "longrope":
        return {"rope_scaling_type": "longrope", "rope_scaling_orig_ctx_len": original_context(config, rope),
                "rope_scaling_attn_factors": longrope_attention_factor(config, rope)}
    require(kind in LLAMA_ROPES, config, f"rope type '{kind}' has no llama.cpp equivalent (llama.cpp scales rope "
            "as none, linear, yarn, longrope or by llama3's per-frequency factors)")
    return {}


YARN_KEYS = (("beta_fast", "rope_scaling_yarn_beta_fast"), ("beta_slow", "rope_scaling_yarn_beta_slow"))


def yarn_scaling(config: dict, rope: dict) -> Hparams:
    """YaRN's keys. llama.cpp computes YaRN's attention factor itself (0.1 ln(factor) + 1, transformers' default)
    and ramps between its correction dimensions rounded outwards (transformers' truncate: true); a config that sets
    its own attention factor, mscale or an untruncated ramp would be computed differently, so it is refused."""
    require(rope.get("truncate", True), config, "yarn with truncate: false (llama.cpp always rounds YaRN's "
            "correction range outwards)")
    own = [key for key in ("attention_factor", "mscale", "mscale_all_dim") if rope.get(key) is not None]
    require(not own, config, f"yarn with its own {', '.join(own)} (llama.cpp's llama graph computes the attention "
            "factor from the scaling factor alone)")
    out: Hparams = {"rope_scaling_type": "yarn", "rope_scaling_factor": rope_factor(config, rope),
                    "rope_scaling_orig_ctx_len": original_context(config, rope)}
    out.update({setter: float(rope[key]) for key, setter in YARN_KEYS if rope.get(key) is not None})
    return out


def longrope_attention_factor(config: dict, rope: dict) -> float:
    """LongRoPE's attention factor as transformers computes it: the config's attention_factor, else
    sqrt(1 + ln(factor) / ln(original context)) for a factor above 1."""
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    factor = rope_factor(config, rope)
    return math.sqrt(1 + math.log(factor) / math.log(original_context(config, rope))) if factor > 1 else 1.0


def rope_tensors(config: dict) -> dict[str, np.ndarray]:
    """The rope tensors llama.cpp's converter generates beside the checkpoint's (generate_extra_tensors), by GGUF
    name: llama3 -> rope_freqs (each frequency's wavelength factor), longrope -> rope_factors_long and
    rope_factors_short (the config's lists); none for other ropes. Read from the full-attention layers' rope: the
    scaled ropes are the Llama graph's, whose hyperparameters (one_rope) already refuse layer types with ropes of their
    own; Gemma 3's sliding layers have a base of their own, which its hyperparameters write (rope_freq_base_swa)."""
    rope = read_rope(config)
    half = rope_dimensions(config) // 2
    if rope["rope_type"] == "llama3":
        return {"rope_freqs.weight": llama3_factors(config, rope, half)}
    if rope["rope_type"] != "longrope":
        return {}
    factors = {f"rope_factors_{kind}.weight": np.asarray(rope.get(f"{kind}_factor") or [], dtype=np.float32)
               for kind in ("long", "short")}
    sizes = sorted({len(f) for f in factors.values()})
    require(sizes == [half], config, f"longrope's long_factor and short_factor must have {half} entries (half the "
            f"rotated dimensions), not {' and '.join(map(str, sizes))}")
    return factors


def llama3_factors(config: dict, rope: dict, half: int) -> np.ndarray:
    """Llama 3's rope scaling as llama.cpp holds it: one factor per frequency that divides it (transformers'
    _compute_llama3_parameters): high frequencies kept, low ones divided by `factor`, a smooth band between. The
    original context is the one transformers settles on (llama.cpp's converter reads it from the top of config.json,
    8192 when absent)."""
    base = float(rope["rope_theta"])
    factor, low, high = (float(rope.get(k, d)) for k, d in (("factor", 8.0), ("low_freq_factor", 1.0),
                                                             ("high_freq_factor", 4.0)))
    original = original_context(config, rope)
    inv_freq = 1.0 / base ** (np.arange(0, 2 * half, 2, dtype=np.float32) / np.float32(2 * half))
    wavelength = 2 * math.pi / inv_freq.astype(np.float64)
    smooth = (original / wavelength - low) / (high - low)
    band = 1 / ((1 - smooth) / factor + smooth)
    factors = np.where(wavelength < original / high, 1.0, np.where(wavelength > original / low, factor, band))
    return factors.astype(np.float32)


def rope_dimensions(config: dict) -> int:
    """The rotated width of a head (head_dim, else hidden_size / heads)."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
