"""A traced pass compared with the reference's and judged against the noise floor that fits it.

A case has up to two floors, each the reference against itself on its own weights (rounded to the run's dtype) in
higher precision: the forced floor, whose layers start from the reference's input like the forced passes of the
engines that can (judged block by block: harness.compare.layer_floor), and the free floor, whose layers run on their
own outputs like the passes of engines that cannot (an engine without a per-layer map, llama.cpp; judged by the
worst position, cumulative over layers: harness.compare.trace_diff.against_floor). Where the floor's own routing
chose other experts than the reference (a mixture of experts' near-ties), those positions of that layer are left
out of the floor: a floor is rounding, not routing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.compare.layer_floor import RULES, against_forced_floor
from harness.compare.routing import classify, compare_routes, read_routes, weight_floor
from harness.compare.trace_diff import against_floor, compare_traces, first_out, metrics_frame, summarize
from harness.core.points import layer_point
from harness.core.types import TraceResult
from harness.rundir.traces import Trace

FREE_K = 10.0  # k of a free pass against the free floor (HF vs vLLM in float32 stays under 4.5x)


@dataclass
class Floors:
    forced: pd.DataFrame | None = None  # the forced floor's per-position errors against the reference
    forced_flips: pd.DataFrame | None = None  # (layer, position) where the forced floor routed otherwise
    free: pd.DataFrame | None = None  # the free floor's per-point summary
    weights: dict[int, float] = field(default_factory=dict)  # per layer: the chosen experts' weights' floor (forced)
    free_weights: dict[int, float] = field(default_factory=dict)  # the same, from the free floor
    experts: pd.DataFrame | None = None  # (layer, position, expert): where the reference routed each position


def expert_positions(ref_result: TraceResult) -> pd.DataFrame | None:
    """(layer, position, expert) for every expert the reference chose (None: not a mixture of experts)."""
    if not ref_result.routes:
        return None
    frames = [pd.DataFrame({"layer": layer, "position": np.repeat(np.arange(len(routes.ids)), routes.ids.shape[1]),
                            "expert": routes.ids.reshape(-1)})
              for layer, routes in read_routes(ref_result.routes).items()]
    return pd.concat(frames, ignore_index=True) if frames else None


def default_k(dtype: str, forced: bool, override: float | None) -> float:
    """The k a pass is judged with: the scenario's or the command's, else the dtype's (forced) or FREE_K."""
    return override or (RULES[dtype].k if forced else FREE_K)


def pass_frame(result: TraceResult, ref_result: TraceResult, floor: bool = False) -> pd.DataFrame:
    """Per point and position, a pass against the reference's: from the metrics its engine wrote as it compared
    (TraceResult.errors), else from both traces, written whole (the floor's: the higher precision is the side
    compared with)."""
    trace, ref_trace = Trace(result.path), Trace(ref_result.path)
    if result.errors:
        return metrics_frame(Trace(result.errors), ref_trace, trace)
    return compare_traces(trace, ref_trace) if floor else compare_traces(ref_trace, trace)


def add_floor(floors: Floors, result: TraceResult, ref_result: TraceResult) -> pd.DataFrame:
    """Take a floor pass into a case's floors; returns its per-position frame (errors.parquet's rows)."""
    frame = pass_frame(result, ref_result, floor=True)
    routed = compare_routes(read_routes(ref_result.routes), read_routes(result.routes)) \
        if ref_result.routes and result.routes else None
    if result.forced:
        floors.forced, floors.weights = frame, weight_floor(routed)
        floors.forced_flips = routed.loc[~routed["same"].astype(bool), ["layer", "position"]] \
            if routed is not None else None
    else:
        floors.free, floors.free_weights = summarize(frame), weight_floor(routed)
    return frame


