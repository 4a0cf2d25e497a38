"""Architecture maps: which module of an engine's model yields which canonical capture point.

One map per (engine family, model family). A fused module (vLLM's qkv_proj, gate_up_proj) is split into its
canonical parts by sizes taken from the model config; vLLM's decoder layer returns (hidden, residual), whose sum
is the residual stream HF returns. Module paths of per-layer taps are relative to the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Tap:
    points: tuple[str, ...]  # canonical point(s) this module yields, several when a fused output is split
    module: str  # module path (relative to the layer for per-layer taps; "" is the layer itself)
    take: str = "output"  # output (first element if a tuple) | input (first tensor argument) | inputs (the first
    # len(points) tensor arguments) | sum (of a 2-tuple output) | each (element of a tuple output)
    split: tuple[str, ...] = ()  # size names (see sizes()) splitting the last dimension into `points`
    heads_first: bool = False  # [batch, heads, seq, head_dim] (HF's per-head q/k norms), not [batch, seq, ...]


@dataclass(frozen=True)
class DerivedRope:
    """Where an engine applies rope inside its attention forward, with no module whose output is the roped q and k
    (HF): q_rope and k_rope are derived from these two points and the (cos, sin) the attention module receives as
    its `position_embeddings` argument, so each layer gets its own rope (Gemma's sliding and full layers differ)."""

    q: str  # canonical point rope is applied to (q, or q_norm where per-head norms come first)
    k: str
    attention: str = "self_attn"  # the attention module, relative to the layer


@dataclass(frozen=True)
class ArchMap:
    name: str
    layers: str  # path of the decoder layer list
    before: tuple[Tap, ...]
    per_layer: tuple[Tap, ...]
    after: tuple[Tap, ...]
    fused: tuple[str, ...] = ()  # canonical points this engine computes in a fused module, for the report
    rope: DerivedRope | None = None  # rope the adapter derives itself (None: captured, or the family has none)
    missing: str = ""  # a logits-only stand-in: why there is no per-layer map (the adapter delivers the logits)

    @property
    def logits_only(self) -> bool:
        return bool(self.missing)


def _t(points: str, module: str, take: str = "output", split: tuple[str, ...] = (), heads_first: bool = False) -> Tap:
    return Tap(tuple(points.split()), module, take, split, heads_first)


HF_LLAMA = ArchMap(
    "hf-llama", "model.layers",
    before=(_t("embeddings", "model.embed_tokens"),),
    per_layer=(
        _t("input_norm", "input_layernorm"),
        _t("q", "self_attn.q_proj"), _t("k", "self_attn.k_proj"), _t("v", "self_attn.v_proj"),
        # q_rope and k_rope: derived by the adapter (rope below)
        _t("attn", "self_attn.o_proj", "input"), _t("o_proj", "self_attn.o_proj"),
        _t("post_norm", "post_attention_layernorm"),
        _t("gate", "mlp.gate_proj"), _t("up", "mlp.up_proj"), _t("mlp", "mlp"),
        _t("residual", ""),
    ),
    after=(_t("final_norm", "model.norm"), _t("logits", "lm_head")),
    rope=DerivedRope("q", "k"),
)

HF_OPT = ArchMap(
    "hf-opt", "model.decoder.layers",
    before=(_t("embeddings", "model.decoder.layers.0", "input"),),  # token + learned position embeddings
    per_layer=(
        _t("input_norm", "self_attn_layer_norm"),
        _t("q", "self_attn.q_proj"), _t("k", "self_attn.k_proj"), _t("v", "self_attn.v_proj"),
        _t("attn", "self_attn.out_proj", "input"), _t("o_proj", "self_attn.out_proj"),
        _t("post_norm", "final_layer_norm"),
        _t("up", "fc1"), _t("mlp", "fc2"),
        _t("residual", ""),
    ),
    after=(_t("final_norm", "model.decoder.final_layer_norm"), _t("logits", "lm_head")),
)

# Gemma 3 (text): q_norm and k_norm per head, then rope (local base on sliding layers, global on full ones); sandwich
# norms around attention and MLP; embeddings scaled by sqrt(hidden), inside embed_tokens in HF but after it in vLLM,
# so both engines' embeddings are taken where they agree: the input of layer 0's input norm.
HF_GEMMA3 = ArchMap(
    "hf-gemma3", "model.layers",
    before=(_t("embeddings", "model.layers.0.input_layernorm", "input"),),
    per_layer=(
        _t("input_norm", "input_layernorm"),
        _t("q", "self_attn.q_proj"), _t("k", "self_attn.k_proj"), _t("v", "self_attn.v_proj"),
        _t("q_norm", "self_attn.q_norm", heads_first=True), _t("k_norm", "self_attn.k_norm", heads_first=True),
        _t("attn", "self_attn.o_proj", "input"), _t("o_proj", "self_attn.o_proj"),
        _t("attn_post_norm", "post_attention_layernorm"),
        _t("post_norm", "pre_feedforward_layernorm"),
        _t("gate", "mlp.gate_proj"), _t("up", "mlp.up_proj"), _t("mlp", "mlp"),
        _t("ffn_post_norm", "post_feedforward_layernorm"),
        _t("residual", ""),
    ),
    after=(_t("final_norm", "model.norm"), _t("logits", "lm_head")),
    rope=DerivedRope("q_norm", "k_norm"),
)

# vLLM (0.32, CPU, eager): every tensor is [tokens, width]; linear layers return (output, bias); norms called with a
# residual return (normed, residual); q and k are roped in place, so they are captured at qkv_proj's output
# (before rope) and at attn's input (after rope).
VLLM_LLAMA = ArchMap(
    "vllm-llama", "model.layers",
    before=(_t("embeddings", "model.embed_tokens"),),
    per_layer=(
        _t("input_norm", "input_layernorm"),
        _t("q k v", "self_attn.qkv_proj", split=("q", "kv", "kv")),
        _t("q_rope k_rope", "self_attn.attn", "inputs"),  # rotary_emb is one module shared by all layers
        _t("attn", "self_attn.o_proj", "input"), _t("o_proj", "self_attn.o_proj"),
        _t("post_norm", "post_attention_layernorm"),
        _t("gate up", "mlp.gate_up_proj", split=("ffn", "ffn")), _t("mlp", "mlp"),
        _t("residual", "", "sum"),
    ),
    # logits: computed by the adapter from the final norm's rows with the model's own compute_logits (vLLM's sampler
    # computes only the last position's, and prompt_logprobs would hold every position's logits at once, twice)
    after=(_t("final_norm", "model.norm"), _t("logits", "logits_processor")),
    fused=("q", "k", "v", "gate", "up"),
)

VLLM_OPT = ArchMap(
    "vllm-opt", "model.decoder.layers",
    before=(_t("embeddings", "model.decoder.layers.0", "input"),),
    per_layer=(
        _t("input_norm", "self_attn_layer_norm"),
        _t("q k v", "self_attn.qkv_proj", split=("q", "kv", "kv")),
        _t("attn", "self_attn.out_proj", "input"), _t("o_proj", "self_attn.out_proj"),
        _t("post_norm", "final_layer_norm"),
        _t("up", "fc1"), _t("mlp", "fc2"),
        _t("residual", ""),
    ),
    after=(_t("final_norm", "model.decoder.final_layer_norm"),
           _t("logits", "logits_processor")),
    fused=("q", "k", "v"),
)

# q_norm and k_norm take [tokens, heads, head_dim]; with a residual, the pre-MLP norm returns (normed, residual) and
# adds the attention branch into the residual, which the layer returns beside the post-MLP norm's output.
VLLM_GEMMA3 = ArchMap(
    "vllm-gemma3", "model.layers",
    before=(_t("embeddings", "model.layers.0.input_layernorm", "input"),),
    per_layer=(
        _t("input_norm", "input_layernorm"),
        _t("q k v", "self_attn.qkv_proj", split=("q", "kv", "kv")),
        _t("q_norm", "self_attn.q_norm"), _t("k_norm", "self_attn.k_norm"),
        _t("q_rope k_rope", "self_attn.attn", "inputs"),
        _t("attn", "self_attn.o_proj", "input"), _t("o_proj", "self_attn.o_proj"),
        _t("attn_post_norm", "post_attention_layernorm"),
        _t("post_norm", "pre_feedforward_layernorm"),
        _t("gate up", "mlp.gate_up_proj", split=("ffn", "ffn")), _t("mlp", "mlp"),
        _t("ffn_post_norm", "post_feedforward_layernorm"),
        _t("residual", "", "sum"),
    ),
    after=(_t("final_norm", "model.norm"), _t("logits", "logits_processor")),
    fused=("q", "k", "v", "gate", "up"),
)

LLAMA_FAMILY = ("llama", "qwen2", "mistral")


def by_model_type(llama: ArchMap, opt: ArchMap, gemma3: ArchMap) -> dict[str, ArchMap]:
    """An engine's maps keyed by HF config model_type (the Llama family shares one layout). Gemma 3's multimodal
    model (model_type gemma3) nests the same text layers under other paths and configs: it has no map."""
    return {**{m: llama for m in LLAMA_FAMILY}, "opt": opt, "gemma3_text": gemma3}


HF_MAPS = by_model_type(HF_LLAMA, HF_OPT, HF_GEMMA3)
VLLM_MAPS = by_model_type(VLLM_LLAMA, VLLM_OPT, VLLM_GEMMA3)


# An engine's stand-in for a model type without a map: no per-layer taps, the logits delivered by the adapter from
# the model's own output (soft-capping and all). vLLM's also takes what its model returns (the hidden states the
# logits are computed from, after the final norm) to compute the logits of every position from.
HF_LOGITS_ONLY = ArchMap("hf-logits-only", "", before=(), per_layer=(), after=())
VLLM_LOGITS_ONLY = ArchMap("vllm-logits-only", "", before=(), per_layer=(),
                           after=(_t("final_norm", ""), _t("logits", "logits_processor")))


def arch_map(maps: dict[str, ArchMap], model_type: str, engine: str, logits_only: ArchMap) -> ArchMap:
    """The engine's map for a model type, or its logits-only stand-in saying which map is missing."""
    if model_type in maps:
        return maps[model_type]
    missing = (f"no {engine} architecture map for model type '{model_type}' (known: {', '.join(sorted(maps))})")
    return replace(logits_only, missing=missing)


def sizes(config: Any) -> dict[str, int]:
    """Widths used to split fused outputs, from an HF-style config: q, kv (per projection) and ffn."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    ffn = getattr(config, "intermediate_size", None) or config.ffn_dim
    return {"q": heads * head_dim, "kv": kv_heads * head_dim, "ffn": ffn, "head_dim": head_dim}
