"""Compare two traces (safetensors files of [positions, width] tensors, one per canonical point) point by point and
position by position, vectorised over positions. Knows nothing about engines: only point names and tensors.

Metrics per point and position (x = reference, y = other): max abs diff, relative L2 ||y-x||/||x||, cosine, and
SGLang's rel_diff 1 - 2*sum(xy)/sum(x^2+y^2). A point's error is its worst position's relative L2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.explain.points import COMPONENT, ordered, parse

# Relative rounding unit of each dtype: the smallest error a computation in that dtype can be expected to make.
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
METRICS = ("max_abs", "rel_l2", "cosine", "rel_diff")


class Trace:
    """Lazy reader: tensors are read one at a time, so comparing 400 points never holds a whole trace."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        self.file = safe_open(str(path), framework="numpy")
        self.metadata = self.file.metadata() or {}
        self.points = ordered(list(self.file.keys()))

    def get(self, point: str) -> np.ndarray:
        return self.file.get_tensor(point).astype(np.float64, copy=False)

    @property
    def fused(self) -> set[str]:
        return set(filter(None, self.metadata.get("fused", "").split(",")))


def position_metrics(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row metrics of two [positions, width] arrays."""
    tiny = np.finfo(np.float64).tiny
    diff = y - x
    xx, yy, xy = (x * x).sum(axis=1), (y * y).sum(axis=1), (x * y).sum(axis=1)
    with np.errstate(all="ignore"):
        return {"max_abs": np.abs(diff).max(axis=1),
                "rel_l2": np.sqrt((diff * diff).sum(axis=1)) / np.sqrt(np.maximum(xx, tiny)),
                "cosine": xy / np.sqrt(np.maximum(xx * yy, tiny)),
                "rel_diff": 1.0 - 2.0 * xy / np.maximum(xx + yy, tiny)}


def compare_traces(reference: Trace, other: Trace) -> pd.DataFrame:
    """One row per shared point and position: point, layer, position and the four metrics."""
    shared = [p for p in reference.points if p in set(other.points)]
    frames = []
    for point in shared:
        x, y = reference.get(point), other.get(point)
        if x.shape != y.shape:
            raise ValueError(f"{point}: shapes differ ({x.shape} in {reference.path.name}, {y.shape} in "
                             f"{other.path.name})")
        metrics = position_metrics(x, y)
        frames.append(pd.DataFrame({"point": point, "layer": parse(point)[0], "position": np.arange(x.shape[0]),
                                    **metrics}))
    return pd.concat(frames, ignore_index=True)


def summarize(per_position: pd.DataFrame) -> pd.DataFrame:
    """Per point, in forward order: error (worst position's relative L2, NaN if any value is not finite), the
    position where it is worst, max abs diff, min cosine, max rel_diff."""
    grouped = per_position.groupby("point", sort=False)
    summary = pd.DataFrame({
        "layer": grouped["layer"].first(),
        "error": grouped["rel_l2"].max(skipna=False),
        "worst_position": grouped["rel_l2"].apply(lambda s: int(s.fillna(np.inf).to_numpy().argmax())),
        "max_abs": grouped["max_abs"].max(skipna=False),
        "min_cosine": grouped["cosine"].min(skipna=False),
        "max_rel_diff": grouped["rel_diff"].max(skipna=False),
    })
    summary = summary.loc[ordered(list(summary.index))].reset_index()
    summary["component"] = [COMPONENT.get(parse(p)[1], parse(p)[1]) for p in summary["point"]]
    return summary


def against_floor(summary: pd.DataFrame, floor: pd.DataFrame | None, dtype: str, k: float) -> pd.DataFrame:
    """Add the noise floor per point and whether the error leaves it (error > k x floor). A point's floor is the
    largest error the reference shows against itself in higher precision at that kind of point (v, attn, ...) in
    this layer or any layer before it (noise already present upstream is no evidence of a new fault), and at
    least the dtype's rounding unit. summary is in forward order."""
    out = summary.copy()
    measured = floor.set_index("point")["error"].reindex(out["point"]).to_numpy() if floor is not None else np.nan
    out["floor"] = np.fmax(np.nan_to_num(np.broadcast_to(measured, len(out)), nan=0.0), EPS[dtype])
    kind = [parse(p)[1] for p in out["point"]]
    out["floor"] = out.groupby(kind, sort=False)["floor"].cummax()
    out["threshold"] = k * out["floor"]
    out["ratio"] = out["error"] / out["floor"]
    out["leaves_floor"] = out["error"] > out["threshold"]
    return out


def top2(trace: Trace, position: int) -> tuple[list[int], float]:
    """The two best token ids at a position of a trace's logits and their log-probability margin."""
    logits = trace.file.get_slice("logits")[position : position + 1].astype(np.float64)[0]
    ids = np.argsort(-logits)[:2]
    return [int(i) for i in ids], float(logits[ids[0]] - logits[ids[1]])
