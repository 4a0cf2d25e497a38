"""`parity run`: scenario -> workers -> results -> verdicts -> run directory."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from adapters import registry
from harness import effective, models
from harness.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_PARITY, ConfigError, EngineUnavailable
from harness.prompts import load_tokenizer, tokenize_prompts
from harness.runner import EnginePlan, EngineOutcome, run_engines
from harness.scenario import LoadedScenario, load
from harness.store import new_run_dir, results_frame, steps_frame, write_json, write_parquet
from harness.summary import write_summary
from harness.sampling_parity import judge_samples
from harness.types import Request, SamplingParams
from harness.verdicts import judge


@dataclass
class RunOutcome:
    scenario: LoadedScenario
    run_dir: Path
    verdicts: pd.DataFrame
    warnings: dict[str, list[str]]
    exit_code: int
    interrupted: bool
    effective_differences: list[tuple[list[str], str]]
    skipped: dict[str, str]  # engine -> why it could not run here (--allow-missing)


def select_engines(scenario: LoadedScenario, only: list[str] | None, need_reference: bool = True) -> list[str]:
    names = list(scenario.spec.engines)
    if not only:
        return names
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"--engines: {unknown} not in {scenario.path} (engines there: {', '.join(names)})")
    if need_reference and scenario.spec.reference not in only:
        raise ConfigError(f"--engines: must include the reference engine '{scenario.spec.reference}'")
    return [n for n in names if n in only]


def unavailable_engines(scenario: LoadedScenario, names: list[str], allow_missing: bool) -> dict[str, str]:
    """Engines that cannot run here, with why. Without allow_missing the first one stops the run (exit 3); with it
    they are skipped and the report says so; the reference can never be skipped."""
    missing = {}
    for name in names:
        spec = scenario.spec.engines[name]
        reason = registry.check_available(spec.engine, spec.python, spec.options)
        if reason and (not allow_missing or name == scenario.spec.reference):
            raise EngineUnavailable(reason + ("" if allow_missing else " (or pass --allow-missing to skip it)"))
        if reason:
            missing[name] = reason
    return missing


def engine_plan(scenario: LoadedScenario, name: str, run_dir: Path, requests: list, op: str = "generate",
                dtype: str | None = None, plan_name: str | None = None) -> EnginePlan:
    """The plan for one engine of a scenario; dtype and plan_name override the scenario's (a noise-floor run)."""
    spec, engine = scenario.spec, scenario.spec.engines[name]
    dtype = dtype or spec.engine_dtype(name)
    plan_name = plan_name or name
    return EnginePlan(
        name=plan_name, engine=engine.engine, model_path=models.resolve(spec.model, dtype, str(scenario.path)),
        dtype=dtype, options=engine.options, python=engine.python, threads=spec.engine_threads(name),
        batch_size=engine.batch_size, requests=requests, workdir=run_dir / "engines" / plan_name,
        load_timeout=spec.engine_timeouts(name).load, case_timeout=spec.engine_timeouts(name).case, op=op,
        import_paths=[str(scenario.path.parent.resolve())])


def plan_engines(scenario: LoadedScenario, names: list[str], run_dir: Path,
                 prompt_ids: dict[str, list[int]]) -> list[EnginePlan]:
    spec = scenario.spec
    check = spec.sampling
    return [engine_plan(scenario, name, run_dir, [
        Request(c.case_id, prompt_ids[c.prompt.id], _sample_params(c.engine_params[name], check), spec.top_logprobs,
                c.prompt.text, c.prompt.messages, check.samples if check else 1) for c in scenario.cases])
        for name in names]


def _sample_params(params: SamplingParams, check) -> SamplingParams:
    """For a sampling-parity run only the first `steps` tokens of each sample are drawn."""
    return params.model_copy(update={"max_new_tokens": check.steps}) if check else params


def machine_info() -> dict:
    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0]}


def engine_meta(plan: EnginePlan, outcome: EngineOutcome) -> dict:
    return {"engine": plan.engine, "dtype": plan.dtype, "threads": plan.threads, "options": plan.options,
            "env": {"OMP_NUM_THREADS": str(plan.threads), "OMP_WAIT_POLICY": "passive"},
            "python": plan.python or sys.executable, "model_path": str(plan.model_path),
            "versions": outcome.versions, "load_s": outcome.load_s, "worker_pids": outcome.worker_pids,
            "restarts": outcome.restarts}


