"""`parity run`: scenario -> workers -> results -> verdicts -> run directory."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import models
from harness.compare.beams import judge_all
from harness.compare.ending import as_compared, ended_by
from harness.compare.verdicts import judge
from harness.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_PARITY
from harness.report.summary import write_summary
from harness.run import drift, executors, invariance
from harness.run.executor import EngineOutcome, Progress, run_plans
from harness.run.journal import read_engine_info, still_to_run
from harness.run.plan import EnginePlan, ModelResolver, engine_plan, plan_resources, select_engines, unavailable_engines
from harness.run.store import (
    EngineMeta,
    RunMeta,
    RunSelection,
    beams_frame,
    new_run_dir,
    results_frame,
    run_lock,
    steps_frame,
    write_meta,
    write_parquet,
)
from harness.scenario.prompts import PromptTokenizer, load_tokenizer, tokenize_prompts
from harness.scenario.spec import LoadedScenario
from harness.scenario.vocabulary import SamplingParams
from harness.semantics import effective
from harness.semantics.sampling_parity import judge_samples
from harness.types import Request, Result


@dataclass(frozen=True)
class Selection:
    """What a command runs of a scenario: some engines (--engines), some cases (--case), and whether engines that
    cannot run here are skipped (--allow-missing) rather than stopping the command."""

    engines: list[str] | None = None
    cases: list[str] | None = None
    allow_missing: bool = False


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


def plan_engines(scenario: LoadedScenario, run_dir: Path, prompt_ids: dict[str, list[int]],
                 resolve: ModelResolver = models.resolve) -> list[EnginePlan]:
    spec = scenario.spec
    check = spec.sampling
    return [engine_plan(scenario, name, run_dir, [
        Request(case_id=c.case_id, prompt_ids=prompt_ids[c.prompt.id],
                params=_sample_params(c.engine_params[name], check), top_logprobs=spec.top_logprobs,
                text=c.prompt.text, messages=c.prompt.messages, num_samples=check.samples if check else 1)
        for c in scenario.cases], resolve=resolve) for name in spec.engines]


def all_plans(scenario: LoadedScenario, run_dir: Path, prompt_ids: dict[str, list[int]],
              tokenizer: PromptTokenizer) -> tuple[list[EnginePlan], list[invariance.Check]]:
    """Every engine's plan, with the invariance checks' extra requests and engine configurations."""
    return invariance.plan(scenario, plan_engines(scenario, run_dir, prompt_ids), run_dir,
                           tokenizer.encode(invariance.SHARED_PREFIX))


def _sample_params(params: SamplingParams, check) -> SamplingParams:
    """For a sampling-parity run only the first `steps` tokens of each sample are drawn."""
    return params.model_copy(update={"max_new_tokens": check.steps}) if check else params


def machine_info() -> dict:
    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0]}


def engine_meta(plan: EnginePlan, outcome: EngineOutcome) -> EngineMeta:
    timings = [r.timings for r in outcome.results.values()]
    phases = {**outcome.phases, "generate_s": sum(t.get("generate_s", 0.0) for t in timings),
              "effective_s": sum(t.get("effective_s", 0.0) for t in timings)}
    return EngineMeta(engine=plan.engine, dtype=plan.dtype, threads=plan.threads, options=plan.setup.options,
                      env={"OMP_NUM_THREADS": str(plan.threads), "OMP_WAIT_POLICY": "passive"},
                      python=plan.python or sys.executable, model_path=str(plan.setup.model_path),
                      versions=outcome.versions, load_s=outcome.load_s, worker_pids=outcome.worker_pids,
                      restarts=outcome.restarts, phases=phases)


def runnable(scenario: LoadedScenario, selection: Selection,
             need_reference: bool = True) -> tuple[LoadedScenario, dict[str, str]]:
    """The scenario narrowed to the selected cases and to the selected engines that can run here, and the engines
    skipped (--allow-missing) with why. Params an engine would reject stop everything first (exit 2)."""
    scenario = scenario.with_cases(selection.cases)
    names = select_engines(scenario, selection.engines, need_reference)
    effective.preflight(scenario, names)
    skipped = unavailable_engines(scenario, names, selection.allow_missing, need_reference)
    return scenario.with_engines([n for n in names if n not in skipped]), skipped


def tokenized(scenario: LoadedScenario) -> tuple[PromptTokenizer, dict[str, list[int]]]:
    """The reference's tokenizer and every case's prompt token ids (the same ids go to every engine)."""
    spec = scenario.spec
    tokenizer = load_tokenizer(models.resolve(spec.model, spec.engine_dtype(spec.reference), str(scenario.path)))
    return tokenizer, tokenize_prompts(tokenizer, list({c.prompt.id: c.prompt for c in scenario.cases}.values()))


def execute(scenario: LoadedScenario, out_root: Path, selection: Selection, parallel: int | None,
            progress: Progress, on_start: Callable[[LoadedScenario, Path], None]) -> RunOutcome:
    return execute_all([scenario], out_root, selection, parallel, progress, on_start)[0]


def execute_all(scenarios: list[LoadedScenario], out_root: Path, selection: Selection, parallel: int | None,
                progress: Progress, on_start: Callable[[LoadedScenario, Path], None]) -> list[RunOutcome]:
    """Several scenarios as one matrix: every engine run of every scenario goes to the executor at once (on a Ray
    cluster they run side by side as resources allow), then each scenario's run directory is judged and written
    as a run of it alone would be. Every scenario is checked (engines, params, prompts) before any run starts."""
    prepare_started = time.perf_counter()
    ready = []
    for scenario in scenarios:
        scenario, skipped = runnable(scenario, selection)
        executors.current().check({name: plan_resources(scenario, name) for name in scenario.spec.engines})
        ready.append((scenario, skipped, *tokenized(scenario)))
    with ExitStack() as locks:
        pending = []
        for scenario, skipped, tokenizer, prompt_ids in ready:
            run_dir = new_run_dir(out_root, scenario.name)
            meta = RunMeta(run_id=run_dir.name, scenario=str(scenario.path.resolve()), scenario_name=scenario.name,
                           scenario_text=scenario.path.read_text(), model=scenario.spec.model,
                           reference=scenario.spec.reference, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           machine=machine_info(), prompt_ids=prompt_ids, skipped=skipped,
                           selection=RunSelection(engines=list(scenario.spec.engines), cases=selection.cases,
                                                  allow_missing=selection.allow_missing))
            locks.enter_context(run_lock(run_dir))
            write_meta(run_dir, meta)
            on_start(scenario, run_dir)
            pending.append(pending_run(scenario, run_dir, meta, tokenizer, {}, prepare_started))
        return run_pending(pending, parallel, progress)


@dataclass
class PendingRun:
    """A run whose directory and plans exist and whose engines have not run yet (or only partly: --resume)."""

    scenario: LoadedScenario
    run_dir: Path
    meta: RunMeta
    tokenizer: PromptTokenizer
    done: dict[tuple[str, str], Result]  # results already in hand (a resumed run's journals)
    plans: list[EnginePlan]
    checks: list[invariance.Check]
    prepare_started: float


def pending_run(scenario: LoadedScenario, run_dir: Path, meta: RunMeta, tokenizer: PromptTokenizer,
                done: dict[tuple[str, str], Result], prepare_started: float) -> PendingRun:
    plans, checks = all_plans(scenario, run_dir, meta.prompt_ids, tokenizer)
    return PendingRun(scenario, run_dir, meta, tokenizer, done, plans, checks, prepare_started)


def run_pending(pending: list[PendingRun], parallel: int | None, progress: Progress) -> list[RunOutcome]:
    """Run every (engine, case) of the runs without a result in their `done`, on the current executor all at once,
    then judge each run and write its directory."""
    to_run = [(run, plan) for run in pending for plan in still_to_run(run.plans, run.done)]
    labels = [plan.name if len(pending) == 1 else f"{run.scenario.name}/{plan.name}" for run, plan in to_run]
    started = time.perf_counter()
    outcomes, interrupted = run_plans([plan for _, plan in to_run], parallel, progress, labels)
    wall = time.perf_counter() - started
    by_run: dict[int, dict[str, EngineOutcome]] = {id(run): {} for run in pending}
    for (run, plan), outcome in zip(to_run, outcomes, strict=True):
        by_run[id(run)][plan.name] = outcome
    return [_finish(run, by_run[id(run)], interrupted, started - run.prepare_started, wall, parallel, progress)
            for run in pending]


def _finish(run: PendingRun, outcomes: dict[str, EngineOutcome], interrupted: bool, prepare_s: float, wall: float,
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
    knob_rows = pd.DataFrame([row.model_dump() for row in invariance.judge(scenario, run.checks, results, decode)])
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
