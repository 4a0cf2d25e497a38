"""The end of `parity run`: a run's results written and judged by every verdict family (harness.verdicts), its run
directory completed.

Apart from harness.run.execute because it needs pandas, pyarrow and the verdict rules, which a run loads in the
background once its engines have started (harness.run.execute.JudgingCode), off the engines' path."""

from __future__ import annotations

import resource
import sys
import time

import pandas as pd

from harness import models
from harness.compare.ending import DecodeIds, Ending, as_compared, read_ending
from harness.compare.tie_noise import TieEvidence
from harness.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_PARITY
from harness.core.types import Result
from harness.executors.engine_runs import EngineOutcome, Progress
from harness.plan.plans import EnginePlan
from harness.report.summary import write_summary
from harness.run import drift_passes, tie_checks
from harness.run.outcome import PendingRun, RunOutcome
from harness.rundir import layout
from harness.rundir.journal import read_engine_info
from harness.rundir.store import EngineMeta, write_json, write_meta
from harness.rundir.tables import beams_frame, results_frame, steps_frame, write_parquet
from harness.scenario.spec import LoadedScenario
from harness.semantics import effective
from harness.verdicts.family import Judging, families


def engine_meta(plan: EnginePlan, outcome: EngineOutcome) -> EngineMeta:
    timings = [r.timings for r in outcome.results.values()]
    phases = {**outcome.phases, "generate_s": sum(t.get("generate_s", 0.0) for t in timings),
              "effective_s": sum(t.get("effective_s", 0.0) for t in timings)}
    return EngineMeta(engine=plan.engine, dtype=plan.dtype, threads=plan.threads, options=plan.setup.options,
                      env={"OMP_NUM_THREADS": str(plan.threads), "OMP_WAIT_POLICY": "passive"},
                      python=plan.python or sys.executable, model_path=str(plan.setup.model_path),
                      lora=plan.setup.lora.path if plan.setup.lora else "",
                      versions=outcome.versions, load_s=outcome.load_s, model_loads=outcome.model_loads,
                      worker_pids=outcome.worker_pids,
                      restarts=outcome.restarts, phases=phases)


def finish(run: PendingRun, outcomes: dict[str, EngineOutcome], interrupted: bool, prepare_s: float, wall: float,
           parallel: int | None, progress: Progress) -> RunOutcome:
    """Judge a run's results (those in hand and those just computed) with every verdict family and write its run
    directory."""
    scenario, run_dir, plans = run.scenario, run.run_dir, run.plans
    spec = scenario.spec
    ref_path = scenario.engine(spec.reference).model_folder
    write_started = time.perf_counter()

    for plan in plans:  # engines with nothing left to run keep what their first session recorded
        earlier = {case: r for (name, case), r in run.done.items() if name == plan.name}
        outcome = outcomes.setdefault(plan.name, EngineOutcome(plan.name, **read_engine_info(plan.workdir)))
        outcome.results = {**earlier, **outcome.results}
    names = list(spec.engines)
    results = {(name, case_id): result for name, o in outcomes.items() for case_id, result in o.results.items()}
    ordered = [results[(n, c.case_id)] for n in names for c in scenario.cases if (n, c.case_id) in results]
    eos_ids = models.eos_token_ids(ref_path)
    decode_ids = lambda ids, skip: run.tokenizer.decode(ids, skip_special_tokens=skip)  # noqa: E731
    endings = _endings(scenario, ordered, eos_ids, decode_ids)
    compared = {(r.engine, r.case_id): as_compared(r, endings[(r.engine, r.case_id)].how, min(eos_ids, default=None))
                for r in ordered}
    params = {(n, c.case_id): c.engine_params[n].model_dump_json(exclude_none=True)
              for n in names for c in scenario.cases}
    write_parquet(run_dir / layout.RESULTS, results_frame(ordered, params, {k: e.how for k, e in endings.items()}))
    write_parquet(run_dir / layout.STEPS, steps_frame(ordered))
    if any(r.beams for r in ordered):
        write_parquet(run_dir / layout.BEAMS, beams_frame(ordered))
    ties = TieEvidence() if interrupted else _near_tie_evidence(run, {**results, **compared}, parallel, progress)
    write_json(run_dir / layout.NEAR_TIES, ties.as_json())
    judging = Judging(scenario=scenario, run_dir=run_dir, results=results, compared=compared, ties=ties,
                      decode=lambda t: run.tokenizer.decode([t]), checks=run.checks,
                      prompt_warnings=run.meta.prompt_warnings,
                      engine_prompt_warnings=run.meta.engine_prompt_warnings, interrupted=interrupted,
                      versions={name: o.versions for name, o in outcomes.items()},
                      decode_ids=decode_ids, eos_ids=eos_ids, endings=endings,
                      drift_traces={} if interrupted else drift_passes.run_passes(scenario, run_dir, results,
                                                                                   parallel, progress))
    tables = judge_families(judging)
    warnings = {n: sorted({w for r in ordered if r.engine == n for w in r.warnings}) for n in names}
    all_expected = all(bool(rows["expected"].all()) for rows in tables.values())  # no rows: only the reference ran
    exit_code = EXIT_INTERRUPTED if interrupted else EXIT_OK if all_expected else EXIT_PARITY
    meta = run.meta.model_copy(update=dict(
        status="interrupted" if interrupted else "finished", wall_s=wall, exit_code=exit_code,
        engines={p.name: engine_meta(p, outcomes[p.name]) for p in plans}, warnings=warnings,
        effective_differences=effective.run_differences(names, ordered),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    write_summary(run_dir / layout.SUMMARY, meta, tables)
    meta.phases = {"prepare_s": prepare_s, "engines_s": wall, "write_s": time.perf_counter() - write_started,
                   "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # the harness process
    write_meta(run_dir, meta)
    return RunOutcome(scenario, run_dir, tables, warnings, exit_code, interrupted, meta.effective_differences,
                      meta.skipped)


def _near_tie_evidence(run: PendingRun, results: dict[tuple[str, str], Result], parallel: int | None,
                       progress: Progress) -> TieEvidence:
    """The noise and layer checks near-ties are read with (harness.run.tie_checks); where gathering them fails, the
    run's verdicts are still written, reading only exact ties as near-ties, and say why."""
    try:
        return tie_checks.gather(run.scenario, run.run_dir, results, parallel, progress, run.checks)
    except Exception as exc:  # its passes run engines: a failure there must not lose the results already written
        return TieEvidence(unmeasured=f"the noise pass failed ({type(exc).__name__}: {exc}): only exact ties")


def judge_families(judging: Judging) -> dict[str, pd.DataFrame]:
    """Every registered family's rows, each written to its table when it has any: family name -> rows."""
    tables = {}
    for family in families():
        judged = family.judge(judging)
        if judged.rows.empty:
            continue
        write_parquet(judging.run_dir / family.table, judged.rows)
        for name, frame in judged.extra.items():
            write_parquet(judging.run_dir / name, frame)
        tables[family.name] = judged.rows
    return tables


def _endings(scenario: LoadedScenario, results: list[Result], eos_ids: set[int],
             decode_ids: DecodeIds) -> dict[tuple[str, str], Ending]:
    """How each result's generation ended (harness.compare.ending), by (engine, case): read once, for every verdict."""
    cases = {c.case_id: c for c in scenario.cases}
    return {(r.engine, r.case_id): read_ending(r, cases[r.case_id].engine_params[r.engine], eos_ids, decode_ids)
            for r in results}
