"""Phi-3's architecture maps, written by following docs/adding-an-architecture.md and registered from outside the
project through the `llm_parity.arch_maps` entry point.

HF's own Phi-3 checkpoint fuses q/k/v (self_attn.qkv_proj) and gate/up (mlp.gate_up_proj), so HF's map splits them
by the config's widths, as vLLM's maps do; HF ropes q and k inside the attention forward, so q_rope and k_rope are
derived. vLLM runs Phi-3 as a Llama (its Phi3ForCausalLM is LlamaForCausalLM), so its map is Llama's.
"""

from dataclasses import replace

from adapters.tracing import vllm_maps
from adapters.tracing.arch_maps import ArchMap, DerivedRope, FamilyMaps, tap

HF = ArchMap(
    "hf-phi3", "model.layers",
    before=(tap("embeddings", "model.embed_tokens"),),
    per_layer=(
        tap("input_norm", "input_layernorm"),
        tap("q k v", "self_attn.qkv_proj", split=("q", "kv", "kv")),
        tap("attn", "self_attn.o_proj", "input"), tap("o_proj", "self_attn.o_proj"),
        tap("post_norm", "post_attention_layernorm"),
        tap("gate up", "mlp.gate_up_proj", split=("ffn", "ffn")), tap("mlp", "mlp"),
        tap("residual", ""),
    ),
    after=(tap("final_norm", "model.norm"),),
    rope=DerivedRope("q", "k"),
    fused=("q", "k", "v", "gate", "up"),
)

VLLM = replace(vllm_maps.LLAMA, name="vllm-phi3")

PHI3 = FamilyMaps("phi3", {"hf": HF, "vllm": VLLM})
