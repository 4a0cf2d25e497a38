"""The `parity` command line. Heavy modules (pandas, torch, engines) are imported inside commands only."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from harness.errors import EXIT_INTERRUPTED, ParityError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Differential testing of LLM inference engines. Exit codes: 0 all cases as expected, "
                       "1 a case out of expectation, 2 usage or config error, 3 engine unavailable, 130 interrupted.")
models_app = typer.Typer(no_args_is_help=True, help="Named models: prepare (convert once) and list.")
app.add_typer(models_app, name="models")
console = Console()
err_console = Console(stderr=True)


def cli_errors(command):
    """Turn ParityError into a one-line message and its exit code; never a traceback for bad input."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ParityError as exc:
            err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code)
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED)

    return wrapper


ScenarioPaths = Annotated[list[Path], typer.Argument(help="scenario YAML file(s)", show_default=False)]


@app.command()
@cli_errors
def validate(scenarios: ScenarioPaths) -> None:
    """Check scenario files without running anything; exit 2 with file:line on the first problem."""
    from harness.scenario import load

    for path in scenarios:
        loaded = load(path)
        console.print(f"{path}: ok ({len(loaded.cases)} cases x {len(loaded.spec.engines)} engines, "
                      f"reference {loaded.spec.reference})")


@app.command()
@cli_errors
def run(scenarios: ScenarioPaths,
        engines: Annotated[Optional[str], typer.Option(help="comma-separated engine names to run "
                                                            "(the reference is required)")] = None,
        out: Annotated[Path, typer.Option(help="where run directories are written")] = Path("reports"),
        parallel: Annotated[Optional[int], typer.Option(help="engines run at once "
                                                             "(default: cores / threads per engine)")] = None,
        allow_missing: Annotated[bool, typer.Option(help="skip engines that cannot run here (missing package, no "
                                                         "CUDA) instead of exiting 3; the report lists them")] = False,
        ) -> None:
    """Run scenario(s) through their engines and print a verdict table per scenario."""
    from harness.scenario import load

    for path in scenarios:  # every file is validated before any engine starts
        load(path)
    only = [e.strip() for e in engines.split(",") if e.strip()] if engines else None
    codes = [_run_one(path, out, only, parallel, None, allow_missing).exit_code for path in scenarios]
    raise typer.Exit(EXIT_INTERRUPTED if EXIT_INTERRUPTED in codes else max(codes))


