"""vLLM's LoRA at serving time, offline and server: the engine is started with LoRA enabled for one adapter of at most
the configured rank, and every request names the adapter (offline a LoRARequest, a server's request its served
name). vLLM wraps each adapted module in a LoRA layer at the module's own path (qkv_proj becomes
MergedQKVParallelLinearWithLoRA), so the architecture maps read the adapted outputs unchanged."""

from __future__ import annotations

from typing import Any

from adapters.contract import LoraRules
from harness.core.types import LoraSetup

# vllm.config.lora.MaxLoRARanks, the projections its packed LoRA layers wrap in a decoder, and its PEFTHelper, which
# refuses an adapter with lora_bias ("vLLM does not support LoRA bias")
RULES = LoraRules(source="vLLM 0.32's max_lora_rank choices, its decoder LoRA layers and no LoRA bias",
                  ranks=(1, 8, 16, 32, 64, 128, 256, 320, 512),
                  modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), bias=False)
LORA_ID = 1  # vLLM's integer id of the (only) adapter


def lora_kwargs(lora: LoraSetup | None) -> dict[str, Any]:
    """LLM()'s LoRA arguments: enabled, sized for this adapter."""
    return {} if lora is None else {"enable_lora": True, "max_lora_rank": lora.max_rank, "max_loras": 1}


def lora_request(lora: LoraSetup | None) -> Any:
    """The LoRARequest every offline request carries (None: none)."""
    if lora is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora.name, LORA_ID, lora.path)


def server_args(lora: LoraSetup | None) -> list[str]:
    """`vllm serve` arguments registering the adapter under its served name."""
    if lora is None:
        return []
    return ["--enable-lora", "--max-lora-rank", str(lora.max_rank), "--max-loras", "1",
            "--lora-modules", f"{lora.name}={lora.path}"]
