"""Faults planted in HF copies of a model with a LoRA adapter applied through PEFT (scenarios/lora.yaml; engines with
`options: {patch: "lora_faults:<name>"}`, applied after the adapter). Each is how an engine has got an adapter wrong;
`parity explain` names each from the updates the engines hold (harness.explain.adapter_reading)."""

from __future__ import annotations

import math
from typing import Any


def _adapted(model: Any) -> list[Any]:
    """PEFT's LoRA layers of the model, in module order."""
    return [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "scaling") and m.lora_A]


def rslora(model: Any) -> None:
    """Every adapted module scaled by alpha / sqrt(r) (rsLoRA) where the adapter says alpha / r."""
    for module in _adapted(model):
        for name in module.scaling:
            module.scaling[name] = module.lora_alpha[name] / math.sqrt(module.r[name])


def unadapted_v(model: Any) -> None:
    """v_proj left unadapted in every layer, as an engine that skips a module it does not support."""
    for layer in model.model.layers:
        attention = layer.self_attn
        if hasattr(attention.v_proj, "base_layer"):
            attention.v_proj = attention.v_proj.base_layer


def shifted_layers(model: Any) -> None:
    """Each layer given the next layer's adapter weights (the last layer the first's): an adapter applied at the
    wrong layer index."""
    import torch

    layers = model.model.layers
    adapted = {id(m) for m in _adapted(model)}
    by_layer = [{name: m for name, m in layer.named_modules() if id(m) in adapted} for layer in layers]
    with torch.no_grad():
        weights = [{name: [(m.lora_A[a].weight.clone(), m.lora_B[a].weight.clone()) for a in m.lora_A]
                    for name, m in modules.items()} for modules in by_layer]
        for index, modules in enumerate(by_layer):
            source = weights[(index + 1) % len(layers)]
            for name, module in modules.items():
                for adapter, (a, b) in zip(module.lora_A, source[name], strict=True):
                    module.lora_A[adapter].weight.copy_(a)
                    module.lora_B[adapter].weight.copy_(b)
