"""The bodies of the engine-running CLI commands: run the data flow, print what a person needs to read.

Each takes an already loaded scenario (parsed once per command) and a Selection (the shared --engines, --case,
--allow-missing options) and returns the command's exit code or outcome.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rich.markup import escape

from harness.core.errors import EXIT_INTERRUPTED, ConfigError
from harness.render import markdown
from harness.render.console import EngineProgress, console, print_table
from harness.run.execute import Selection, execute_all
from harness.scenario.spec import LoadedScenario

if TYPE_CHECKING:
    from harness.explain.early_passes import EarlyPasses
    from harness.run.outcome import RunOutcome


def _note(kind: str, text: str) -> None:
    console.print(f"[yellow]{kind}[/] {escape(text)}", highlight=False)


def run_and_print(scenario: LoadedScenario, out: Path, selection: Selection, parallel: int | None) -> RunOutcome:
    return run_all_and_print([scenario], out, selection, parallel)[0]


class RunWatcher(Protocol):
    """Told a run's start and its engines' progress events, as they come (harness.explain.early_passes)."""

    def started(self, scenario: LoadedScenario, run_dir: Path) -> None: ...

    def event(self, label: str, event: str) -> None: ...


def run_all_and_print(scenarios: list[LoadedScenario], out: Path, selection: Selection,
                      parallel: int | None, watcher: RunWatcher | None = None) -> list[RunOutcome]:
    """Run scenarios as one matrix (harness.run.execute.execute_all) and print each one's verdicts."""
    progress = EngineProgress()

    def on_start(ran: LoadedScenario, run_dir: Path) -> None:
        console.print(f"{ran.name}: {len(ran.cases)} cases x {len(ran.spec.engines)} engines -> {run_dir}",
                      markup=False, highlight=False)
        prefix = f"{ran.name}/" if len(scenarios) > 1 else ""
        progress.start([prefix + name for name in ran.spec.engines], len(ran.cases))
        if watcher is not None:
            watcher.started(ran, run_dir)

    def event(label: str, event: str) -> None:
        progress.event(label, event)
        if watcher is not None:
            watcher.event(label, event)

    try:
        outcomes = execute_all(scenarios, out, selection, parallel, event, on_start)
    finally:
        progress.stop()
    return [print_outcome(outcome) for outcome in outcomes]


def resume_and_print(run_dir: Path, parallel: int | None) -> RunOutcome:
    from harness.run.resume import resume

    progress = EngineProgress()

    def on_start(ran: LoadedScenario, run_dir: Path, reused: int, damaged: int) -> None:
        total = len(ran.cases) * len(ran.spec.engines)
        skipped = f"; {damaged} damaged journal line(s) skipped" if damaged else ""
        console.print(f"{ran.name}: resuming {run_dir}: {reused} of {total} results reused, {total - reused} to "
                      f"run{skipped}", markup=False, highlight=False)
        progress.start(list(ran.spec.engines), len(ran.cases))

    try:
        outcome = resume(run_dir, parallel, progress.event, on_start)
    finally:
        progress.stop()
    return print_outcome(outcome)


def print_outcome(outcome: RunOutcome) -> RunOutcome:
    from harness.compare.prompt_verdicts import case_warnings
    from harness.report.summary import exposed_servers
    from harness.rundir.store import read_meta
    from harness.verdicts.family import families

    for family in families():
        if not outcome.rows(family.name).empty:
            family.print(outcome.rows(family.name), outcome.scenario.spec.reference)
    for name, warnings in outcome.warnings.items():
        for warning in warnings:
            _note("warning", f"{name}: {warning}")
    meta = read_meta(outcome.run_dir)
    for case_id, warnings in case_warnings(outcome.scenario, meta.prompt_warnings).items():
        _note("prompt", f"{case_id}: {'; '.join(warnings)}")
    for engine, by_prompt in meta.engine_prompt_warnings.items():
        for case_id, warnings in case_warnings(outcome.scenario, by_prompt).items():
            _note("prompt", f"{case_id} [{engine}]: {'; '.join(warnings)}")
    for name, reason in outcome.skipped.items():
        _note("skipped", f"{name}: {reason}")
    for cases, text in outcome.effective_differences:
        _note("effective params differ", f"({markdown.some(cases)}): {text}")
    for note in exposed_servers(read_meta(outcome.run_dir)):
        _note("exposed", note)
    state = "INTERRUPTED" if outcome.interrupted else "PASS" if outcome.exit_code == 0 else "FAIL"
    resume = f"; continue it with: parity run --resume {outcome.run_dir}" if outcome.interrupted else ""
    console.print(f"{state}: {outcome.scenario.name} (exit {outcome.exit_code}); report: "
                  f"{outcome.run_dir / 'summary.md'}{resume}", markup=False, highlight=False)
    return outcome


