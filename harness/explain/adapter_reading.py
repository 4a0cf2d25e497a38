"""Two engines' LoRA updates compared (each trace's metadata carries, per layer and adapted module, the norm of the
scale * B A its engine holds: adapters.tracing.lora_weights) and what a difference means: a module one engine does
not adapt, the same update at another scale in every module (alpha / sqrt(r), rsLoRA, where the adapter says
alpha / r, or the reverse), another layer's update at each layer (an adapter applied at the wrong layer index), or
other weights. The norms are the engines' own: equal weights give equal norms to the last digits, so the tolerance
is tight (looser where an engine holds the adapter in half precision)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

RTOL = {"float32": 1e-4, "float64": 1e-4}  # norms of one update held in float32 by two engines agree well inside
HALF_RTOL = 1e-2  # in bfloat16 or float16 (vLLM holds an adapter in the model's dtype, PEFT in float32)


def norms(metadata: dict[str, str]) -> dict[tuple[int, str], float] | None:
    """(layer, module) -> its update's norm, from a trace's metadata; None where the engine applied no adapter."""
    if "lora_norms" not in metadata:
        return None
    return {(int(key.split(".", 1)[0]), key.split(".", 1)[1]): value
            for key, value in json.loads(metadata["lora_norms"]).items()}


def tolerance(*dtypes: str) -> float:
    """How close two engines' norms of one update come, held in these dtypes."""
    return max(RTOL.get(dtype, HALF_RTOL) for dtype in dtypes)


def compare(reference: dict[tuple[int, str], float], other: dict[tuple[int, str], float], rank: int,
            engine: str, rtol: float = RTOL["float32"]) -> dict[str, Any]:
    """The reading: kind (same | unadapted | extra | scale | layer_shift | weights) and a sentence. rtol: how close
    equal updates' norms come (tolerance())."""

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= rtol * max(abs(a), abs(b))

    shared = sorted(reference)
    adapted = sorted({k for k, v in (*reference.items(), *other.items()) if v > 0})  # by either engine
    if all(close(reference.get(k, 0.0), other.get(k, 0.0)) for k in adapted):
        return {"kind": "same", "sentence": f"the LoRA updates agree in all {len(adapted)} adapted modules"}
    shift = _layer_shift(reference, other, close)
    if shift is not None:
        return {"kind": "layer_shift", "offset": shift,
                "sentence": f"{engine} applies at each layer the update the reference applies {abs(shift)} layer"
                            f"{'s' if abs(shift) > 1 else ''} {'later' if shift > 0 else 'earlier'} (layer i holds "
                            f"layer i{shift:+d}'s): the adapter applied at the wrong layer index"}
    missing = sorted(k for k, v in reference.items() if v > 0 and other.get(k, 0.0) == 0.0)
    if missing:
        modules = sorted({m for _, m in missing})
        layers = sorted({layer for layer, _ in missing})
        return {"kind": "unadapted", "modules": modules,
                "sentence": f"{engine} leaves {', '.join(modules)} unadapted (layers {_span(layers)}), which the "
                            "reference adapts: an engine that skips a module it does not support"}
    extra = sorted(k for k, v in other.items() if v > 0 and reference.get(k, 0.0) == 0.0)
    if extra:
        return {"kind": "extra", "sentence": f"{engine} adapts {', '.join(sorted({m for _, m in extra}))}, which "
                                             "the reference does not"}
    ratios = [other.get(k, 0.0) / reference[k] for k in shared if reference[k] > 0]
    if ratios and all(close(r, ratios[0]) for r in ratios):
        return {"kind": "scale", "ratio": ratios[0], "sentence": _scale_sentence(ratios[0], rank, engine, close)}
    first = next(k for k in shared if not close(reference[k], other.get(k, 0.0)))
    return {"kind": "weights", "sentence": f"{engine}'s LoRA update differs first at layer {first[0]} {first[1]} "
                                           f"(norm {other.get(first, 0.0):.4g} against {reference[first]:.4g})"}


def _scale_sentence(ratio: float, rank: int, engine: str, close: Callable[[float, float], bool]) -> str:
    said = f"{engine} applies the adapter at {ratio:.4g}x the reference's scale in every adapted module"
    if rank > 1 and close(ratio, math.sqrt(rank)):
        return f"{said}: alpha / sqrt(r) (rsLoRA) where the adapter says alpha / r (r = {rank})"
    if rank > 1 and close(ratio, 1 / math.sqrt(rank)):
        return f"{said}: alpha / r where the adapter says alpha / sqrt(r) (rsLoRA, r = {rank})"
    return said


def _layer_shift(reference: dict[tuple[int, str], float], other: dict[tuple[int, str], float],
                 close: Callable[[float, float], bool]) -> int | None:
    """The one offset d with other[(i, m)] == reference[(i + d, m)] for every update the other engine holds: layers
    off by d with the edge layer left without one (an off-by-one index), or wrapping around the layers; None if no
    offset explains at least half of the reference's updates (module names with nothing in common explain none)."""
    layers = sorted({layer for layer, _ in reference})
    count = len(layers)
    held = [(i, m) for (i, m), value in other.items() if value > 0 and i in layers]
    if 2 * len(held) < len(reference):
        return None
    for d in sorted(range(1 - count, count), key=abs):
        if d and all(close(other[(i, m)], reference.get((i + d, m), -1.0)) for i, m in held):
            return d
    for d in range(1, count):
        pairs = [((i, m), (layers[(layers.index(i) + d) % count], m)) for i, m in held]
        compared = [(mine, theirs) for mine, theirs in pairs if theirs in reference]
        if 2 * len(compared) >= len(reference) and all(close(other[mine], reference[theirs])
                                                       for mine, theirs in compared):
            return d if d <= count // 2 else d - count
    return None


def _span(layers: list[int]) -> str:
    return f"{layers[0]}..{layers[-1]}" if len(layers) > 2 else ", ".join(map(str, layers))
