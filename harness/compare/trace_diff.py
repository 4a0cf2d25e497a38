"""Compare two traces (safetensors files of [positions, width] tensors, one per canonical point) point by point and
position by position, vectorised over positions. Knows nothing about engines: only point names and tensors.

Metrics per point and position (x = reference, y = other): max abs diff, relative L2 ||y-x||/||x||, cosine, and
SGLang's rel_diff 1 - 2*sum(xy)/sum(x^2+y^2). A point's error is its worst position's relative L2.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.core.points import COMPONENT, ordered, parse
from harness.rundir.traces import METRICS, Trace, position_metrics, row_chunks

# Relative rounding unit of each dtype: the smallest error a computation in that dtype can be expected to make.
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
def compared_width(point: str, x_shape: tuple[int, int], y_shape: tuple[int, int], names: tuple[str, str]) -> int:
    """The columns two traces' tensors of a point are compared over. Logits may differ in width (an engine that
    trims its output layer to the tokenizer's vocabulary): they are compared over the shared token ids, which
    compare_traces records in the frame's attrs. Any other width difference is an error."""
    if x_shape[1] == y_shape[1]:
        return x_shape[1]
    if point == "logits":
        return min(x_shape[1], y_shape[1])
    raise ValueError(f"{point}: shapes differ ({x_shape} in {names[0]}, {y_shape} in {names[1]})")


def compared_positions(point: str, reference: Trace, other: Trace) -> tuple[int, int]:
    """The positions both traces have rows of a point for. Only the logits may start later in one of them."""
    (x_first, x_end), (y_first, y_end) = reference.span(point), other.span(point)
    if point != "logits" and (x_first, x_end) != (y_first, y_end):
        raise ValueError(f"{point}: positions differ ({x_first}..{x_end} in {reference.path.name}, "
                         f"{y_first}..{y_end} in {other.path.name})")
    return max(x_first, y_first), min(x_end, y_end)


def compare_traces(reference: Trace, other: Trace) -> pd.DataFrame:
    """One row per shared point and position: point, layer, position and the four metrics, computed chunk by
    chunk of rows. frame.attrs["notes"] says where only part of a point was compared."""
    shared = [p for p in reference.points if p in set(other.points)]
    frames, notes = [], []
    for point in shared:
        x_shape, y_shape = reference.shape(point), other.shape(point)
        width = compared_width(point, x_shape, y_shape, (reference.path.name, other.path.name))
        if width < max(x_shape[1], y_shape[1]):
            notes.append(f"{point}: compared over the {width} token ids both engines score ({x_shape[1]} in "
                         f"{reference.path.name}, {y_shape[1]} in {other.path.name})")
        first, end = compared_positions(point, reference, other)
        parts = [position_metrics(reference.rows(point, first + a, first + b, width),
                                  other.rows(point, first + a, first + b, width))
                 for a, b in row_chunks(end - first, width)]
        metrics = {m: np.concatenate([part[m] for part in parts]) for m in METRICS}
        frames.append(pd.DataFrame({"point": point, "layer": parse(point)[0], "position": np.arange(first, end),
                                    **metrics}))
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs["notes"] = notes + missing_maps(reference, other)
    return frame


def metrics_frame(metrics: Trace, *traces: Trace) -> pd.DataFrame:
    """compare_traces' frame from a pass compared as it was captured (adapters.tracing.comparing_writer): its metrics
    file (per point a [positions, 4] tensor of METRICS); traces: both sides' (for the maps they were captured
    with)."""
    frames = []
    for point in metrics.points:
        first, end = metrics.span(point)
        values = metrics.rows(point, first, end)
        frames.append(pd.DataFrame({"point": point, "layer": parse(point)[0], "position": np.arange(first, end),
                                    **{m: values[:, i] for i, m in enumerate(METRICS)}}))
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["point", "layer", "position", *METRICS])
    notes = [n for n in metrics.metadata.get("compare_notes", "").split("; ") if n]
    frame.attrs["notes"] = notes + missing_maps(*traces)
    return frame


def missing_maps(*traces: Trace) -> list[str]:
    """What an engine without a per-layer map for the model could not capture (its trace holds the logits only)."""
    return [f"{missing}: compared at the logits only (a per-layer map localises per layer)"
            for missing in dict.fromkeys(t.metadata.get("missing_map", "") for t in traces) if missing]


def summarize(per_position: pd.DataFrame) -> pd.DataFrame:
    """Per point, in forward order: error (worst position's relative L2, NaN if any value is not finite), the
    position where it is worst, max abs diff, min cosine, max rel_diff."""
    grouped = per_position.groupby("point", sort=False)
    summary = pd.DataFrame({
        "layer": grouped["layer"].first(),
        "error": grouped["rel_l2"].max(skipna=False),
        "worst_position": grouped["rel_l2"].apply(
            lambda s: int(per_position["position"].to_numpy()[s.index[s.fillna(np.inf).to_numpy().argmax()]])),
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


def first_out(points: pd.DataFrame, per_position: pd.DataFrame) -> pd.DataFrame:
    """Add each point's first position whose error exceeds its threshold (-1 where none does): where along the
    sequence the engines part (a sliding-window fault shows only past the window). points: against_floor's."""
    threshold = points.set_index("point")["threshold"].reindex(per_position["point"]).to_numpy()
    over = per_position[per_position["rel_l2"].to_numpy() > threshold]
    first = over.groupby("point")["position"].min().reindex(points["point"])
    return points.assign(first_out_position=first.fillna(-1).astype(int).to_numpy())


def top2(trace: Trace, position: int) -> tuple[list[int], float]:
    """The two best token ids at a position of a trace's logits and their log-probability margin."""
    logits = trace.rows("logits", position, position + 1)[0]
    ids = np.argsort(-logits)[:2]
    return [int(i) for i in ids], float(logits[ids[0]] - logits[ids[1]])