class EngineProgress:
    """A rich progress bar per engine worker: its state (loading, ready, done) and cases finished."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=err_console, transient=False)
        self.tasks: dict[str, int] = {}

    def start(self, names: list[str], total: int) -> None:
        for name in names:
            self.tasks[name] = self.bars.add_task(f"{name}: waiting", total=total)
        self.bars.start()

    def event(self, name: str, event: str) -> None:
        if event == "case":
            self.bars.advance(self.tasks[name])
        else:
            self.bars.update(self.tasks[name], description=f"{name}: {event}")

    def stop(self) -> None:
        self.bars.stop()


def _run_one(path: Path, out: Path, only: list[str] | None, parallel: int | None,
             cases: list[str] | None = None, allow_missing: bool = False):
    from harness.run import execute
    from harness.summary import rich_table

    progress = EngineProgress()

    def on_start(scenario, names, run_dir):
        console.print(f"[bold]{scenario.name}[/]: {len(scenario.cases)} cases x {len(names)} engines "
                      f"-> {run_dir}")
        progress.start(names, len(scenario.cases))

    try:
        outcome = execute(path, out, only, parallel, progress.event, on_start, cases, allow_missing)
    finally:
        progress.stop()
    if not outcome.verdicts.empty:
        console.print(rich_table(outcome.verdicts, outcome.scenario.spec.reference))
    for name, warnings in outcome.warnings.items():
        for warning in warnings:
            console.print(f"[yellow]warning[/] {name}: {warning}", highlight=False)
    for name, reason in outcome.skipped.items():
        console.print(f"[yellow]skipped[/] {name}: {reason}", highlight=False)
    for cases, text in outcome.effective_differences:
        console.print(f"[yellow]effective params differ[/] ({', '.join(cases)}): {text}", highlight=False)
    state = "INTERRUPTED" if outcome.interrupted else "PASS" if outcome.exit_code == 0 else "FAIL"
    console.print(f"{state}: {outcome.scenario.name} (exit {outcome.exit_code}); report: "
                  f"{outcome.run_dir / 'summary.md'}", highlight=False)
    return outcome


@app.command()
@cli_errors
def explain(scenario: Annotated[Path, typer.Argument(help="scenario YAML file", show_default=False)],
            case: Annotated[Optional[list[str]], typer.Option(
                help="case id to explain (repeatable; default: every case that did not match, else the first)")
            ] = None,
            engines: Annotated[Optional[str], typer.Option(help="comma-separated engine names to run "
                                                                "(the reference is required)")] = None,
            k: Annotated[Optional[float], typer.Option(help="a point leaves the noise floor when its error "
                                                            "exceeds k x the floor (default: scenario, 10)")] = None,
            out: Annotated[Path, typer.Option(help="where run directories are written")] = Path("reports"),
            parallel: Annotated[Optional[int], typer.Option(help="engines run at once")] = None) -> None:
    """Run a scenario, then trace the chosen cases layer by layer in every engine (teacher forcing) and say where
    the engines part and why: which layer and component, sampler or penalty semantics, a near-tie, a hazard."""
    import os

    from harness.explain import explain_run
    from harness.explain_report import localisation_lines
    from harness.scenario import load

    load(scenario)
    only = [e.strip() for e in engines.split(",") if e.strip()] if engines else None
    outcome = _run_one(scenario, out, only, parallel, case)
    if outcome.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    progress = EngineProgress()

    def on_start(names: list[str], cases: list[str]) -> None:
        console.print(f"[bold]explain[/]: tracing {len(cases)} case(s) in {', '.join(names)}")
        progress.start(names, len(cases))

    try:
        result = explain_run(outcome, case, k, parallel or max(1, (os.cpu_count() or 1) // outcome.scenario.spec.threads), progress.event,
                             on_start)
    finally:
        progress.stop()
    for note in result.notes:
        console.print(f"[yellow]note[/] {note}", highlight=False)
    for loc in result.localisations:
        for line in localisation_lines(loc.to_json()):
            console.print(line, highlight=False, markup=False)
    console.print(f"explain: {result.explain_dir / 'summary.md'}", highlight=False)
    raise typer.Exit(EXIT_INTERRUPTED if result.interrupted else outcome.exit_code)


@app.command()
@cli_errors
def transplant(scenario: Annotated[Path, typer.Argument(help="scenario YAML file", show_default=False)],
               case: Annotated[Optional[list[str]], typer.Option(help="case id (repeatable; default: all)")] = None,
               engines: Annotated[Optional[str], typer.Option(help="comma-separated engine names")] = None,
               out: Annotated[Path, typer.Option(help="where run directories are written")] = Path("reports")
               ) -> None:
    """Run every engine's own sampling code on the same logits (the reference's, teacher-forced), compare the
    distributions step by step, name the param behind a disagreement, and report inf/NaN hazards. Only the
    reference generates, so engines that cannot run here are compared too. Exit 1 if a sampler disagrees."""
    from harness import effective
    from harness.run import select_engines
    from harness.scenario import load
    from harness.transplant import transplant_run

    loaded = load(scenario)
    names = select_engines(loaded, [e.strip() for e in engines.split(",")] if engines else None)
    rejected = effective.rejections(loaded, names)
    outcome = _run_one(scenario, out, [loaded.spec.reference], None, case)
    if outcome.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    progress = EngineProgress()
    progress.start([loaded.spec.reference], len(outcome.scenario.cases))
    try:
        result = transplant_run(outcome, loaded, names, rejected, progress.event)
    finally:
        progress.stop()
    for verdict in result.verdicts:
        console.print(f"{verdict.case_id} [{verdict.engine} vs {verdict.reference}]: {verdict.cause}", markup=False,
                      highlight=False)
        console.print(f"  {verdict.verdict}", markup=False, highlight=False)
    console.print(f"transplant: {result.out_dir / 'verdicts.json'}", highlight=False)
    if result.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    raise typer.Exit(0 if all(v.cause == "agree" for v in result.verdicts) else 1)


@app.command()
@cli_errors
def params(scenario: Annotated[Path, typer.Argument(help="scenario YAML file", show_default=False)],
           engines: Annotated[Optional[str], typer.Option(help="comma-separated engine names")] = None,
           all_rows: Annotated[bool, typer.Option("--all", help="every param, not only those that differ")] = False
           ) -> None:
    """What each engine will really do with the scenario's params, computed by the engine's own code (config
    merges, generation_config.json defaults, clamps, greedy rewrites), side by side; differing rows marked."""
    from rich.table import Table

    from harness import effective
    from harness.run import select_engines
    from harness.scenario import load

    loaded = load(scenario)
    names = select_engines(loaded, [e.strip() for e in engines.split(",")] if engines else None, need_reference=False)
    with console.status("running each engine's sampling code"):
        table = effective.compute(loaded, names)
    rejected = False
    for cases, by_engine in effective.case_groups(loaded, names, table):
        shown = Table(title=f"effective params: {loaded.name}, case(s) {', '.join(cases)}", show_lines=False)
        shown.add_column("param")
        for name in names:
            shown.add_column(f"{name} ({loaded.spec.engines[name].engine})", overflow="fold")
        shown.add_column("differs")
        for field, values, differs in effective.table_rows(by_engine, all_rows):
            shown.add_row(field, *values, "[bold red]DIFFERS[/]" if differs else "")
        console.print(shown)
        for name, e in by_engine.items():
            for note in e.notes:
                console.print(f"  {name}: {note}", highlight=False, markup=False)
        rejected |= any(e.rejected for e in by_engine.values())
    raise typer.Exit(2 if rejected else 0)


@app.command()
@cli_errors
def gate(scenarios: ScenarioPaths,
         baseline: Annotated[Path, typer.Option(help="baseline directory (parity baseline save ... --to DIR)")],
         junit: Annotated[Optional[Path], typer.Option(help="write JUnit XML here")] = None,
         summary: Annotated[Optional[Path], typer.Option(help="write a Markdown summary here")] = None,
         out: Annotated[Path, typer.Option(help="where run directories are written")] = Path("reports"),
         parallel: Annotated[Optional[int], typer.Option(help="engines run at once")] = None) -> None:
    """Run scenarios and fail (exit 1) when a case leaves its expectation or moved against the baseline."""
    from harness import baseline as baselines
    from harness.ci_outputs import write_outputs
    from harness.gate import DEFAULT_LOGPROB_TOLERANCE, judge_run
    from harness.scenario import load

    loaded = [load(path) for path in scenarios]
    for scenario in loaded:  # a missing baseline is a config error before anything runs
        baselines.load(baseline, scenario.name)
    cases = []
    for path, scenario in zip(scenarios, loaded):
        outcome = _run_one(path, out, None, parallel)
        if outcome.interrupted:
            raise typer.Exit(EXIT_INTERRUPTED)
        expected = {(r.engine, r.case_id): (bool(r.expected), r.explanation) for r in outcome.verdicts.itertuples()}
        tolerances = {name: scenario.spec.engine_expectation(name).max_logprob_delta or DEFAULT_LOGPROB_TOLERANCE
                      for name in scenario.spec.engines}
        cases += judge_run(outcome.run_dir, baseline, expected, tolerances)
    for line in write_outputs(cases, junit, summary):
        print(line)
    failed = [c for c in cases if not c.passed]
    for case in failed:
        console.print(f"REGRESSION {case.scenario} {case.case_id} [{case.engine}]: {'; '.join(case.failures)}",
                      style="red", highlight=False, markup=False)
    console.print(f"gate: {'FAIL' if failed else 'PASS'} ({len(cases) - len(failed)}/{len(cases)} case results "
                  f"passed)", highlight=False)
    raise typer.Exit(1 if failed else 0)


@app.command()
@cli_errors
def report(run_dir: Annotated[Path, typer.Argument(help="a run directory (reports/<run-id>)")],
           out: Annotated[Optional[Path], typer.Option(help="HTML file (default RUN_DIR/report.html)")] = None
           ) -> None:
    """Write one self-contained HTML report (inline styles and SVG plots, no network) of a run directory."""
    from harness.html_report import write

    if not (run_dir / "run.json").exists():
        raise ParityError(f"{run_dir}: not a run directory (no run.json): pass a reports/<run-id> folder")
    console.print(f"report: {write(run_dir, out)}")


baseline_app = typer.Typer(no_args_is_help=True, help="Baselines for `parity gate`.")
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("save")
@cli_errors
def baseline_save(run_dir: Annotated[Path, typer.Argument(help="a finished run directory (reports/<run-id>)")],
                  to: Annotated[Path, typer.Option(help="baseline directory, e.g. baselines/main")]) -> None:
    """Store a run's token ids, logprobs, verdicts and versions as the baseline of its scenario."""
    from harness import baseline as baselines

    path = baselines.save(run_dir, to)
    console.print(f"baseline saved: {path}")


