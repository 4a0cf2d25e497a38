"""vLLM's architecture maps (0.32, CPU, eager), by config model_type (types: adapters.tracing.arch_maps).

Every tensor is [tokens, width]; linear layers return (output, bias); norms called with a residual return (normed,
residual), and a decoder layer returns (hidden, residual), summed into the residual stream; q and k are roped in
place, so they are captured at qkv_proj's output (before rope) and at attn's input (after rope). The logits:
computed by the adapter from the final norm's rows with the model's own compute_logits (soft cap included), whose
logits_processor is tapped (vLLM's sampler computes only the last position's, and prompt_logprobs would hold every
position's logits at once, twice).
"""

from __future__ import annotations

from dataclasses import replace

from adapters.tracing.arch_maps import ArchMap, Feed, Routes, tap

QKV = tap("q k v", "self_attn.qkv_proj", split=("q", "kv", "kv"))
ROPED = tap("q_rope k_rope", "self_attn.attn", "inputs")  # rotary_emb is one module shared by all layers
GATE_UP = tap("gate up", "mlp.gate_up_proj", split=("ffn", "ffn"))
LOGITS = tap("logits", "logits_processor")
# layer(positions, hidden_states, residual), norm(hidden_states, residual); positions from the runner's forward call
RESIDUAL_APART = Feed(hidden=1, residual=2, norm_residual=1, positions="positions")

LLAMA = ArchMap(
    "vllm-llama", "model.layers",
    before=(tap("embeddings", "model.embed_tokens"),),
    per_layer=(
        tap("input_norm", "input_layernorm"), QKV, ROPED,
        tap("attn", "self_attn.o_proj", "input"), tap("o_proj", "self_attn.o_proj"),
        tap("post_norm", "post_attention_layernorm"), GATE_UP, tap("mlp", "mlp"),
        tap("residual", "", "sum"),
    ),
    after=(tap("final_norm", "model.norm"), LOGITS),
    fused=("q", "k", "v", "gate", "up"),
    feed=RESIDUAL_APART,
)

# Qwen 3: q_norm and k_norm take [tokens, heads, head_dim], between qkv_proj and rope
QWEN3 = replace(LLAMA, name="vllm-qwen3", per_layer=(
    *LLAMA.per_layer[:2], tap("q_norm", "self_attn.q_norm"), tap("k_norm", "self_attn.k_norm"), *LLAMA.per_layer[2:]))

OPT = ArchMap(
    "vllm-opt", "model.decoder.layers",
    before=(tap("embeddings", "model.decoder.layers.0", "input"),),
    per_layer=(
        tap("input_norm", "self_attn_layer_norm"), QKV,
        tap("attn", "self_attn.out_proj", "input"), tap("o_proj", "self_attn.out_proj"),
        tap("post_norm", "final_layer_norm"),
        tap("up", "fc1"), tap("mlp", "fc2"),
        tap("residual", ""),
    ),
    after=(tap("final_norm", "model.decoder.final_layer_norm"), LOGITS),
    fused=("q", "k", "v"),
    feed=Feed(positions="positions"),  # layer(hidden_states): the residual is added inside
)

# GPT-2: the block adds its own residuals and returns one tensor; learned positions are added before layer 0
GPT2 = ArchMap(
    "vllm-gpt2", "transformer.h",
    before=(tap("embeddings", "transformer.h.0", "input"),),
    per_layer=(
        tap("input_norm", "ln_1"), tap("q k v", "attn.c_attn", split=("q", "kv", "kv")),
        tap("attn", "attn.c_proj", "input"), tap("o_proj", "attn.c_proj"),
        tap("post_norm", "ln_2"), tap("up", "mlp.c_fc"), tap("mlp", "mlp"),
        tap("residual", ""),
    ),
    after=(tap("final_norm", "transformer.ln_f"), LOGITS),
    fused=("q", "k", "v"),
    feed=Feed(positions="positions"),
)

