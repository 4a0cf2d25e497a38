"""What the run directory keeps of explain's traced passes when they ran in a scratch folder (harness.explain.
trace_passes): per engine and case, engines/<name>/traces/<case>.safetensors holding the logits rows (from the
prompt's last position: what the divergence and near-tie readings look at) and, where an engine leaves the noise
floor, the rows of the first layer it leaves it in and of the residual stream entering that layer, for that engine
and for the reference. The per-position errors of every point are in explain/errors.parquet.

The reference's rows come from its full trace in the scratch folder; another engine's layer rows from a second,
partial pass of the engine (only those points captured), served by the engine still loaded from its traces.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.core.types import Result, TraceRequest, TraceResult
from harness.executors.engine_runs import EngineOutcome, Progress, run_engines
from harness.explain.localise import Localisation
from harness.plan.plans import engine_plan
from harness.run.trace_passes import FREE
from harness.rundir.traces import Trace, trace_file_name, write_arrays
from harness.scenario.spec import LoadedScenario

STORED = {"F32": np.float32, "F64": np.float64}
PARTIAL = ".layers"  # an engine's folder for its partial passes' traces, merged into its kept traces and removed


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
    logits: dict[tuple[str, str], Path] = {}  # (engine, case) -> the trace its kept logits rows come from
    for request in requests:
        wanted_by_ref = sorted({p for (_, case), points in layers.items() if case == request.case_id for p in points})
        source = reference_trace(ref, request.case_id)
        if source is not None and source.exists():
            _copy([(source, ["logits", *wanted_by_ref])], run_dir / "engines" / ref / "traces", request.case_id)
        for name in scenario.spec.engines:
            result = traces.get((name, request.case_id))
            if name == ref or not isinstance(result, TraceResult) or result.status != "ok":
                continue
            free = traces.get((name + FREE, request.case_id))  # a forced pass's engine: its own layers' logits
            logits[(name, request.case_id)] = Path(free.path if isinstance(free, TraceResult) and
                                                   free.status == "ok" else result.path)
            points = layers.get((name, request.case_id))
            if points:  # the layer's rows as the traced pass made them: forced where it was
                inputs = str(source) if result.forced and source is not None else None
                by_engine.setdefault(name, []).append(request.model_copy(update={
                    "points": points, "inputs_from": inputs, "trace_dir": str(run_dir / "engines" / name / PARTIAL)}))
            else:
                _copy([(logits[(name, request.case_id)], ["logits"])], run_dir / "engines" / name / "traces",
                      request.case_id)
    plans = [engine_plan(scenario, name, run_dir, reqs, op="trace") for name, reqs in by_engine.items()]
    if plans:
        outcomes, _ = run_engines(plans, parallel, progress)
        kept.outcomes = {f"{name}@layers": outcome for name, outcome in outcomes.items()}
        for name, outcome in outcomes.items():
            for cid, partial in outcome.results.items():
                rows = [(Path(partial.path), layers[(name, cid)])] if partial.status == "ok" else []
                _copy([*rows, (logits[(name, cid)], ["logits"])], run_dir / "engines" / name / "traces", cid)
                if partial.status != "ok":
                    kept.notes.append(f"{cid}: {name}: the divergent layer's rows were not kept ({partial.error})")
            shutil.rmtree(run_dir / "engines" / name / PARTIAL, ignore_errors=True)
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


def _copy(sources: list[tuple[Path, list[str]]], folder: Path, case_id: str) -> None:
    """The named points of each trace (those it has), every row, into folder/<case>.safetensors (the first trace's
    metadata)."""
    arrays, metadata = {}, None
    for source, points in sources:
        trace = Trace(source)
        metadata = trace.metadata if metadata is None else metadata
        for point in points:
            if point in trace.tensors:
                first, end = trace.span(point)
                arrays[point] = trace.rows(point, first, end).astype(STORED[trace.tensors[point]["dtype"]])
    folder.mkdir(parents=True, exist_ok=True)
    write_arrays(folder / trace_file_name(case_id), arrays, metadata or {})
