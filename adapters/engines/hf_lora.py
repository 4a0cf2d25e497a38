"""HF's LoRA at serving time: PEFT injects its LoRA layers into the model in place (each adapted module becomes a
wrapper at the same path whose output is base(x) + scale * B(A(x))), so the architecture maps and the planted-fault
patches see the adapted model under the module names they know."""

from __future__ import annotations

from typing import Any

from adapters.contract import LoraRules
from harness.core.types import LoraSetup

RULES = LoraRules(source="PEFT 0.21: any rank, any linear or embedding module, lora_B's bias", package="peft",
                  bias=True)


def with_adapter(model: Any, lora: LoraSetup | None, dtype: str) -> Any:
    """The model with the adapter applied (the model itself, its modules wrapped), or the model as it was."""
    if lora is None:
        return model
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise RuntimeError("hf applies LoRA adapters with PEFT, which is not installed: pip install "
                           "'llm-parity[lora]'") from exc
    adapted = PeftModel.from_pretrained(model, lora.path).base_model.model  # PEFT's own name ("default"): a served
    # name may hold dots, which a torch module key may not
    if dtype == "float64":  # PEFT keeps adapter weights in float32; the noise floor computes everything in float64
        adapted.to(model.dtype)
    return adapted.eval()
