"""`parity run`: scenario -> workers -> results -> verdicts -> run directory."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.types import Result
from harness.executors import choice
from harness.executors.engine_runs import EngineOutcome, Progress, run_plans
from harness.plan.plans import plan_resources, select_engines, unavailable_engines
from harness.plan.requests import all_plans, still_to_run
from harness.run.outcome import PendingRun
from harness.rundir.store import RunMeta, RunSelection, new_run_dir, run_lock, write_meta
from harness.scenario.prompt_identity import check_engine_prompts, check_prompts
from harness.scenario.prompts import PromptTokenizer, load_tokenizer, tokenize_prompts
from harness.scenario.resolved import ModelResolver
from harness.scenario.spec import LoadedScenario
from harness.semantics import effective

if TYPE_CHECKING:
    from harness.run.outcome import RunOutcome


@dataclass(frozen=True)
class Selection:
    """What a command runs of a scenario: some engines (--engines), some cases (--case), and whether engines that
    cannot run here are skipped (--allow-missing) rather than stopping the command."""

    engines: list[str] | None = None
    cases: list[str] | None = None
    allow_missing: bool = False


def machine_info() -> dict:
    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0]}


def runnable(scenario: LoadedScenario, selection: Selection, need_reference: bool = True,
             resolve: ModelResolver | None = None) -> tuple[LoadedScenario, dict[str, str]]:
    """The scenario narrowed to the selected cases and to the selected engines that can run here, each of them
    resolved once (its model's folder, adapter and load key; resolve: how a model value becomes a folder), and the
    engines skipped (--allow-missing) with why. Params an engine would reject stop everything first (exit 2)."""
    scenario = scenario.with_cases(selection.cases)
    names = select_engines(scenario, selection.engines, need_reference)
    effective.preflight(scenario, names)
    skipped = unavailable_engines(scenario, names, selection.allow_missing, need_reference)
    return scenario.with_engines([n for n in names if n not in skipped]).with_resolved(resolve=resolve), skipped


@dataclass(frozen=True)
class Tokenized:
    """The reference's tokenizer, every case's prompt token ids (the same ids go to every engine) and what is off
    about any prompt's ids (harness.scenario.prompt_identity): for every engine, and for an engine's own model file."""

    tokenizer: PromptTokenizer
    prompt_ids: dict[str, list[int]]
    warnings: dict[str, list[str]]
    engine_warnings: dict[str, dict[str, list[str]]]


def tokenized(scenario: LoadedScenario) -> Tokenized:
    tokenizer = load_tokenizer(scenario.engine(scenario.spec.reference).model_folder)
    prompts = list({c.prompt.id: c.prompt for c in scenario.cases}.values())
    spec = scenario.spec
    ids = tokenize_prompts(tokenizer, prompts, str(scenario.path), spec.tool_dicts(), spec.template_kwargs)
    return Tokenized(tokenizer, ids, check_prompts(tokenizer, prompts, ids), check_engine_prompts(scenario, prompts,
                                                                                                  ids))


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
        choice.current().check({name: plan_resources(scenario, name) for name in scenario.spec.engines})
        ready.append((scenario, skipped, tokenized(scenario)))
    with ExitStack() as locks:
        pending = []
        for scenario, skipped, prompts in ready:
            run_dir = new_run_dir(out_root, scenario.name)
            meta = RunMeta(run_id=run_dir.name, scenario=str(scenario.path.resolve()), scenario_name=scenario.name,
                           scenario_text=scenario.path.read_text(), model=scenario.spec.model,
                           reference=scenario.spec.reference, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           machine=machine_info(), prompt_ids=prompts.prompt_ids, prompt_warnings=prompts.warnings,
                           engine_prompt_warnings=prompts.engine_warnings, skipped=skipped,
                           selection=RunSelection(engines=list(scenario.spec.engines), cases=selection.cases,
                                                  allow_missing=selection.allow_missing))
            locks.enter_context(run_lock(run_dir))
            write_meta(run_dir, meta)
            on_start(scenario, run_dir)
            pending.append(pending_run(scenario, run_dir, meta, prompts.tokenizer, {}, prepare_started))
        return run_pending(pending, parallel, progress)


def pending_run(scenario: LoadedScenario, run_dir: Path, meta: RunMeta, tokenizer: PromptTokenizer,
                done: dict[tuple[str, str], Result], prepare_started: float) -> PendingRun:
    plans, checks = all_plans(scenario, run_dir, meta.prompt_ids, tokenizer)
    return PendingRun(scenario, run_dir, meta, tokenizer, done, plans, checks, prepare_started)


class JudgingCode:
    """Loads harness.run.finish (pandas, pyarrow, the verdict rules: about half a second) in a thread once every
    engine has started (ready, or ended), while they generate: neither the engines' start nor the end of the run
    waits for it. Passes the engines' progress events on."""

    def __init__(self, labels: list[str], progress: Progress):
        self.starting, self.progress = set(labels), progress
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def event(self, label: str, event: str) -> None:
        self.progress(label, event)
        with self.lock:
            if event != "loading":
                self.starting.discard(label)
            if not self.starting and self.thread is None:
                self.thread = threading.Thread(target=self._load, daemon=True, name="load judging code")
                self.thread.start()

    @staticmethod
    def _load() -> None:
        with contextlib.suppress(Exception):  # an import error is raised again, in the main thread, by loaded()
            importlib.import_module("harness.run.finish")

    def loaded(self) -> Callable[..., RunOutcome]:
        with self.lock:
            thread = self.thread
        if thread is not None:
            thread.join()
        from harness.run.finish import finish

        return finish


def run_pending(pending: list[PendingRun], parallel: int | None, progress: Progress) -> list[RunOutcome]:
    """Run every (engine, case) of the runs without a result in their `done`, on the current executor all at once,
    then judge each run and write its directory."""
    to_run = [(run, plan) for run in pending for plan in still_to_run(run.plans, run.done)]
    labels = [plan.name if len(pending) == 1 else f"{run.scenario.name}/{plan.name}" for run, plan in to_run]
    started = time.perf_counter()
    judging = JudgingCode(labels, progress)
    with choice.kept_loaded(key for run in pending for key in _drift_keys(run.scenario)):
        outcomes, interrupted = run_plans([plan for _, plan in to_run], parallel, judging.event, labels)
        finish = judging.loaded()

        wall = time.perf_counter() - started
        by_run: dict[int, dict[str, EngineOutcome]] = {id(run): {} for run in pending}
        for (run, plan), outcome in zip(to_run, outcomes, strict=True):
            by_run[id(run)][plan.name] = outcome
        return [finish(run, by_run[id(run)], interrupted, started - run.prepare_started, wall, parallel, progress)
                for run in pending]


def _drift_keys(scenario: LoadedScenario) -> list[tuple]:
    """The configurations the drift verdicts' logits passes run after the run, once per pass (harness.run.
    drift_passes: each drifting engine on its baseline's texts, each baseline on its own): they stay loaded from
    their run to those passes."""
    spec = scenario.spec
    pairs = {n: spec.drift_baseline(n) for n in spec.engines if spec.drift_baseline(n) in spec.engines}
    passes = dict.fromkeys([(b, b) for b in pairs.values()] + list(pairs.items()))
    return [scenario.engine(engine).load_key for engine, _ in passes]
