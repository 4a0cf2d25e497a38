"""Canonical capture points of a decoder-only transformer, shared by the adapters (which capture them) and the trace
diff (which compares them). Names are engine-independent: a fused module is split into these parts by the adapter.

A trace file holds one [positions, width] tensor per point, named `embeddings`, `layers.<i>.<point>`,
`final_norm` and `logits`, in the order a forward pass computes them.
"""

from __future__ import annotations

# Per decoder layer, in computation order. q/k/v are after projection and before rope (q_norm/k_norm: per-head norms
# some families apply before rope); q_rope/k_rope after rope; attn is the attention output before o_proj; attn_post_norm
# a sandwich norm on o_proj's output before the residual add (Gemma's post_attention_layernorm); post_norm the norm
# before the MLP (Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm); ffn_post_norm a sandwich norm
# on the MLP's output; residual is the residual stream after the layer. A mixture-of-experts block has router (the
# router logits, one per expert), shared_expert (where the family has one) and moe (the block's output) instead of
# gate/up/mlp.
LAYER_POINTS = ("input_norm", "q", "k", "v", "q_norm", "k_norm", "q_rope", "k_rope", "attn", "o_proj", "attn_post_norm",
                "post_norm", "gate", "up", "router", "shared_expert", "mlp", "moe", "ffn_post_norm", "residual")

# Which part of the model a point's error implicates, in words a report can use.
COMPONENT = {
    "embeddings": "embeddings",
    "input_norm": "input norm",
    "q": "q/k/v projection", "k": "q/k/v projection", "v": "q/k/v projection",
    "q_norm": "q norm", "k_norm": "k norm",
    "q_rope": "rope", "k_rope": "rope",
    "attn": "attention kernel",
    "o_proj": "attention output projection (o_proj)",
    "attn_post_norm": "post-attention sandwich norm",
    "post_norm": "pre-MLP norm",
    "gate": "MLP (gate/up projection)", "up": "MLP (gate/up projection)",
    "mlp": "MLP (down projection / activation)",
    "router": "MoE router (router logits)", "shared_expert": "MoE shared expert",
    "moe": "MoE experts (the block's weighted sum of the chosen experts)",
    "ffn_post_norm": "post-MLP sandwich norm",
    "residual": "residual add",
    "final_norm": "final norm",
    "logits": "lm_head / logits",
}


def layer_point(layer: int, point: str) -> str:
    return f"layers.{layer}.{point}"


def parse(name: str) -> tuple[int, str]:
    """'layers.3.q' -> (3, 'q'); 'embeddings' -> (-1, 'embeddings'); 'final_norm'/'logits' -> (10**6, name)."""
    if name.startswith("layers."):
        _, layer, point = name.split(".", 2)
        return int(layer), point
    return (-1, name) if name == "embeddings" else (10**6, name)


def ordered(names: list[str]) -> list[str]:
    """Capture point names in forward-pass order (layer, then position of the point within the layer)."""
    rank = {p: i for i, p in enumerate(LAYER_POINTS)}

    def key(name: str) -> tuple[int, int]:
        layer, point = parse(name)
        return layer, rank.get(point, 0 if point != "logits" else 1)

    return sorted(names, key=key)


def in_words(point: str) -> str:
    """A point as a sentence names it: 'layer 7 v', or 'logits', 'embeddings'."""
    layer, name = parse(point)
    return name if layer < 0 or layer >= 10**6 else f"layer {layer} {name}"
