"""Model patches for scenarios/gemma3-planted-fault.yaml: each plants one small fault in one layer of HF's Gemma 3,
to show (and test) that `parity explain` names the layer and the component by itself, including a fault that only
acts on positions past the sliding window."""

from __future__ import annotations

from typing import Any


def scale_k_norm_layer4(model: Any) -> None:
    """Scale layer 4's k norm output by 1.01 (a 1% error in a per-head norm, before rope)."""
    model.model.layers[4].self_attn.k_norm.register_forward_hook(lambda module, args, out: out * 1.01)


def scale_ffn_post_norm_layer13(model: Any) -> None:
    """Scale layer 13's post-feed-forward (sandwich) norm output by 1.02."""
    model.model.layers[13].post_feedforward_layernorm.register_forward_hook(lambda module, args, out: out * 1.02)


def window_off_by_one_layer8(model: Any) -> None:
    """Layer 8, a sliding-window layer, attends one key further back than its window (513 keys instead of 512): in a
    full pass (prefill, teacher forcing) every position from the window's length on also sees the key exactly a window
    back, which the right mask hides; shorter sequences are untouched. Decoding steps keep the right mask."""
    attention = model.model.layers[8].self_attn
    if not attention.is_sliding:
        raise ValueError("window_off_by_one_layer8: layer 8 of this model is not a sliding-window layer")
    window = model.config.sliding_window
    attention.register_forward_pre_hook(lambda module, args, kwargs: _widen(window, args, kwargs), with_kwargs=True)


def _widen(window: int, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """The attention mask with the diagonal a window below the main one opened (a full pass has as many queries as
    keys, so that diagonal is each query's key exactly `window` positions back)."""
    mask = kwargs.get("attention_mask")
    if mask is None or mask.shape[-2] != mask.shape[-1]:
        return None  # no mask (the sequence fits the window) or a decoding step
    wider = mask.clone()
    attend = 0.0 if mask.dtype.is_floating_point else True  # an additive mask or a boolean one
    wider.diagonal(offset=-window, dim1=-2, dim2=-1).fill_(attend)
    return args, {**kwargs, "attention_mask": wider}
