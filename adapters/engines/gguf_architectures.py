"""How llama.cpp's converter writes each HF model_type (WRITERS): the GGUF architecture, its hyperparameters from
config.json, which tensors change how (a Llama's q and k projections permuted into llama.cpp's rope layout, Gemma's
norm weights stored as 1 + w), a mixture of experts' weights stacked per block and projection [n_expert, rows, cols]
(stacked_experts), and f16 keeping 1-D tensors (norms) and routers in f32, as llama.cpp's converter does."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adapters.engines.gguf_rope import (
    LLAMA_ROPES,
    PLAIN_ROPES,
    one_rope,
    read_rope,
    rope_dimensions,
    rope_layout,
    rope_scaling,
)
from adapters.engines.gguf_writer import Hparams, require

Transform = Callable[[np.ndarray, Hparams], np.ndarray]


@dataclass(frozen=True)
class Architecture:
    """How llama.cpp's converter writes one HF model_type: the GGUF architecture (a gguf.MODEL_ARCH member, which
    also picks gguf's tensor-name map), the hyperparameters it writes (refusing a config whose math llama.cpp's graph
    for that architecture would not reproduce), the tensors it changes: (GGUF name suffix, transform), and the HF
    rope types whose scaling llama.cpp's graph for that architecture reproduces (others are refused)."""

    gguf_arch: str
    hparams: Callable[[dict], Hparams]
    transforms: tuple[tuple[str, Transform], ...] = ()
    ropes: frozenset[str] = PLAIN_ROPES


def hparams(config: dict) -> Hparams:
    """llama.cpp's Llama hyperparameters from an HF config.json, the rope as transformers reads it (one_rope), with
    the rope scaling keys of a scaled rope (rope_scaling)."""
    heads = config["num_attention_heads"]
    return {
        "block_count": config["num_hidden_layers"], "context_length": config.get("max_position_embeddings", 2048),
        "embedding_length": config["hidden_size"], "feed_forward_length": config["intermediate_size"],
        "head_count": heads, "head_count_kv": config.get("num_key_value_heads") or heads,
        "rope_freq_base": float(one_rope(config)["rope_theta"]),
        "layer_norm_rms_eps": float(config.get("rms_norm_eps", 1e-6)), "vocab_size": config["vocab_size"],
        "rope_dimension_count": rope_dimensions(config), **rope_scaling(config),
    }


GEMMA3_SWA_PERIOD = 6  # llama.cpp's gemma3 default: in every 6 layers, 5 sliding then 1 full (load_swa_pattern)
GEMMA3_SWA_ROPE_BASE = 10000.0  # llama.cpp's rope base of sliding layers when the GGUF names none


def gemma3_hparams(config: dict) -> Hparams:
    """llama.cpp's gemma3 hyperparameters, the keys its converter writes (conversion/gemma.py, Gemma3Model), plus the
    sliding layers' pattern and rope base only where they differ from llama.cpp's defaults."""
    layers, head_dim = config["num_hidden_layers"], config["head_dim"]
    full, sliding_rope = read_rope(config, "full_attention"), read_rope(config, "sliding_attention")
    require(config.get("query_pre_attn_scalar", head_dim) == head_dim, config,
            "llama.cpp scales attention by 1/sqrt(head_dim), not by query_pre_attn_scalar")
    require(config.get("attn_logit_softcapping") is None, config, "llama.cpp's gemma3 graph has no attention "
            "soft-capping")
    require(full["rope_type"] == sliding_rope["rope_type"] == "default", config, "rope scaling is not written here")
    out: Hparams = {
        "context_length": config["max_position_embeddings"], "embedding_length": config["hidden_size"],
        "block_count": layers, "feed_forward_length": config["intermediate_size"],
        "head_count": config["num_attention_heads"], "layer_norm_rms_eps": float(config["rms_norm_eps"]),
        "key_length": head_dim, "value_length": head_dim,
        "rope_freq_base": float(full["rope_theta"]),
        "sliding_window": config["sliding_window"], "head_count_kv": config["num_key_value_heads"]}
    sliding = [kind == "sliding_attention" for kind in config["layer_types"]]
    if sliding != [i % GEMMA3_SWA_PERIOD < GEMMA3_SWA_PERIOD - 1 for i in range(layers)]:
        out["sliding_window_pattern"] = sliding
    if float(sliding_rope["rope_theta"]) != GEMMA3_SWA_ROPE_BASE:
        out["rope_freq_base_swa"] = float(sliding_rope["rope_theta"])
    if config.get("final_logit_softcapping"):
        out["final_logit_softcapping"] = float(config["final_logit_softcapping"])
    return out


