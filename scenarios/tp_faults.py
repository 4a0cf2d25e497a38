"""A fault in one tensor-parallel rank's shard, for scenarios/tensor-parallel.yaml: planted by a model patch that every
rank's worker runs on its own shard of the model (an engine option: `patch: "tp_faults:<name>"`), acting in one rank
only, so `parity explain` must name the layer, the component and the rank (its heads) by itself."""

from __future__ import annotations

from typing import Any

from bf16_faults import changed

LAYER, RANK = 1, 1


def query_heads_rank1_layer1(model: Any) -> None:
    """Rank 1's query heads of layer 1 (its shard of the fused q/k/v projection's q columns): each row changed by 2%
    relative L2; rank 0's shard, and every other point, untouched."""
    from vllm.distributed import get_tensor_model_parallel_rank

    if get_tensor_model_parallel_rank() != RANK:
        return
    projection = model.model.layers[LAYER].self_attn.qkv_proj
    query = slice(0, model.model.layers[LAYER].self_attn.q_size)  # this rank's query heads come first

    def hook(_module: Any, _args: Any, output: tuple) -> tuple:
        rows, bias = output
        return changed(rows, query), bias

    projection.register_forward_hook(hook)