@app.command("engines")
@cli_errors
def list_engines() -> None:
    """Registered engines: importable or not (and why), with versions."""
    from importlib import metadata

    from rich.table import Table

    from adapters.registry import ENGINES, check_available

    table = Table("engine", "available", "package", "description")
    for name, entry in ENGINES.items():
        reason = check_available(name)
        try:
            version = metadata.version(entry.pip.split()[-1].split("==")[0])
        except metadata.PackageNotFoundError:
            version = "-"
        table.add_row(name, "yes" if reason is None else f"[red]no[/]: {reason}", f"{entry.import_name} {version}",
                      entry.description)
    console.print(table)


env_app = typer.Typer(no_args_is_help=True, help="Engine environments (own venvs for conflicting engines).")
app.add_typer(env_app, name="env")


@env_app.command("create")
@cli_errors
def env_create(name: Annotated[str, typer.Argument(help="environment name (see `parity env list`)")],
               python: Annotated[Optional[str], typer.Option(help="base interpreter (default: this one)")] = None,
               dry_run: Annotated[bool, typer.Option(help="only let pip resolve the pinned requirements and list "
                                                          "what it would install")] = False) -> None:
    """Build .venvs/NAME from the requirements pinned in pyproject.toml; scenarios then name its interpreter."""
    import json

    from harness import envs

    with console.status(f"{'resolving' if dry_run else 'building'} environment {name}"):
        path, report = envs.create(name, python, dry_run)
    if dry_run:
        installs = json.loads(report).get("install", [])
        packages = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in installs)
        console.print(f"{name}: pip would install {len(packages)} packages: {', '.join(packages)}", highlight=False)
        return
    console.print(f"{name}: ready; in a scenario: python: {path}", highlight=False)


