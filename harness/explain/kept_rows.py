"""What the run directory keeps of explain's traced passes when they ran in a scratch folder (harness.explain.
trace_passes): per engine and case, engines/<name>/traces/<case>.safetensors holding the logits rows (from the
prompt's last position: what the divergence and near-tie readings look at) and, where an engine leaves the noise
floor, the rows of the first layer it leaves it in and of the residual stream entering that layer, for that engine
and for the reference. The per-position errors of every point are in explain/errors.parquet.

The reference's rows come from its full trace in the scratch folder; another engine's layer rows from a second,
partial pass of the engine (only those points captured), served by the engine still loaded from its traces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.core.types import Result, TraceRequest, TraceResult
from harness.executors.engine_runs import EngineOutcome, Progress, run_engines
from harness.explain.localise import Localisation
from harness.plan.plans import engine_plan
from harness.rundir.traces import Trace, trace_file_name, write_arrays
from harness.scenario.spec import LoadedScenario

STORED = {"F32": np.float32, "F64": np.float64}


@dataclass
class Kept:
    notes: list[str] = field(default_factory=list)
    outcomes: dict[str, EngineOutcome] = field(default_factory=dict)  # the partial passes', by plan name


def layer_points(points: pd.DataFrame, point: str) -> list[str]:
    """The points of `point`'s layer and the residual stream entering it (the embeddings before layer 0), in forward
    order. points: an engine's per-point summary of one case (forward order)."""
    names = list(points["point"])
    layers = list(points["layer"])
    layer = layers[names.index(point)]
    first = next(i for i, value in enumerate(layers) if value == layer)
    incoming = [n for n in names[:first] if n.endswith(".residual") or n == "embeddings"][-1:]
    return incoming + [n for n, value in zip(names, layers, strict=True) if value == layer]


def keep_rows(scenario: LoadedScenario, run_dir: Path, requests: list[TraceRequest],
              traces: dict[tuple[str, str], Result | TraceResult], per_point: list[pd.DataFrame],
              localisations: list[Localisation], reference_trace: Callable[[str, str], Path | None],
              parallel: int, progress: Progress) -> Kept:
    """Write each engine's kept trace into the run directory (see the module's docstring)."""
    ref = scenario.spec.reference
    layers = _divergent_layers(per_point, localisations)
    kept = Kept()
    by_engine: dict[str, list[TraceRequest]] = {}
    for request in requests:
        wanted_by_ref = sorted({p for (_, case), points in layers.items() if case == request.case_id for p in points})
        source = reference_trace(ref, request.case_id)
        if source is not None and source.exists():
            _copy(source, run_dir / "engines" / ref / "traces", request.case_id, ["logits", *wanted_by_ref])
        for name in scenario.spec.engines:
            result = traces.get((name, request.case_id))
            if name == ref or not isinstance(result, TraceResult) or result.status != "ok":
                continue
            points = layers.get((name, request.case_id))
            if points:
                by_engine.setdefault(name, []).append(request.model_copy(update={"points": [*points, "logits"]}))
            else:
                _copy(Path(result.path), run_dir / "engines" / name / "traces", request.case_id, ["logits"])
    plans = [engine_plan(scenario, name, run_dir, reqs, op="trace") for name, reqs in by_engine.items()]
    if plans:
        outcomes, _ = run_engines(plans, parallel, progress)
        kept.outcomes = {f"{name}@layers": outcome for name, outcome in outcomes.items()}
        kept.notes += [f"{cid}: {name}: the divergent layer's rows were not kept ({r.error})"
                       for name, o in outcomes.items() for cid, r in o.results.items() if r.status != "ok"]
    return kept


def _divergent_layers(per_point: list[pd.DataFrame], localisations: list[Localisation]) -> dict[tuple[str, str],
                                                                                                 list[str]]:
    """(engine, case) -> the points kept for the layer where it first leaves the noise floor."""
    summaries = {(frame["engine"].iloc[0], frame["case_id"].iloc[0]): frame for frame in per_point if len(frame)}
    found = {}
    for loc in localisations:
        summary = summaries.get((loc.engine, loc.case_id))
        if loc.out_of_floor and summary is not None:
            found[(loc.engine, loc.case_id)] = layer_points(summary, loc.out_of_floor["point"])
    return found


def _copy(source: Path, folder: Path, case_id: str, points: list[str]) -> None:
    """The named points of a trace (those it has), every row, into folder/<case>.safetensors."""
    trace = Trace(source)
    arrays = {}
    for point in points:
        if point in trace.tensors:
            first, end = trace.span(point)
            arrays[point] = trace.rows(point, first, end).astype(STORED[trace.tensors[point]["dtype"]])
    folder.mkdir(parents=True, exist_ok=True)
    write_arrays(folder / trace_file_name(case_id), arrays, trace.metadata)
