"""Tiny random models of the decoder families users run, as data: each one a 2-layer model of its family at the
smallest sizes every engine accepts (vLLM's CPU attention: head_dim 32 or more), seeded so every machine builds the
same weights, with SmolLM2's tokenizer. What makes a family different from Llama stays switched on (q/k/v biases,
q and k norms, fused projections in the checkpoint, soft-capping, sliding windows shorter than the test prompts,
learned positions), and every bias and norm weight is drawn away from its neutral init, so a map that reads the
wrong module, or an engine that drops a bias, shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Shared by every family: 2 layers, hidden 64, 2 query heads and 1 KV head of width 32, a 1,024-token context
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": 1024}
WINDOW = 16  # sliding windows shorter than the tests' prompt + generated tokens, so windowed attention acts


@dataclass(frozen=True)
class TinyFamily:
    model_type: str  # config.json's model_type
    config_class: str  # the transformers config class
    model_class: str  # the transformers causal-LM class
    what: str  # what the family adds to Llama, for the models list
    config: dict[str, Any] = field(default_factory=dict)  # on top of SHAPE (or instead of it: own_shape)
    own_shape: bool = False  # the family names its sizes its own way (GPT-2)


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
}


def build(family: TinyFamily, tokenizer: Any) -> Any:
    """The family's tiny model in float32, its weights drawn from a fixed seed."""
    import torch
    import transformers
    from transformers import GenerationConfig

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    shape = {} if family.own_shape else SHAPE
    config = getattr(transformers, family.config_class)(
        vocab_size=len(tokenizer), tie_word_embeddings=True, initializer_range=0.5, **shape, **family.config, **ids)
    torch.manual_seed(0)  # deterministic weights: the same tiny model on every machine
    model = getattr(transformers, family.model_class)(config).to(torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # biases and norm weights: away from 0 and 1, so each one matters
                param.add_(torch.randn_like(param) * 0.1)
    model.generation_config = GenerationConfig(**ids)
    return model
