"""The end of `parity run`: a run's results judged (verdicts, invariance, drift) and its run directory written.

Apart from harness.run.execute because it needs pandas, pyarrow and the verdict rules, which a run loads in the
background once its engines have started (harness.run.execute.JudgingCode), off the engines' path."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import models
from harness.compare.beams import judge_all
from harness.compare.ending import as_compared, ended_by
from harness.compare.prompt_verdicts import mark_verdicts
from harness.compare.verdicts import judge
from harness.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_PARITY
from harness.report.summary import write_summary
from harness.run import drift, invariance_verdicts
from harness.run.execute import PendingRun
from harness.run.executor import EngineOutcome, Progress
from harness.run.journal import read_engine_info
from harness.run.plan import EnginePlan
from harness.run.store import EngineMeta, write_meta
from harness.run.tables import beams_frame, results_frame, steps_frame, write_parquet
from harness.scenario.spec import LoadedScenario
from harness.semantics import effective
from harness.semantics.sampling_parity import judge_samples
from harness.types import Result


@dataclass
class RunOutcome:
    scenario: LoadedScenario  # as run: the selected cases and the engines that ran
    run_dir: Path
    verdicts: pd.DataFrame
    warnings: dict[str, list[str]]
    exit_code: int
    interrupted: bool
    effective_differences: list[tuple[list[str], str]]
    skipped: dict[str, str] = field(default_factory=dict)  # engine -> why it could not run here (--allow-missing)
    invariance: pd.DataFrame = field(default_factory=pd.DataFrame)  # invariance.parquet's rows, when asked for
    drift: pd.DataFrame = field(default_factory=pd.DataFrame)  # quantisation drift verdicts (harness.run.drift)


def engine_meta(plan: EnginePlan, outcome: EngineOutcome) -> EngineMeta:
    timings = [r.timings for r in outcome.results.values()]
    phases = {**outcome.phases, "generate_s": sum(t.get("generate_s", 0.0) for t in timings),
              "effective_s": sum(t.get("effective_s", 0.0) for t in timings)}
    return EngineMeta(engine=plan.engine, dtype=plan.dtype, threads=plan.threads, options=plan.setup.options,
                      env={"OMP_NUM_THREADS": str(plan.threads), "OMP_WAIT_POLICY": "passive"},
                      python=plan.python or sys.executable, model_path=str(plan.setup.model_path),
                      versions=outcome.versions, load_s=outcome.load_s, worker_pids=outcome.worker_pids,
                      restarts=outcome.restarts, phases=phases)


def finish(run: PendingRun, outcomes: dict[str, EngineOutcome], interrupted: bool, prepare_s: float, wall: float,
            parallel: int | None, progress: Progress) -> RunOutcome:
    """Judge a run's results (those in hand and those just computed) and write its run directory."""
    scenario, run_dir, plans = run.scenario, run.run_dir, run.plans
    spec = scenario.spec
    ref_path = models.resolve(spec.model, spec.engine_dtype(spec.reference), str(scenario.path))
    write_started = time.perf_counter()

    for plan in plans:  # engines with nothing left to run keep what their first session recorded
        earlier = {case: r for (name, case), r in run.done.items() if name == plan.name}
        outcome = outcomes.setdefault(plan.name, EngineOutcome(plan.name, **read_engine_info(plan.workdir)))
        outcome.results = {**earlier, **outcome.results}
    names = list(spec.engines)
    results = {(name, case_id): result for name, o in outcomes.items() for case_id, result in o.results.items()}
    ordered = [results[(n, c.case_id)] for n in names for c in scenario.cases if (n, c.case_id) in results]
    endings = _endings(scenario, ordered, models.eos_token_ids(ref_path))
    compared = {(r.engine, r.case_id): as_compared(r, endings[(r.engine, r.case_id)],
                                                   min(models.eos_token_ids(ref_path), default=None)) for r in ordered}
    decode = lambda t: run.tokenizer.decode([t])  # noqa: E731
    judged = judge_samples if spec.sampling else judge
    verdicts = pd.DataFrame() if interrupted and not results else judge_all(judged, scenario, compared, decode)
    verdicts = mark_verdicts(verdicts, scenario, run.meta.prompt_warnings)
    knob_rows = pd.DataFrame([row.model_dump()
                              for row in invariance_verdicts.judge(scenario, run.checks, results, decode)])
    params = {(n, c.case_id): c.engine_params[n].model_dump_json(exclude_none=True)
              for n in names for c in scenario.cases}
    write_parquet(run_dir / "results.parquet", results_frame(ordered, params, endings))
    write_parquet(run_dir / "steps.parquet", steps_frame(ordered))
    if any(r.beams for r in ordered):
        write_parquet(run_dir / "beams.parquet", beams_frame(ordered))
    if not verdicts.empty:
        write_parquet(run_dir / "verdicts.parquet", verdicts)
    if not knob_rows.empty:
        write_parquet(run_dir / "invariance.parquet", knob_rows)
    warnings = {n: sorted({w for r in ordered if r.engine == n for w in r.warnings}) for n in names}
    drifts = pd.DataFrame() if interrupted else drift.measure(scenario, run_dir, results, parallel, progress)
    all_expected = verdicts.empty or bool(verdicts["expected"].all())  # no verdicts: only the reference ran
    all_expected = all_expected and (drifts.empty or bool(drifts["ok"].all()))
    all_expected = all_expected and (knob_rows.empty or bool(knob_rows["expected"].all()))
    exit_code = EXIT_INTERRUPTED if interrupted else EXIT_OK if all_expected else EXIT_PARITY
    meta = run.meta.model_copy(update=dict(
        status="interrupted" if interrupted else "finished", wall_s=wall, exit_code=exit_code,
        engines={p.name: engine_meta(p, outcomes[p.name]) for p in plans}, warnings=warnings,
        effective_differences=effective.run_differences(names, ordered),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    write_summary(run_dir / "summary.md", meta, verdicts, drifts, knob_rows)
    meta.phases = {"prepare_s": prepare_s, "engines_s": wall, "write_s": time.perf_counter() - write_started}
    write_meta(run_dir, meta)
    return RunOutcome(scenario, run_dir, verdicts, warnings, exit_code, interrupted, meta.effective_differences,
                      meta.skipped, knob_rows, drifts)


def _endings(scenario: LoadedScenario, results: list[Result], eos_ids: set[int]) -> dict[tuple[str, str], str]:
    """How each result's generation ended (harness.compare.ending), by (engine, case)."""
    cases = {c.case_id: c for c in scenario.cases}
    return {(r.engine, r.case_id): ended_by(r, cases[r.case_id].engine_params[r.engine], eos_ids) for r in results}