@env_app.command("list")
@cli_errors
def env_list() -> None:
    """Declared engine environments and whether they are built."""
    from harness import envs

    for name, spec in envs.declared().items():
        built = envs.interpreter(name).exists()
        console.print(f"{name}: {spec.get('description', '')}; {'built at ' + str(envs.interpreter(name)) if built else 'not built'}",
                      highlight=False)


@models_app.command("prepare")
@cli_errors
def models_prepare(names: Annotated[Optional[list[str]], typer.Argument(help="models to prepare (default all)")] = None,
                   force: Annotated[bool, typer.Option(help="rebuild even if already prepared")] = False) -> None:
    """Convert the bundled models once into the cache (LLM_PARITY_CACHE, default ~/.cache/llm-parity)."""
    from harness import models

    for name in names or list(models.MODELS):
        if name not in models.MODELS:
            raise ParityError(f"unknown model '{name}': known models are {', '.join(models.MODELS)}")
        already = models.MODELS[name].prepared() and not force
        with console.status(f"preparing {name}"):
            path = models.prepare(name, force=force)
        console.print(f"{name}: {'already prepared' if already else 'prepared'} at {path}")


@models_app.command("list")
@cli_errors
def models_list() -> None:
    """Named models and whether they are prepared."""
    from harness import models

    for name, model in models.MODELS.items():
        state = f"prepared at {model.folder('float32').parent}" if model.prepared() else "not prepared"
        console.print(f"{name}: {model.description}; {state}")

