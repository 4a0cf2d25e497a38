"""The LoRA update an engine holds, as it holds it: per decoder layer and adapted module, the Frobenius norm of
scale * B A read from the engine's own loaded tensors (PEFT's lora_A, lora_B and scaling; vLLM's stacked slots, whose
B carries the scale already, packed modules split into their parts). A trace's metadata carries them, so explain can
tell an adapter applied with another scale, a module left unadapted or another layer's weights from a numeric drift
(harness.explain.adapter_reading)."""

from __future__ import annotations

import json
import re
from typing import Any

PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}  # vLLM's fused
LAYER = re.compile(r"\.layers\.(\d+)\.")


def update_norms(model: Any) -> dict[str, float]:
    """'<layer>.<module>' (0.q_proj) -> ||scale * B A|| of every adapted module of the model's decoder layers."""
    norms: dict[str, float] = {}
    for name, module in model.named_modules():
        found = LAYER.search(f".{name}.")
        if found is None:
            continue
        short = name.rsplit(".", 1)[-1]
        if hasattr(module, "lora_a_stacked"):  # vLLM: slot 0 holds the one adapter
            for part, a, b in zip(PACKED.get(short, (short,)), module.lora_a_stacked, module.lora_b_stacked,
                                  strict=False):
                norms[f"{found[1]}.{part}"] = float((b[0, 0].double() @ a[0, 0].double()).norm())
        elif hasattr(module, "lora_A") and hasattr(module, "scaling"):  # PEFT
            for adapter, a in module.lora_A.items():
                update = module.lora_B[adapter].weight.double() @ a.weight.double()
                norms[f"{found[1]}.{short}"] = float(module.scaling[adapter] * update.norm())
    return norms


def adapter_metadata(model: Any, rank: int) -> dict[str, str]:
    """A trace's metadata entries for the adapter the engine applied."""
    return {"lora_norms": json.dumps(update_norms(model), sort_keys=True), "lora_rank": str(rank)}