def explain_all_and_print(scenarios: list[LoadedScenario], out: Path, selection: Selection, k: float | None,
                          parallel: int | None, keep_traces: bool = False) -> int:
    """Run the scenarios as one matrix, then explain each one's chosen cases in turn. The engines explain traces or
    scores stay loaded from their run to their passes (harness.executors.worker_pool): no model loads twice."""
    from harness.executors.choice import kept_loaded, release_loaded
    from harness.explain.early_passes import EarlyPasses, known_cases
    from harness.run.trace_passes import explained_engines, loads_reused

    scenarios = [s.with_resolved([n for names in explained_engines(s) for n in names]) for s in scenarios]
    keys = {id(s): loads_reused(s, *explained_engines(s)) for s in scenarios}
    cases = known_cases(scenarios[0], selection.cases) if len(scenarios) == 1 else None
    early = EarlyPasses(cases, explain_parallel(parallel, scenarios[0]), keep_traces) if cases else None
    with kept_loaded(k for each in keys.values() for k in each):
        try:
            outcomes = run_all_and_print(scenarios, out, selection, parallel, early)
            codes = []
            for scenario, outcome in zip(scenarios, outcomes, strict=True):
                if outcome.interrupted:
                    return EXIT_INTERRUPTED
                codes.append(explain_and_print(outcome, selection, k, parallel, len(outcomes) > 1, keep_traces,
                                               early))
                release_loaded(keys[id(scenario)])
                if codes[-1] == EXIT_INTERRUPTED:
                    return EXIT_INTERRUPTED
            return max(codes)
        finally:
            if early is not None:
                early.close()


