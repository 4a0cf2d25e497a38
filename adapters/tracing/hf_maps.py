"""HF transformers' architecture maps, by config model_type (types: adapters.tracing.arch_maps).

HF keeps the batch ([1, seq, width]); q and k are roped inside the attention forward with no module of their own,
so q_rope and k_rope are derived by the adapter (DerivedRope). The logits are computed by the adapter from the
final norm's rows with lm_head, a slice of positions at a time (with the family's final soft cap, where it has one),
so no map taps them.
"""

from __future__ import annotations

from dataclasses import replace

from adapters.tracing.arch_maps import ArchMap, DerivedRope, Routes, tap

LLAMA = ArchMap(
    "hf-llama", "model.layers",
    before=(tap("embeddings", "model.embed_tokens"),),
    per_layer=(
        tap("input_norm", "input_layernorm"),
        tap("q", "self_attn.q_proj"), tap("k", "self_attn.k_proj"), tap("v", "self_attn.v_proj"),
        tap("attn", "self_attn.o_proj", "input"), tap("o_proj", "self_attn.o_proj"),
        tap("post_norm", "post_attention_layernorm"),
        tap("gate", "mlp.gate_proj"), tap("up", "mlp.up_proj"), tap("mlp", "mlp"),
        tap("residual", ""),
    ),
    after=(tap("final_norm", "model.norm"),),
    rope=DerivedRope("q", "k"),
)

# Qwen 3: per-head q and k norms between the projections and rope, on [1, seq, heads, head_dim]
QWEN3 = replace(
    LLAMA, name="hf-qwen3",
    per_layer=(*LLAMA.per_layer[:4], tap("q_norm", "self_attn.q_norm"), tap("k_norm", "self_attn.k_norm"),
               *LLAMA.per_layer[4:]),
    rope=DerivedRope("q_norm", "k_norm"),
)

OPT = ArchMap(
    "hf-opt", "model.decoder.layers",
    before=(tap("embeddings", "model.decoder.layers.0", "input"),),  # token + learned position embeddings
    per_layer=(
        tap("input_norm", "self_attn_layer_norm"),
        tap("q", "self_attn.q_proj"), tap("k", "self_attn.k_proj"), tap("v", "self_attn.v_proj"),
        tap("attn", "self_attn.out_proj", "input"), tap("o_proj", "self_attn.out_proj"),
        tap("post_norm", "final_layer_norm"),
        tap("up", "fc1"), tap("mlp", "fc2"),
        tap("residual", ""),
    ),
    after=(tap("final_norm", "model.decoder.final_layer_norm"),),
)

# GPT-2: Conv1D projections, q/k/v fused in one (c_attn, split here as in vLLM), learned positions added before
# layer 0, LayerNorm, no rope
GPT2 = ArchMap(
    "hf-gpt2", "transformer.h",
    before=(tap("embeddings", "transformer.h.0", "input"),),
    per_layer=(
        tap("input_norm", "ln_1"),
        tap("q k v", "attn.c_attn", split=("q", "kv", "kv")),
        tap("attn", "attn.c_proj", "input"), tap("o_proj", "attn.c_proj"),
        tap("post_norm", "ln_2"),
        tap("up", "mlp.c_fc"), tap("mlp", "mlp"),
        tap("residual", ""),
    ),
    after=(tap("final_norm", "transformer.ln_f"),),
    fused=("q", "k", "v"),
)

# Gemma 2: sandwich norms around attention and MLP, attention soft-capping inside the kernel, a final-logit soft cap,
# embeddings scaled by sqrt(hidden) after embed_tokens (in vLLM too), so they are taken at layer 0's input (before a
# layer-forced pass replaces it: adapters.tracing.forcing)
GEMMA2 = ArchMap(
    "hf-gemma2", "model.layers",
    before=(tap("embeddings", "model.layers.0", "input"),),
    per_layer=(
        tap("input_norm", "input_layernorm"),
        tap("q", "self_attn.q_proj"), tap("k", "self_attn.k_proj"), tap("v", "self_attn.v_proj"),
        tap("attn", "self_attn.o_proj", "input"), tap("o_proj", "self_attn.o_proj"),
        tap("attn_post_norm", "post_attention_layernorm"),
        tap("post_norm", "pre_feedforward_layernorm"),
        tap("gate", "mlp.gate_proj"), tap("up", "mlp.up_proj"), tap("mlp", "mlp"),
        tap("ffn_post_norm", "post_feedforward_layernorm"),
        tap("residual", ""),
    ),
    after=(tap("final_norm", "model.norm"),),
    rope=DerivedRope("q", "k"),
    logits_softcap="final_logit_softcapping",
)