def n_experts(config: dict) -> int:
    """Routed experts per block (Mixtral's config names them num_local_experts, Qwen's num_experts)."""
    return int(config.get("num_local_experts") or config.get("num_experts") or 0)


def moe_hparams(config: dict) -> Hparams:
    """The Llama hyperparameters plus the mixture of experts' (what llama.cpp's converter writes for Mixtral as a
    Llama): experts per block and chosen per token. llama.cpp's llama graph routes by softmax over the router logits,
    keeps the top k and renormalises their weights, as Mixtral does (and, as for Mistral, attends without a sliding
    window)."""
    require(n_experts(config) > 0 and config.get("num_experts_per_tok", 0) > 0, config,
            "no expert count or experts per token in config.json")
    return {**hparams(config), "expert_count": n_experts(config),
            "expert_used_count": config["num_experts_per_tok"]}


def qwen3_moe_hparams(config: dict) -> Hparams:
    """llama.cpp's qwen3moe hyperparameters: moe_hparams plus the experts' own width and the head width (q/k norms
    act per head); its graph always renormalises the chosen experts' weights, and every layer is a MoE block."""
    require(config.get("norm_topk_prob", False), config,
            "llama.cpp's qwen3moe graph always renormalises the chosen experts' weights (norm_topk_prob false)")
    require(not config.get("mlp_only_layers") and config.get("decoder_sparse_step", 1) == 1, config,
            "llama.cpp's qwen3moe graph has a MoE block in every layer (mlp_only_layers, decoder_sparse_step)")
    require(not config.get("use_sliding_window"), config, "llama.cpp's qwen3moe graph has no sliding window")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {**moe_hparams(config), "expert_feed_forward_length": config["moe_intermediate_size"],
            "key_length": head_dim, "value_length": head_dim}


def _count(value: int | float | str | list[bool]) -> int:
    """A head count from the Hparams (a list there is sliding_window_pattern's, a string rope_scaling_type's)."""
    if isinstance(value, (list, str)):
        raise TypeError(f"a head count, not {value!r}")
    return int(value)


def _rope_q(weight: np.ndarray, h: Hparams) -> np.ndarray:
    return rope_layout(weight, _count(h["head_count"]))


def _rope_kv(weight: np.ndarray, h: Hparams) -> np.ndarray:
    return rope_layout(weight, _count(h["head_count_kv"]))


def _one_plus(weight: np.ndarray, h: Hparams) -> np.ndarray:
    """Gemma's RMSNorm scales by (1 + w) (computed in float32); llama.cpp multiplies by the stored weight."""
    return weight + np.float32(1.0)


ROUTER = "ffn_gate_inp.weight"  # a mixture of experts' router: kept in f32 by llama.cpp's converter and quantiser
LLAMA_ROPE = (("attn_q.weight", _rope_q), ("attn_k.weight", _rope_kv))