def compared_points(result: TraceResult, ref_result: TraceResult, floors: Floors, dtype: str, k: float,
                    excluded: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A pass against the reference's: per point and position, and per point against the floor that fits the pass,
    with the first position each leaves it at. excluded: (layer, position) pairs not judged (routing flips at a
    near-tie)."""
    frame = pass_frame(result, ref_result)
    summary = summarize(frame)
    if result.forced:
        return frame, against_forced_floor(summary, frame, floors.forced, dtype, k, excluded, floors.forced_flips,
                                           floors.experts)
    return frame, first_out(against_floor(summary, floors.free, dtype, k), frame)


def floor_words(forced: bool, weights_dtype: str, floor_dtype: str | None, name: str | None) -> str:
    """What a floor is made of, in words (for explain/summary.md and localisation.json)."""
    if floor_dtype is None or name is None:
        return "the dtype's rounding unit alone (the reference cannot run in higher precision)"
    how = ("each layer started from the reference's input, judged per block of positions; positions where its "
           "own routing chose other experts are left out" if forced else
           "its layers on their own outputs, judged at the worst position, cumulative over layers")
    return (f"{name}: the reference against itself in {floor_dtype} on its own weights rounded to {weights_dtype}, "
            f"arithmetic rounding only ({how})")


def out_of_floor(frame: pd.DataFrame, points: pd.DataFrame, routed: pd.DataFrame) -> np.ndarray:
    """Per row of a routing comparison (layer, position): whether the layer's block output (its `moe` point) is
    beyond the point's threshold at that position: the positions a reading of the block must explain."""
    moe = frame[frame["point"].str.endswith(".moe")].set_index(["layer", "position"])["rel_l2"]
    keys = pd.MultiIndex.from_arrays([routed["layer"].to_numpy(), routed["position"].to_numpy()])
    threshold = points.set_index("point")["threshold"].reindex(
        [layer_point(int(layer), "moe") for layer in routed["layer"]]).to_numpy()
    return np.nan_to_num(moe.reindex(keys).to_numpy(), nan=0.0) > np.nan_to_num(threshold, nan=np.inf)


@dataclass
class Judged:
    """A traced pass judged: per point and position, per point against its floor, and (a mixture of experts) each
    (layer, position)'s routing compared and read; k: the threshold used."""

    frame: pd.DataFrame
    points: pd.DataFrame
    routing: pd.DataFrame | None
    k: float


def judge_pass(result: TraceResult, ref_result: TraceResult, floors: Floors, dtype: str,
               override_k: float | None = None) -> Judged:
    """A pass against the reference's and the floor that fits it; a forced pass's routing flips at a near-tie are
    left out of what is judged (they are the router's near-ties, not rounding), and each routing row says whether
    the block's output is out of its floor there."""
    k = default_k(dtype, result.forced, override_k)
    frame, points = compared_points(result, ref_result, floors, dtype, k)
    if not (ref_result.routes and result.routes):
        return Judged(frame, points, None, k)
    routed = classify(compare_routes(read_routes(ref_result.routes), read_routes(result.routes)), frame, points, k,
                      floors.weights if result.forced else floors.free_weights)
    ties = routed.loc[routed["kind"] == "near_tie_flip", ["layer", "position"]]
    if result.forced and len(ties):
        frame, points = compared_points(result, ref_result, floors, dtype, k, excluded=ties)
    return Judged(frame, points, routed.assign(out=out_of_floor(frame, points, routed)), k)


def read_floors(traces: dict, names: tuple[str | None, ...], case_id: str,
                ref_result: TraceResult) -> tuple[Floors, dict[str, pd.DataFrame], list[str]]:
    """A case's noise floors from its floor passes' results (traces: (plan name, case) -> result; names: the floor
    passes planned, None where not): the floors, each floor's per-position frame by name, and what is missing."""
    floors = Floors(experts=expert_positions(ref_result))
    frames, missing = {}, []
    for name in filter(None, names):
        result = traces.get((name, case_id))
        if isinstance(result, TraceResult) and result.status == "ok":
            frames[name] = add_floor(floors, result, ref_result)
        else:
            missing.append(f"no noise floor ({name}): {result.error if result is not None else 'not run'}")
    return floors, frames, missing