# Gemma 2: with a residual, the pre-MLP norm returns (normed, residual) and adds the attention branch into the
# residual, which the layer returns beside the post-MLP norm's output; embeddings scaled after embed_tokens, so they
# are taken at layer 0's input (its hidden_states argument, as in HF)
GEMMA2 = ArchMap(
    "vllm-gemma2", "model.layers",
    before=(tap("embeddings", "model.layers.0", "input", arg=1),),
    per_layer=(
        tap("input_norm", "input_layernorm"), QKV, ROPED,
        tap("attn", "self_attn.o_proj", "input"), tap("o_proj", "self_attn.o_proj"),
        tap("attn_post_norm", "post_attention_layernorm"),
        tap("post_norm", "pre_feedforward_layernorm"), GATE_UP, tap("mlp", "mlp"),
        tap("ffn_post_norm", "post_feedforward_layernorm"),
        tap("residual", "", "sum"),
    ),
    after=(tap("final_norm", "model.norm"), LOGITS),
    fused=("q", "k", "v", "gate", "up"),
    feed=RESIDUAL_APART,
)

# Gemma 3 (text): Gemma 2's layout with q_norm and k_norm ([tokens, heads, head_dim]) before rope
GEMMA3 = replace(GEMMA2, name="vllm-gemma3", per_layer=(
    *GEMMA2.per_layer[:2], tap("q_norm", "self_attn.q_norm"), tap("k_norm", "self_attn.k_norm"),
    *GEMMA2.per_layer[2:]))

# GLM-4: Llama's modules plus sandwich norms after attention (post_self_attn_layernorm) and after the MLP
GLM4 = replace(LLAMA, name="vllm-glm4", per_layer=(
    *LLAMA.per_layer[:5], tap("attn_post_norm", "post_self_attn_layernorm"), *LLAMA.per_layer[5:8],
    tap("ffn_post_norm", "post_mlp_layernorm"), LLAMA.per_layer[8]))

# Mixture of experts: the router is a GateLinear (a linear layer: (output, bias)) inside the block, which returns the
# chosen experts' weighted sum; Mixtral's block is block_sparse_moe. The experts are chosen in a method call, the
# router's select_experts (returning weights, ids), not in a module
ROUTES = Routes("mlp.experts.router", method="select_experts", weights=0, ids=1)
MIXTRAL = replace(LLAMA, name="vllm-mixtral", per_layer=(
    *LLAMA.per_layer[:6], tap("router", "block_sparse_moe.gate"), tap("moe", "block_sparse_moe"), LLAMA.per_layer[8]),
    fused=("q", "k", "v"), routes=replace(ROUTES, module="block_sparse_moe.experts.router"))
QWEN3_MOE = replace(MIXTRAL, name="vllm-qwen3_moe", per_layer=(
    *QWEN3.per_layer[:8], tap("router", "mlp.gate"), tap("moe", "mlp"), LLAMA.per_layer[8]), routes=ROUTES)
# the shared expert: Qwen2-MoE's module applies its sigmoid gate itself, so its down projection is HF's ungated output
QWEN2_MOE = replace(MIXTRAL, name="vllm-qwen2_moe", per_layer=(
    *LLAMA.per_layer[:6], tap("router", "mlp.gate"), tap("shared_expert", "mlp.shared_expert.down_proj"),
    tap("moe", "mlp"), LLAMA.per_layer[8]), routes=ROUTES)
GLM4_MOE = replace(QWEN2_MOE, name="vllm-glm4_moe", per_layer=(
    *LLAMA.per_layer[:6], tap("router", "mlp.gate"), tap("shared_expert", "mlp.shared_experts"), tap("moe", "mlp"),
    LLAMA.per_layer[8]), routes=replace(ROUTES, scoring="sigmoid", bias="mlp.gate.e_score_correction_bias"))

MAPS = {"llama": LLAMA, "qwen2": LLAMA, "mistral": LLAMA, "qwen3": QWEN3, "opt": OPT, "gpt2": GPT2,
        "mixtral": MIXTRAL, "qwen3_moe": QWEN3_MOE, "qwen2_moe": QWEN2_MOE, "glm4_moe": GLM4_MOE,
        "gemma2": GEMMA2, "gemma3_text": GEMMA3, "glm4": GLM4}

# The stand-in for a model type without a map: what the model returns (the hidden states after the final norm) is
# the final norm the adapter computes every position's logits from with compute_logits
LOGITS_ONLY = ArchMap("vllm-logits-only", "", before=(), per_layer=(), after=(tap("final_norm", ""), LOGITS))