def explain_parallel(parallel: int | None, scenario: LoadedScenario) -> int:
    """The engines explain's passes run at once: --parallel, else as many as the machine's cores hold."""
    return parallel or max(1, (os.cpu_count() or 1) // scenario.spec.threads)


def explain_and_print(outcome: RunOutcome, selection: Selection, k: float | None, parallel: int | None,
                      named: bool, keep_traces: bool = False, early: EarlyPasses | None = None) -> int:
    """Explain one finished run's chosen cases (named: its lines say which scenario they are about)."""
    from harness.explain.beam_runs import explain_beams, explanation_lines, split_cases
    from harness.explain.localisation_report import localisation_lines
    from harness.explain.orchestrate import choose_cases, explain_run

    title = f"explain {outcome.scenario.name}" if named else "explain"
    beam_ids, token_ids = split_cases(outcome, choose_cases(outcome, selection.cases))
    if beam_ids:
        with console.status(f"{title}: each engine's beam-search loop on the reference model's numbers, "
                            f"{len(beam_ids)} case(s)"):
            beams = explain_beams(outcome, beam_ids)
        for note in beams.notes:
            _note("note", note)
        for explanation in beams.explanations:
            for line in explanation_lines(explanation):
                console.print(line, highlight=False, markup=False)
        console.print(f"{title}: {beams.path}", highlight=False, markup=False)
        if not token_ids:
            return outcome.exit_code
    progress = EngineProgress()

    def on_start(names: list[str], cases: list[str]) -> None:
        console.print(f"{title}: tracing {len(cases)} case(s) in {', '.join(names)}", markup=False, highlight=False)
        progress.start(names, len(cases))

    try:
        result = explain_run(outcome, token_ids, k, explain_parallel(parallel, outcome.scenario), progress.event,
                             on_start, keep_traces, early)
    finally:
        progress.stop()
    for note in result.notes:
        _note("note", note)
    for loc in result.localisations:
        for line in localisation_lines(loc.model_dump()):
            console.print(line, highlight=False, markup=False)
    console.print(f"{title}: {result.explain_dir / 'summary.md'}", highlight=False, markup=False)
    return EXIT_INTERRUPTED if result.interrupted else outcome.exit_code


def transplant_and_print(scenario: LoadedScenario, out: Path, selection: Selection) -> int:
    """Only the reference generates; every selected engine's sampling code runs on its logits (an engine whose
    package is missing from its interpreter stops the command, or is skipped with --allow-missing)."""
    from harness.compare.beam_rules import beam_cases
    from harness.executors.choice import kept_loaded
    from harness.plan.plans import select_engines, unavailable_engines
    from harness.semantics import effective
    from harness.transplant.sampler_swap import transplant_run

    chosen = scenario.with_cases(selection.cases)
    searched = beam_cases(chosen)
    if searched:
        raise ConfigError(f"{scenario.path}: case(s) {', '.join(searched)} decode by beam search, which transplant "
                          "does not compare (it runs samplers step by step): use `parity explain` for beams, or "
                          "pick other cases with --case")
    names = select_engines(chosen, selection.engines)
    skipped = unavailable_engines(chosen, names, selection.allow_missing, device=False)
    names = [n for n in names if n not in skipped]
    rejected = effective.rejections(chosen, names)
    reference_only = Selection(engines=[scenario.spec.reference], cases=selection.cases)
    scenario = scenario.with_resolved([scenario.spec.reference])  # for its run and its logits pass
    chosen = scenario.with_cases(selection.cases)
    with kept_loaded([scenario.engine(scenario.spec.reference).load_key]):  # from its run to its logits pass
        outcome = run_and_print(scenario, out, reference_only, None)
        if outcome.interrupted:
            return EXIT_INTERRUPTED
        progress = EngineProgress()
        progress.start([scenario.spec.reference], len(outcome.scenario.cases))
        try:
            result = transplant_run(outcome, chosen, names, rejected, progress.event)
        finally:
            progress.stop()
    for name, reason in skipped.items():
        _note("skipped", f"{name}: {reason}")
    for verdict in result.verdicts:
        console.print(f"{verdict.case_id} [{verdict.engine} vs {verdict.reference}]: {verdict.cause}", markup=False,
                      highlight=False)
        console.print(f"  {verdict.verdict}", markup=False, highlight=False)
    console.print(f"transplant: {result.out_dir / 'verdicts.json'}", highlight=False, markup=False)
    if result.interrupted:
        return EXIT_INTERRUPTED
    return 0 if all(v.cause == "agree" for v in result.verdicts) else 1


def params_and_print(scenario: LoadedScenario, selection: Selection, all_rows: bool) -> int:
    from harness import models
    from harness.plan.plans import select_engines, unavailable_engines
    from harness.semantics import agents, effective, logprobs

    names = select_engines(scenario, selection.engines, need_reference=False)
    skipped = unavailable_engines(scenario, names, selection.allow_missing, need_reference=False, device=False)
    names = [n for n in names if n not in skipped]
    with console.status("running each engine's sampling code"):
        table = effective.compute(scenario, names)
    rejected = False
    for cases, by_engine in effective.case_groups(scenario, names, table):
        headers = ["param", *[f"{n} ({scenario.spec.engines[n].engine})" for n in names], "differs"]
        rows = [[field, *values, "DIFFERS" if differs else ""]
                for field, values, differs in effective.table_rows(by_engine, all_rows)]
        styles = [[""] * (len(headers) - 1) + ["bold red"] for _ in rows]
        print_table(f"effective params: {scenario.name}, case(s) {', '.join(cases)}", headers, rows, styles)
        for name, e in by_engine.items():
            for note in e.notes:
                console.print(f"  {name}: {note}", highlight=False, markup=False)
        rejected |= any(e.rejected for e in by_engine.values())
    print_table(f"what each engine returns as a logprob: {scenario.name}", logprobs.HEADERS,
                logprobs.rows(scenario, names))
    if agents.wanted(scenario):
        print_table(f"agent requests: {scenario.name}", agents.HEADERS, agents.rows(scenario, names))
    for name in names:  # the weights an engine runs where they are not the model folder's (a GGUF's real types)
        spec = scenario.spec
        model_path = models.resolve(spec.engine_model(name), spec.engine_dtype(name), str(scenario.path))
        weights = scenario.description(name).weights_note(model_path, scenario.spec.engines[name].options)
        if weights:
            console.print(f"  {name}: weights {weights}", highlight=False, markup=False)
    for name, reason in skipped.items():
        _note("skipped", f"{name}: {reason}")
    return 2 if rejected else 0


def gate_and_print(scenarios: list[LoadedScenario], baseline: Path, out: Path, selection: Selection,
                   parallel: int | None, junit: Path | None, summary: Path | None) -> int:
    from harness.compare import baseline as baselines
    from harness.compare.gate import DEFAULT_LOGPROB_TOLERANCE, invariance_cases, judge_run, out_of_expectation
    from harness.report.ci import write_outputs
    from harness.verdicts.family import families

    for scenario in scenarios:  # a missing baseline is a config error before anything runs
        baselines.load(baseline, scenario.name, f"{scenario.path}: name")
    cases = []
    outcomes = run_all_and_print(scenarios, out, selection, parallel)
    if any(outcome.interrupted for outcome in outcomes):
        return EXIT_INTERRUPTED
    per_case = [family.name for family in families() if family.per_case]
    for scenario, outcome in zip(scenarios, outcomes, strict=True):
        unexpected = out_of_expectation([outcome.rows(name) for name in per_case])
        tolerances = {name: scenario.spec.engine_expectation(name).max_logprob_delta or DEFAULT_LOGPROB_TOLERANCE
                      for name in scenario.spec.engines}
        cases += judge_run(outcome.run_dir, baseline, unexpected, tolerances)
        cases += invariance_cases(scenario.name, outcome.invariance)
    for line in write_outputs(cases, junit, summary):
        print(line)
    failed = [c for c in cases if not c.passed]
    for case in failed:
        console.print(f"REGRESSION {case.scenario} {case.case_id} [{case.engine}]: {'; '.join(case.failures)}",
                      style="red", highlight=False, markup=False)
    console.print(f"gate: {'FAIL' if failed else 'PASS'} ({len(cases) - len(failed)}/{len(cases)} case results "
                  f"passed)", highlight=False)
    return 1 if failed else 0


def plan_and_print(scenarios: list[LoadedScenario], plan_file: Path, selection: Selection) -> int:
    """`parity run --plan`: the actors of a matrix, their resources and a schedule on the plan file's cluster."""
    from harness.plan.matrix import actors, nodes_of, read_plan_file, schedule

    plan = read_plan_file(plan_file)
    nodes = nodes_of(plan)
    placements = schedule(actors(scenarios, selection.engines, plan.costs, plan_file), nodes, plan_file)
    print_table(f"{len(placements)} actors", ["scenario", "actor", "engine", "model", "resources", "requests",
                                              "tokens", "estimated"],
                [[p.actor.scenario, p.actor.name, p.actor.engine, p.actor.model, str(p.actor.resources),
                  str(p.actor.requests), str(p.actor.tokens), _duration(p.actor.seconds)]
                 for p in sorted(placements, key=lambda p: (p.actor.scenario, p.actor.name))])
    print_table(f"schedule on {len(nodes)} nodes", ["node", "actor", "start", "end"],
                [[p.node, f"{p.actor.scenario}/{p.actor.name}", _duration(p.start), _duration(p.end)]
                 for p in placements])
    wall = max(p.end for p in placements)
    work = sum(p.actor.seconds for p in placements)
    gpu_total = sum(n.get("GPU", 0.0) for n in nodes.values()) * wall
    gpu_used = sum(p.actor.resources.gpus * p.actor.seconds for p in placements)
    busy = f"; GPUs busy {gpu_used / gpu_total:.0%} of that time" if gpu_total else ""
    longest = max(placements, key=lambda p: p.actor.seconds).actor
    console.print(f"estimated wall time {_duration(wall)} on {len(nodes)} nodes (one actor at a time: "
                  f"{_duration(work)}; longest actor {longest.scenario}/{longest.name}: "
                  f"{_duration(longest.seconds)}){busy}; costs from {plan_file}", highlight=False, markup=False)
    return 0


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def engines_and_print() -> None:
    from adapters import registry
    from harness.report.sections import SECTIONS
    from harness.verdicts.family import FAMILIES

    rows, styles = [], []
    for name, description in registry.descriptions().items():
        requirement = description.requirement
        reason = registry.check_available(name)
        installed = registry.installed_version(requirement) or "-"
        pinned = registry.pinned_version(requirement) or "any"
        caps = description.capabilities
        can = [c for c, on in (("logprobs", caps.logprobs), ("traces", caps.traces), ("samples", caps.samples),
                               ("beam search", caps.beam_search), ("server", caps.server),
                               ("teacher-forced scores", caps.scores),
                               ("sampling code", description.sampling is not None)) if on]
        rows.append([name, "yes" if reason is None else f"no: {reason}",
                     f"{requirement.distribution} {installed} (pinned {pinned})", ", ".join(can),
                     ", ".join(caps.dtypes), description.summary])
        styles.append(["", "green" if reason is None else "red", "", "", "", ""])
    for plugin in registry.broken_plugins():
        rows.append([plugin.name, f"no: plugin {plugin.target} did not load: {plugin.error}", "-", "", "", ""])
        styles.append(["", "red", "", "", "", ""])
    print_table("engines", ["engine", "available", "package", "can", "dtypes", "description"], rows, styles)
    for problem in [*FAMILIES.problems(), *SECTIONS.problems()]:  # plug-ins of the other kinds that did not load
        _note("plug-in not used", problem)


def prepare_engine_files(name: str, build: bool) -> list[tuple[str, str]]:
    """The engines' own files for a named model (an engine description's `prepare`, e.g. llama.cpp's GGUF variants),
    built once from its float32 folder by every engine installed here (build), or left for their first use: (engine,
    what is there or will be, or why not)."""
    from adapters import registry
    from harness import models

    out = []
    for engine, description in registry.descriptions().items():
        if description.prepare is None:
            continue
        missing = registry.check_available(engine, device=False)
        out.append((engine, f"not built ({missing})" if missing else
                    description.prepare(models.MODELS[name].folder("float32"), build)))
    return out


def left_for_first_use() -> str:
    """What a bare `parity models prepare` leaves to first use, in one line: the on-demand models not prepared yet
    (those that take seconds together, any costlier one with its cost) and how many others already are."""
    from harness import models

    on_demand = [(name, m) for name, m in models.MODELS.items() if m.on_demand]
    waiting = [(name, m.cost) for name, m in on_demand if not m.prepared()]
    quick = [name for name, cost in waiting if cost == "seconds"]
    parts = ([f"{', '.join(quick)} (seconds each)"] if quick else []) + \
        [f"{name} ({cost})" for name, cost in waiting if cost != "seconds"]
    ready = len(on_demand) - len(waiting)
    already = f"; {ready} more already prepared (`parity models list`)" if ready else ""
    if not waiting:
        return f"every on-demand model is already prepared ({ready}: `parity models list`)"
    return f"on first use, or now with `parity models prepare NAME`: {'; '.join(parts)}{already}"
