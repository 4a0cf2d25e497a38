"""A fault for scenarios/logprob-kinds.yaml: planted in vLLM by a model patch, to show that reading two engines'
logprobs as different kinds (raw against processed) never hides a real difference."""

from __future__ import annotations

from typing import Any


def vllm_mlp_layer1(model: Any) -> None:
    """Layer 1's MLP output scaled by 1.5 in vLLM's model (tiny-llama has two layers): enough to move its tokens."""
    model.model.layers[1].mlp.register_forward_hook(lambda _module, _args, output: output * 1.5)
