"""Layer-forced passes: every decoder layer of an engine's model, and its final norm, starts from the reference's
rows of its input, read from the reference's trace (TraceRequest.inputs_from), instead of the engine's own.

In a teacher-forced pass each layer computes on what the layers before it produced, so in bfloat16 a layer's error
carries everything rounded upstream and a component's own fault drowns in it. Started from the reference's input,
each layer's capture points measure what that layer adds and nothing else; the noise floor's pass is forced the same
way, so the two are compared like with like (harness.compare.layer_floor).

A layer's input is the point the reference captured just before it: the embeddings for layer 0, the residual stream
after layer i-1 for layer i and for the final norm. Where the rows go is an architecture map's Feed: HF passes
`layer(hidden_states, ...)` a [1, seq, width] batch of one; vLLM `layer(positions, hidden_states, residual)` on
[tokens, width] rows, whose positions the runner gives the model's forward (a chunked prefill sees part of the
sequence per call). The hooks are registered once and idle outside a forced pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.tracing.arch_maps import ArchMap
from harness.core.points import layer_point
from harness.rundir.traces import Trace


def input_point(layer: int) -> str:
    """The reference's point that is decoder layer `layer`'s input (layer = the number of layers: the final norm's)."""
    return "embeddings" if layer == 0 else layer_point(layer - 1, "residual")


class LayerInputs:
    def __init__(self, model: Any, arch: ArchMap, num_layers: int):
        import torch

        self.torch, self.arch, self.num_layers = torch, arch, num_layers
        self.source: Trace | None = None
        self.positions: Any = None  # the rows' positions in the forward under way (vLLM: from the runner's call)
        self.handles: list[Any] = []
        modules = dict(model.named_modules())
        if arch.feed.positions:
            self.handles.append(model.register_forward_pre_hook(self._keep_positions, with_kwargs=True))
        for layer in range(num_layers):
            self.handles.append(modules[f"{arch.layers}.{layer}"].register_forward_pre_hook(
                lambda _m, args, layer=layer: self._feed(layer, args, arch.feed.hidden, arch.feed.residual)))
        norm = modules[arch.final_norm]
        self.handles.append(norm.register_forward_pre_hook(
            lambda _m, args: self._feed(num_layers, args, 0, arch.feed.norm_residual)))

    @staticmethod
    def possible(arch: ArchMap) -> str:
        """Why a map cannot force its layers ('' where it can)."""
        if arch.logits_only:
            return "no per-layer map"
        return "" if arch.final_norm else f"architecture map {arch.name} names no final norm"

    def begin(self, source: Path) -> None:
        """Feed the layers from this trace until end()."""
        self.source = Trace(source)
        missing = [p for p in (input_point(i) for i in range(self.num_layers + 1)) if p not in self.source.tensors]
        if missing:
            self.source = None
            raise RuntimeError(f"trace: the reference's trace {source.name} has no rows of {missing[0]}, a layer's "
                               "input, to force the layers from")

    def end(self) -> None:
        self.source, self.positions = None, None

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _keep_positions(self, _module: Any, _args: tuple, kwargs: dict[str, Any]) -> None:
        if self.source is not None:
            self.positions = kwargs.get(self.arch.feed.positions)

    def _feed(self, layer: int, args: tuple, hidden: int, residual: int | None) -> tuple | None:
        if self.source is None:
            return None
        original = args[hidden]
        rows = self._rows(input_point(layer), original).reshape(original.shape)
        replaced = list(args)
        replaced[hidden] = rows
        if residual is not None and len(args) > residual and args[residual] is not None:
            replaced[residual] = self.torch.zeros_like(rows)  # the fused add of rows and zeros gives back the rows
        return tuple(replaced)

    def _rows(self, point: str, original: Any) -> Any:
        """The reference's rows of a point for the positions of this forward, in the engine's dtype and device."""
        torch, source = self.torch, self.source
        if source is None:
            raise RuntimeError("trace: a layer fed outside a forced pass")
        if self.arch.feed.positions:
            if self.positions is None:
                raise RuntimeError(f"trace: no positions reached the model's forward ({self.arch.feed.positions})")
            positions = self.positions.to("cpu").long()
            first, last = int(positions.min()), int(positions.max())
            rows = torch.from_numpy(source.rows(point, first, last + 1))[positions - first]
        else:
            count = original.shape[-2] if original.dim() > 2 else original.shape[0]
            rows = torch.from_numpy(source.rows(point, 0, count))
        return rows.to(dtype=original.dtype, device=original.device)
