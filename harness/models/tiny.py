"""Tiny random models of the decoder families users run, as data: each one a 2-layer model of its family at the
smallest sizes every engine accepts (vLLM's CPU attention: head_dim 32 or more), seeded so every machine builds the
same weights, with SmolLM2's tokenizer. What makes a family different from Llama stays switched on (q/k/v biases,
q and k norms, fused projections in the checkpoint, soft-capping, sliding windows shorter than the test prompts,
learned positions), and every bias and norm weight is drawn away from its neutral init, so a map that reads the
wrong module, or an engine that drops a bias, shows.

The mixture-of-experts families (4 experts, 2 chosen per token) draw their routers so that routing ties are
exercised: in every router, experts 0 and 1 score a and -a (one of them wins clearly at every position) and experts 2
and 3 score b and b + 0.01 x noise (a near tie at every position). Where b lands between the two scores of a, experts
2 and 3 straddle the top-2 boundary, a near tie between the last chosen and the first unchosen expert; where it lands
above or below both, the boundary lies between the pair and one of a's experts, far apart. Which happens varies by
position (tests/unit/test_tiny_models.py checks both occur on a test prompt). A score-correction bias (glm4_moe) is
drawn too, large enough to change which experts win at some positions (an engine that ignores it chooses otherwise
there), and the same for experts 2 and 3, so it keeps their tie.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Shared by every family: 2 layers, hidden 64, 2 query heads and 1 KV head of width 32, a 1,024-token context
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": 1024}
WINDOW = 16  # sliding windows shorter than the tests' prompt + generated tokens, so windowed attention acts
ORIGINAL = 32  # the context scaled rope was "trained" for: a test's prompt and answer cross it
THETA = 10000.0


def _rope(kind: str, **extra: Any) -> dict[str, Any]:
    """A Llama with scaled rope of this kind, in the config key transformers 5 writes (rope_parameters)."""
    return {"head_dim": 32, "rope_parameters": {"rope_type": kind, "rope_theta": THETA, **extra}}


# LongRoPE's per-frequency factors (head_dim 32: 16 of them), long ones growing with the wavelength
SHORT_FACTORS = [1.0 + 0.05 * i for i in range(16)]
LONG_FACTORS = [1.0 + 0.5 * i for i in range(16)]


@dataclass(frozen=True)
class TinyFamily:
    model_type: str  # config.json's model_type
    config_class: str  # the transformers config class
    model_class: str  # the transformers causal-LM class
    what: str  # what the family adds to Llama, for the models list
    config: dict[str, Any] = field(default_factory=dict)  # on top of SHAPE (or instead of it: own_shape)
    own_shape: bool = False  # the family names its sizes its own way (GPT-2)
    experts: int = 0  # routed experts per mixture-of-experts block (0: a dense family); 2 chosen per token

    @property
    def scaled_rope(self) -> str:
        """The rope scaling a Llama variant ships ('' for a family of its own)."""
        return str(self.config.get("rope_parameters", {}).get("rope_type", ""))


FAMILIES: dict[str, TinyFamily] = {
    "qwen2": TinyFamily("qwen2", "Qwen2Config", "Qwen2ForCausalLM", "q/k/v biases"),
    "qwen3": TinyFamily("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "per-head q and k norms before rope",
                        {"head_dim": 32}),
    "mistral": TinyFamily("mistral", "MistralConfig", "MistralForCausalLM",
                          f"a {WINDOW}-token sliding window on every layer",
                          {"head_dim": 32, "sliding_window": WINDOW}),
    "phi3": TinyFamily("phi3", "Phi3Config", "Phi3ForCausalLM",
                       "q/k/v and gate/up fused in the checkpoint (qkv_proj, gate_up_proj)",
                       {"original_max_position_embeddings": 1024}),
    "gemma2": TinyFamily("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
                         f"attention and final-logit soft-capping, sandwich norms, a {WINDOW}-token window on "
                         "alternate layers, scaled embeddings",
                         {"head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": WINDOW,
                          "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
    "gpt2": TinyFamily("gpt2", "GPT2Config", "GPT2LMHeadModel", "Conv1D projections, learned positions, LayerNorm",
                       {"n_embd": 64, "n_inner": 128, "n_layer": 2, "n_head": 2, "n_positions": 1024},
                       own_shape=True),
    "glm4": TinyFamily("glm4", "Glm4Config", "Glm4ForCausalLM",
                       "ChatGLM's successor: partial rope, sandwich norms, fused gate/up, q/k/v biases",
                       {"head_dim": 32, "attention_bias": True}),
    # scaled rope (a Llama each): the rope kinds users ship, with an original context of ORIGINAL tokens
    "llama-rope-linear": TinyFamily("llama", "LlamaConfig", "LlamaForCausalLM", "rope positions divided by 4 (linear)",
                                    _rope("linear", factor=4.0)),
    "llama-rope-llama3": TinyFamily(
        "llama", "LlamaConfig", "LlamaForCausalLM",
        f"Llama 3 rope scaling: low frequencies / 8, a smooth band, high ones kept (original {ORIGINAL} tokens)",
        _rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=ORIGINAL)),
    "llama-rope-yarn": TinyFamily("llama", "LlamaConfig", "LlamaForCausalLM",
                                  f"YaRN rope scaling by 4 with its attention factor (original {ORIGINAL} tokens)",
                                  _rope("yarn", factor=4.0, original_max_position_embeddings=ORIGINAL)),
    "llama-rope-longrope": TinyFamily(
        "llama", "LlamaConfig", "LlamaForCausalLM",
        f"LongRoPE: per-frequency short factors up to {ORIGINAL} tokens, long ones past them",
        _rope("longrope", factor=32.0, short_factor=SHORT_FACTORS, long_factor=LONG_FACTORS,
              original_max_position_embeddings=ORIGINAL)),
    # mixture of experts: 4 experts of width 64, 2 chosen per token
    "mixtral": TinyFamily("mixtral", "MixtralConfig", "MixtralForCausalLM",
                          "mixture of experts: softmax over 4 experts, top 2, renormalised",
                          {"head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2}, experts=4),
    "qwen3_moe": TinyFamily("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                            "mixture of experts: softmax top 2 of 4, renormalised (norm_topk_prob), q/k norms",
                            {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}, experts=4),
    "qwen2_moe": TinyFamily("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                            "mixture of experts: softmax top 2 of 4, not renormalised, a shared expert behind a "
                            "sigmoid gate",
                            {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                             "shared_expert_intermediate_size": 64, "norm_topk_prob": False,
                             "decoder_sparse_step": 1, "mlp_only_layers": []}, experts=4),
    # vLLM never ties GLM-4.5's lm_head to its embeddings (vllm#22460): a tied checkpoint loads with an unloaded head
    # there, so this one is untied. DeepSeek V3 (sigmoid scoring too) does not run on vLLM 0.32's CPU build: its only
    # MLA backend takes heads of 576 (kv_lora_rank 512 + rope 64) in bfloat16
    "glm4_moe": TinyFamily("glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM",
                           "mixture of experts: sigmoid scores with a score-correction bias (drawn: it changes "
                           "the chosen experts at some positions), top 2 of 4, renormalised, a shared expert",
                           {"head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
                            "moe_intermediate_size": 64, "n_shared_experts": 1, "first_k_dense_replace": 0,
                            "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
                            "tie_word_embeddings": False}, experts=4),
}


def build(family: TinyFamily, tokenizer: Any) -> Any:
    """The family's tiny model in float32, its weights drawn from a fixed seed."""
    import torch
    import transformers
    from transformers import GenerationConfig

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    shape = {} if family.own_shape else SHAPE
    config = getattr(transformers, family.config_class)(**{
        "vocab_size": len(tokenizer), "tie_word_embeddings": True, "initializer_range": 0.5, **shape, **family.config,
        **ids})
    torch.manual_seed(0)  # deterministic weights: the same tiny model on every machine
    model = getattr(transformers, family.model_class)(config).to(torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # biases and norm weights: away from 0 and 1, so each one matters
                param.add_(torch.randn_like(param) * 0.1)
        if family.experts:
            _draw_routers(model, family.experts)
    model.generation_config = GenerationConfig(**ids)
    return model


BIAS_SCALE = 0.3  # the score-correction bias's spread, on sigmoid scores in [0, 1]


def routers(model: Any, experts: int) -> list[Any]:
    """The model's router modules (a [experts, hidden] weight), one per mixture-of-experts block, in layer order."""
    return [m for name, m in model.named_modules()
            if name.endswith("mlp.gate") and getattr(m, "weight", None) is not None and m.weight.shape[0] == experts]


def _draw_routers(model: Any, experts: int) -> None:
    """Each router's rows as the module docstring says: a, -a, b, b + 0.01 x noise (further experts, if any, random)."""
    import torch

    for router in routers(model, experts):
        weight = router.weight
        a, b = torch.randn(weight.shape[1]), torch.randn(weight.shape[1])
        weight[0], weight[1], weight[2] = a, -a, b
        weight[3] = b + 0.01 * torch.randn(weight.shape[1])
        bias = getattr(router, "e_score_correction_bias", None)
        if bias is not None:  # a buffer, not a parameter: drawn here (0.3 moves 3-9 of 18 positions' choices)
            bias.copy_(torch.randn(bias.shape[0]) * BIAS_SCALE)
            bias[3] = bias[2]