# Gemma 3 (text): Gemma 2's layout with per-head q and k norms ([1, heads, seq, head_dim]) before rope (local base
# on sliding layers, global on full ones); the embedding scale lives inside embed_tokens
GEMMA3 = replace(
    GEMMA2, name="hf-gemma3",
    per_layer=(*GEMMA2.per_layer[:4], tap("q_norm", "self_attn.q_norm", heads_first=True),
               tap("k_norm", "self_attn.k_norm", heads_first=True), *GEMMA2.per_layer[4:]),
    rope=DerivedRope("q_norm", "k_norm"),
)

# GLM-4: sandwich norms (post_self_attn_layernorm, post_mlp_layernorm), gate/up fused in HF's own checkpoint, partial
# rope (HF's apply_rotary_pos_emb of the glm4 module rotates part of each head, as the model does)
GLM4 = replace(
    LLAMA, name="hf-glm4",
    per_layer=(*LLAMA.per_layer[:6], tap("attn_post_norm", "post_self_attn_layernorm"),
               tap("post_norm", "post_attention_layernorm"), tap("gate up", "mlp.gate_up_proj", split=("ffn", "ffn")),
               tap("mlp", "mlp"), tap("ffn_post_norm", "post_mlp_layernorm"), tap("residual", "")),
    fused=("gate", "up"),
)

# Mixture of experts (transformers 5): the router module returns (router logits, the chosen experts' weights, their
# ids) with the batch flattened; the block returns [1, seq, hidden]
MIXTRAL = replace(
    LLAMA, name="hf-mixtral",
    per_layer=(*LLAMA.per_layer[:7], tap("router", "mlp.gate"), tap("moe", "mlp"), tap("residual", "")),
    routes=Routes("mlp.gate", weights=1, ids=2),
)
QWEN3_MOE = replace(MIXTRAL, name="hf-qwen3_moe", per_layer=QWEN3.per_layer[:9] + MIXTRAL.per_layer[7:],
                    rope=QWEN3.rope)
# a shared expert beside the routed ones, before its sigmoid gate (Qwen2-MoE) or ungated (GLM-4.5)
QWEN2_MOE = replace(MIXTRAL, name="hf-qwen2_moe", per_layer=(
    *MIXTRAL.per_layer[:8], tap("shared_expert", "mlp.shared_expert"), *MIXTRAL.per_layer[8:]))
# GLM-4.5 chooses by sigmoid scores plus a score-correction bias held by its router
GLM4_MOE = replace(MIXTRAL, name="hf-glm4_moe", per_layer=(
    *MIXTRAL.per_layer[:8], tap("shared_expert", "mlp.shared_experts"), *MIXTRAL.per_layer[8:]),
    routes=Routes("mlp.gate", weights=1, ids=2, scoring="sigmoid", bias="mlp.gate.e_score_correction_bias"))

# Gemma 3's multimodal model (model_type gemma3) nests the same text layers under other paths and configs: no map
MAPS = {"llama": LLAMA, "qwen2": LLAMA, "mistral": LLAMA, "qwen3": QWEN3, "opt": OPT, "gpt2": GPT2,
        "gemma2": GEMMA2, "gemma3_text": GEMMA3, "glm4": GLM4, "mixtral": MIXTRAL, "qwen3_moe": QWEN3_MOE,
        "qwen2_moe": QWEN2_MOE, "glm4_moe": GLM4_MOE}

# The stand-in for a model type without a map: no per-layer taps, the logits delivered by the adapter from the
# model's own output (soft-capping and all)
LOGITS_ONLY = ArchMap("hf-logits-only", "", before=(), per_layer=(), after=())
