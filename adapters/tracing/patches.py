"""Model patches shipped for A/B experiments (engine option `patch: adapters.tracing.patches:NAME`). Each takes the
loaded model of the engine it is named for and changes one computation while keeping every capture point in place."""

from __future__ import annotations

from typing import Any


def hf_eager_attention(model: Any) -> None:
    """HF: attention as plain eager math (matmul, softmax in float32, matmul) instead of SDPA's fused kernel."""
    model.set_attn_implementation("eager")


def hf_fused_qkv(model: Any) -> None:
    """HF: q, k and v come out of one fused matmul over the concatenated weights, as vLLM computes them, and are
    sliced from it (the fused product is recomputed for each of the three, to keep q_proj/k_proj/v_proj hookable)."""
    import torch

    for layer in model.model.layers:
        attn = layer.self_attn
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        weight = torch.cat([p.weight for p in projections]).detach()
        bias = torch.cat([p.bias for p in projections]).detach() if projections[0].bias is not None else None
        start = 0
        for proj in projections:
            width = proj.out_features
            proj.forward = _sliced(weight, bias, start, start + width)
            start += width


def _sliced(weight: Any, bias: Any, start: int, end: int):
    import torch.nn.functional as F

    return lambda x: F.linear(x, weight, bias)[..., start:end]
