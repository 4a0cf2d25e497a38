"""The chosen experts of a mixture-of-experts model, taken from where the engine's own routing code returns them
(an architecture map's Routes): per layer and position the expert ids, their weights, and the margin by which the
weakest chosen expert beat the strongest unchosen one in the engine's own selection scores.

A routing decision is discrete, so it is not a capture point: it goes to a table of its own beside the trace,
<case>.routes.safetensors (the trace layout, float64: per layer `layers.<i>.experts` and `layers.<i>.expert_weights`
[positions, k], `layers.<i>.router_margin` [positions, 1]), compared by set equality and weight difference
(harness.compare.routing). HF's router module returns (logits, weights, ids); vLLM routes in a method call
(FusedMoERouter.select_experts) no module hook reaches, so the method is wrapped on the layer's router object.
Nothing here chooses experts: the margin only reads the router logits (the `router` point, kept for the pass) through
the engine's scoring function and its score-correction bias.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np

from adapters.tracing.arch_maps import Routes
from harness.core.points import layer_point
from harness.rundir.traces import write_arrays

ROUTER = "router"


def routes_path(trace: Path) -> Path:
    return trace.with_name(trace.name.replace(".safetensors", ".routes.safetensors"))


class RouteCapture:
    """Hooks every layer's routing call; between begin() and end() its returns are collected a chunk at a time."""

    def __init__(self, model: Any, layers_path: str, routes: Routes, num_layers: int):
        self.routes, self.num_layers = routes, num_layers
        self.chunks: dict[int, list[tuple[Any, Any]]] | None = None
        self.handles: list[Any] = []
        self.biases: dict[int, Any] = {}
        layers = _attribute(model, layers_path)
        for index in range(num_layers):
            target = _attribute(layers[index], routes.module)
            if routes.bias:
                self.biases[index] = _attribute(layers[index], routes.bias)
            if routes.method:
                self._wrap(target, index)
            else:
                self.handles.append(target.register_forward_hook(
                    lambda _m, _args, output, index=index: self._on_return(index, output)))

    def _wrap(self, target: Any, index: int) -> None:
        method = getattr(target, self.routes.method)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            output = method(*args, **kwargs)
            self._on_return(index, output)
            return output

        setattr(target, self.routes.method, wrapped)
        self.handles.append(_Unwrap(target, self.routes.method))

    def _on_return(self, index: int, output: Any) -> None:
        if self.chunks is not None:
            ids, weights = output[self.routes.ids], output[self.routes.weights]
            self.chunks[index].append((ids.detach().to("cpu").clone(), weights.detach().to("cpu").clone()))

    def begin(self) -> None:
        self.chunks = {index: [] for index in range(self.num_layers)}

    @staticmethod
    def router_points(num_layers: int) -> tuple[str, ...]:
        """The points whose rows the margin reads (kept in memory for the pass)."""
        return tuple(layer_point(index, ROUTER) for index in range(num_layers))

    def end(self, trace: Path, positions: int, routers: dict[str, list[Any]], metadata: dict[str, str]) -> Path | None:
        """Write the pass's table beside its trace (routers: the router points' rows of the pass); returns its path."""
        import torch

        chunks, self.chunks = self.chunks or {}, None
        layers = {}
        for index, parts in chunks.items():
            if not parts:
                continue
            ids = torch.cat([p[0] for p in parts]).numpy()
            if ids.shape[0] != positions:
                raise RuntimeError(f"routes: layer {index} routed {ids.shape[0]} rows for {positions} positions")
            logits = routers.get(layer_point(index, ROUTER))
            layers[index] = Choice(ids, torch.cat([p[1] for p in parts]).double().numpy(),
                                   torch.cat(logits).to("cpu").double().numpy() if logits else None,
                                   self.biases[index].detach().to("cpu").double().numpy() if index in self.biases
                                   else None)
        return write_table(trace, layers, self.routes.scoring, metadata)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


@dataclass
class Choice:
    """One layer's choice in a pass: expert ids and weights [positions, k], the router logits it was made from
    [positions, experts] (None where not captured) and the engine's score-correction bias, if any."""

    ids: np.ndarray
    weights: np.ndarray
    logits: np.ndarray | None = None
    bias: np.ndarray | None = None


def write_table(trace: Path, layers: dict[int, Choice], scoring: str, metadata: dict[str, str]) -> Path | None:
    """The pass's routes table beside its trace (the layout of the module docstring); None where no layer routed."""
    arrays: dict[str, np.ndarray] = {}
    for index, choice in sorted(layers.items()):
        if choice.ids.shape != choice.weights.shape:
            raise RuntimeError(f"routes: layer {index}: {choice.ids.shape[1]} experts and {choice.weights.shape[1]} "
                               "weights per position")
        arrays[layer_point(index, "experts")] = choice.ids.astype(np.float64)
        arrays[layer_point(index, "expert_weights")] = choice.weights.astype(np.float64)
        if choice.logits is not None:
            arrays[layer_point(index, "router_margin")] = choice_margin(choice.logits, choice.ids, scoring, choice.bias)
    if not arrays:
        return None
    path = routes_path(trace)
    write_arrays(path, arrays, {**metadata, "scoring": scoring})
    return path


def choice_margin(logits: np.ndarray, ids: np.ndarray, scoring: str = "softmax",
                  bias: np.ndarray | None = None) -> np.ndarray:
    """Per position [positions, 1]: the weakest chosen expert's selection score minus the strongest unchosen one's
    (negative where the engine chose an expert its own scores rank below an unchosen one), in router-logit units:
    softmax ranks as the logits do, so its margin is the logit gap; a sigmoid score's gap is divided by the sigmoid's
    largest slope (1/4), so a logit difference of d can reorder experts only within a margin of 2d either way."""
    scores = logits if scoring == "softmax" else 1.0 / (1.0 + np.exp(-logits))
    if bias is not None:
        scores = scores + bias
    chosen = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(chosen, ids.astype(np.int64), True, axis=1)
    weakest = np.where(chosen, scores, np.inf).min(axis=1)
    strongest = np.where(chosen, -np.inf, scores).max(axis=1)
    slope = 1.0 if scoring == "softmax" else 0.25
    return ((weakest - strongest) / slope)[:, None]


class _Unwrap:
    """A wrapped method's handle: remove() restores the object's own method."""

    def __init__(self, target: Any, name: str):
        self.target, self.name = target, name

    def remove(self) -> None:
        vars(self.target).pop(self.name, None)


def _attribute(root: Any, path: str) -> Any:
    """root.a.b.c for path 'a.b.c' (indices into module lists too: 'layers.3')."""
    try:
        return reduce(lambda obj, part: obj[int(part)] if part.isdigit() else getattr(obj, part), path.split("."),
                      root)
    except (AttributeError, IndexError) as exc:
        raise RuntimeError(f"routes: the model has no {path} ({exc})") from exc