def select_cases(scenario: LoadedScenario, only: list[str] | None) -> None:
    """Keep only the named cases (parity explain --case)."""
    if not only:
        return
    known = [c.case_id for c in scenario.cases]
    unknown = [c for c in only if c not in known]
    if unknown:
        raise ConfigError(f"--case: {unknown} not in {scenario.path} (cases: {', '.join(known)})")
    scenario.cases = [c for c in scenario.cases if c.case_id in only]


def execute(path: Path, out_root: Path, only: list[str] | None, parallel: int | None,
            progress: Callable[[str, str], None], on_start: Callable[[LoadedScenario, list[str], Path], None],
            cases: list[str] | None = None, allow_missing: bool = False) -> RunOutcome:
    scenario = load(path)
    select_cases(scenario, cases)
    names = select_engines(scenario, only)
    effective.preflight(scenario, names)
    skipped = unavailable_engines(scenario, names, allow_missing)
    names = [n for n in names if n not in skipped]
    only = names if skipped else only
    ref_path = models.resolve(scenario.spec.model, scenario.spec.engine_dtype(scenario.spec.reference), str(path))
    prompts = {c.prompt.id: c.prompt for c in scenario.cases}
    tokenizer = load_tokenizer(ref_path)
    prompt_ids = tokenize_prompts(tokenizer, list(prompts.values()))
    run_dir = new_run_dir(out_root, scenario.name)
    plans = plan_engines(scenario, names, run_dir, prompt_ids)
    meta = {"run_id": run_dir.name, "scenario": str(path), "scenario_name": scenario.name,
            "scenario_text": path.read_text(), "model": scenario.spec.model, "reference": scenario.spec.reference,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
            "prompt_ids": prompt_ids, "status": "running", "skipped": skipped}
    write_json(run_dir / "run.json", meta)
    on_start(scenario, names, run_dir)

    started = time.perf_counter()
    threads_needed = max(p.threads for p in plans)
    outcomes, interrupted = run_engines(plans, parallel or max(1, (os.cpu_count() or 1) // threads_needed), progress)
    wall = time.perf_counter() - started

    if only:
        scenario.spec.engines = {n: scenario.spec.engines[n] for n in names}
    results = {(name, case_id): result for name, o in outcomes.items() for case_id, result in o.results.items()}
    decode = lambda t: tokenizer.decode([t])  # noqa: E731
    judged = judge_samples if scenario.spec.sampling else judge
    verdicts = pd.DataFrame() if interrupted and not results else judged(scenario, results, decode)
    ordered = [results[(n, c.case_id)] for n in names for c in scenario.cases if (n, c.case_id) in results]
    params = {(n, c.case_id): c.engine_params[n].model_dump_json(exclude_none=True)
              for n in names for c in scenario.cases}
    write_parquet(run_dir / "results.parquet", results_frame(ordered, params))
    write_parquet(run_dir / "steps.parquet", steps_frame(ordered))
    if not verdicts.empty:
        write_parquet(run_dir / "verdicts.parquet", verdicts)
    warnings = {n: sorted({w for r in ordered if r.engine == n for w in r.warnings}) for n in names}
    all_expected = verdicts.empty or bool(verdicts["expected"].all())  # no verdicts: only the reference ran
    exit_code = EXIT_INTERRUPTED if interrupted else EXIT_OK if all_expected else EXIT_PARITY
    meta.update(status="interrupted" if interrupted else "finished", wall_s=wall, exit_code=exit_code,
                engines={p.name: engine_meta(p, outcomes[p.name]) for p in plans}, warnings=warnings,
                effective_differences=effective.run_differences(names, ordered),
                finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    write_json(run_dir / "run.json", meta)
    write_summary(run_dir / "summary.md", meta, verdicts)
    return RunOutcome(scenario, run_dir, verdicts, warnings, exit_code, interrupted, meta["effective_differences"],
                      skipped)


