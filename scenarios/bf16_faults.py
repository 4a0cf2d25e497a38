"""Faults of a given size for the bfloat16 planted-fault scenarios (bf16-planted-fault.yaml, gemma3-bf16.yaml,
moe-bf16.yaml), each planted in one component of one layer by a model patch (an engine option: `patch:
"bf16_faults:<name>"`), on the HF side or the vLLM side.

A fault is defined by what it does to its component's output: a change of exactly FAULT relative L2 in every row
(position) it touches, confined to some channels where it says so (the other channels, and every other point of the
model, untouched). So "a 2% fault" means the same thing whatever the component and the dtype, and Gemma 3's sandwich
norms, which would cancel a uniform scale of a sublayer's output, cannot cancel one confined to half the channels.
The expert fault is the exception: an expert's down projection is scaled (EXPERT_SCALE), which changes the block's
output only at the positions routed to that expert, by 2% in float32 there (tests/engines/test_bf16_explain.py
measures it).
"""

from __future__ import annotations

from typing import Any

EVERY = slice(None)  # every channel
FAULT = 0.02  # relative L2 change of a faulty component's output, per row it touches
EXPERT_SCALE = 1.022  # expert 0's down projection in tiny-qwen3_moe's layer 1: 2% at the block's output in float32


def changed(output: Any, channels: slice = EVERY, fraction: float = FAULT) -> Any:
    """The output with each row (the last axis) changed by exactly `fraction` of its L2 norm, in the given channels
    only: those channels scaled by 1 + fraction * |row| / |row's channels|."""
    import torch

    part = output[..., channels].float()
    whole = output.float().norm(dim=-1, keepdim=True)
    scale = 1.0 + fraction * whole / part.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    out = output.clone()
    out[..., channels] = (part * scale).to(output.dtype)
    return out


def _on_output(module: Any, channels: slice = EVERY) -> None:
    module.register_forward_hook(lambda _m, _args, out: changed(out, channels))


# SmolLM2 (HF and vLLM name these modules alike)
def mlp_layer15(model: Any) -> None:
    """Layer 15's MLP output, every channel."""
    _on_output(model.model.layers[15].mlp)


def post_norm_layer21(model: Any) -> None:
    """Layer 21's post-attention norm (its output, every channel)."""
    _on_output(model.model.layers[21].post_attention_layernorm)


def v_head0_layer9(model: Any) -> None:
    """Layer 9's v projection, its first KV head only (HF: v_proj; SmolLM2's head_dim 64)."""
    _on_output(model.model.layers[9].self_attn.v_proj, slice(0, 64))


def vllm_mlp_layer8(model: Any) -> None:
    """vLLM's layer 8 MLP output, every channel (vLLM's mlp returns [tokens, hidden])."""
    _on_output(model.model.layers[8].mlp)


# Gemma 3: the MLP output's first half of channels (its post-feed-forward norm would cancel a uniform scale)
def mlp_half_channels_layer9(model: Any) -> None:
    """Layer 9's MLP output, its first 320 of 640 channels."""
    _on_output(model.model.layers[9].mlp, slice(0, 320))


# tiny-qwen3_moe: one expert, and the router
def expert0_layer1(model: Any) -> None:
    """Layer 1's expert 0: its down projection scaled by EXPERT_SCALE (HF's experts stack their weights)."""
    model.model.layers[1].mlp.experts.down_proj.data[0] *= EXPERT_SCALE


def router_layer1(model: Any) -> None:
    """Layer 1's router logits changed by 2%, the experts chosen and weighted from the changed logits as the family
    does (softmax, top 2, renormalised)."""
    def hook(_module: Any, _args: Any, out: Any) -> Any:
        logits, weights, ids = out
        logits = changed(logits)
        scores = logits.float().softmax(-1)
        top, chosen = scores.topk(ids.shape[1], dim=-1)
        return logits, (top / top.sum(-1, keepdim=True)).to(weights.dtype), chosen

    model.model.layers[1].mlp.gate.register_forward_hook(hook)