WRITERS = {  # HF model_type -> how llama.cpp's converter writes it
    "llama": Architecture("LLAMA", hparams, LLAMA_ROPE, LLAMA_ROPES),
    # mistral: written as a Llama, as llama.cpp's converter does; llama.cpp's llama graph has no sliding window, so a
    # Mistral whose window is shorter than the sequence attends further than in HF (explain names it)
    "mistral": Architecture("LLAMA", hparams, LLAMA_ROPE, LLAMA_ROPES),
    # qwen2: NEOX rope (no permutation), q/k/v biases (gguf's tensor map names them)
    "qwen2": Architecture("QWEN2", hparams),
    # gemma3: NEOX rope (llama.cpp rotates the two halves of a head, as HF does): no permutation
    "gemma3_text": Architecture("GEMMA3", gemma3_hparams, (("norm.weight", _one_plus),), frozenset({"default"})),
    # mixtral: written as a Llama with stacked experts (ffn_{gate,up,down}_exps) and a router (ffn_gate_inp), as
    # llama.cpp's converter does
    "mixtral": Architecture("LLAMA", moe_hparams, LLAMA_ROPE, LLAMA_ROPES),
    # qwen3_moe: NEOX rope (no permutation), per-head q/k norms, stacked experts of their own width
    "qwen3_moe": Architecture("QWEN3MOE", qwen3_moe_hparams),
}


def writer_for(config: dict) -> Architecture:
    """How to write the config's model type, refusing a rope whose scaling that architecture's graph would not
    apply (llama.cpp reads llama3's and LongRoPE's factor tensors in its llama graph only)."""
    model_type = config.get("model_type")
    if model_type not in WRITERS:
        raise RuntimeError(f"gguf: no GGUF writer for model type '{model_type}' (known: {', '.join(WRITERS)}): give "
                           "the engine a GGUF file (option gguf: PATH)")
    arch = WRITERS[model_type]
    kind = read_rope(config)["rope_type"]
    require(kind in arch.ropes or kind not in LLAMA_ROPES, config, f"{kind} rope scaling is not written for "
            f"llama.cpp's {arch.gguf_arch.lower()} graph (it applies {', '.join(sorted(arch.ropes))} only)")
    return arch


EXPERT = re.compile(r"(?P<block>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight")


def stacked_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors with a mixture of experts' weights as llama.cpp holds them: one [n_expert, rows, cols] stack per
    block and projection, named `<block>.experts.<proj>.weight` (the name gguf's map knows). Per-expert weights
    (`<block>.experts.<e>.<proj>.weight`, as checkpoints store them) are stacked in expert order; transformers 5's
    fused stack of gate and up (`<block>.experts.gate_up_proj` [n_expert, 2*ffn, hidden], gate first) is split in
    two. Every other tensor is left as it is."""
    out: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, weight in tensors.items():
        if match := EXPERT.fullmatch(name):
            experts.setdefault(f"{match['block']}.{match['proj']}.weight", {})[int(match["expert"])] = weight
        elif name.endswith(".experts.gate_up_proj"):
            block = name.removesuffix(".gate_up_proj")
            out[f"{block}.gate_proj.weight"], out[f"{block}.up_proj.weight"] = np.split(weight, 2, axis=1)
        elif name.endswith(".experts.down_proj"):
            out[f"{name}.weight"] = weight
        else:
            out[name] = weight
    for name, by_id in experts.items():
        if sorted(by_id) != list(range(len(by_id))):
            raise RuntimeError(f"gguf: the experts of {name} are numbered {sorted(by_id)}, not 0..{len(by_id) - 1}")
        out[name] = np.stack([by_id[i] for i in range(len(by_id))])
    return out


def stored(weight: np.ndarray, name: str, arch: Architecture, h: Hparams, variant: str) -> np.ndarray:
    """An HF tensor as the GGUF holds it: float32, transformed as the architecture says, in f16 for f16 except 1-D
    ones (norms) and routers (ffn_gate_inp), which llama.cpp's converter keeps in f32."""
    weight = weight.astype(np.float32)
    for suffix, transform in arch.transforms:
        if name.endswith(suffix):
            weight = transform(weight, h)
    half = variant == "f16" and weight.ndim > 1 and not name.endswith(ROUTER)
    return weight.astype(np.float16) if half else weight
