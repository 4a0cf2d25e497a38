"""The `parity` command line: parses, calls one function per command, prints. Heavy modules (pandas, torch,
engines) are imported inside commands only, so `parity --help` is instant."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from typer._click import exceptions as click_errors  # typer (pinned) vendors click here
from typer.core import TyperGroup

from harness.core.errors import EXIT_INTERRUPTED, ConfigError, ParityError
from harness.core.user_paths import (
    check_option,
    file_to_read_problem,
    folder_to_read_problem,
    os_reason,
    shown,
    to_write_problem,
)
from harness.render.console import console, err_console

# Registered first, so it runs last: by then every file of the command is written and closed, and the objects left
# (pandas, pyarrow, a run's tables) are handed to the OS instead of being traversed by the interpreter's final
# collection: 0.13-0.25 s less at the end of a `parity run`, 0.05 s of a `validate` (measured on this 2-core machine).
atexit.register(gc.freeze)


def _quiet_third_parties() -> None:
    """Keep output the project did not write out of every command's console: tqdm bars (transformers converting a
    GGUF and writing shards when a model is prepared; a single line of carriage returns when piped) and the
    "nanobind: leaked ..." report triton's extension prints at interpreter exit. triton is imported only because
    torch's compiler modules, which transformers loads with a model, look whether it is installed; nothing in this
    process runs it (engines run in worker processes, which import what they need)."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    sys.modules.setdefault("triton", None)  # `import triton` raises ImportError here: torch reads "not installed"


_quiet_third_parties()


def _error(message: str) -> None:
    """One line, whatever the message quotes (a scenario's value may hold newlines or terminal control codes)."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(message.split()))
    err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False)


class OneLineErrors(TyperGroup):
    """Usage errors (an unknown option, a missing argument, a value of the wrong type) are one line naming the
    command and its --help, exit 2, like every other error of the CLI."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click_errors.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "parity"
            message = " ".join(exc.format_message().split()).rstrip(".")
            _error(f"{message}: see `{command} --help`")
            sys.exit(exc.exit_code)
        except click_errors.ClickException as exc:
            _error(" ".join(exc.format_message().split()))
            sys.exit(exc.exit_code)
        except typer.Abort:
            err_console.print("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(cls=OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Differential testing of LLM inference engines. Exit codes: 0 all cases as expected, "
                       "1 a case out of expectation, 2 usage or config error, 3 engine unavailable, 130 interrupted.")
models_app = typer.Typer(no_args_is_help=True, help="Named models: prepare (convert once) and list.")
baseline_app = typer.Typer(no_args_is_help=True, help="Baselines for `parity gate`.")
env_app = typer.Typer(no_args_is_help=True, help="Engine environments (own venvs for conflicting engines).")
app.add_typer(models_app, name="models")
app.add_typer(baseline_app, name="baseline")
app.add_typer(env_app, name="env")


def cli_errors(command):
    """Turn ParityError into a one-line message and its exit code; never a traceback for bad input."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ParityError as exc:
            _error(exc.message)
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:
            if exc.filename is None:
                raise  # not about a path the user gave: a bug, whose traceback is wanted
            _error(f"{shown(exc.filename)}: {os_reason(exc)}: check the path and its permissions")
            raise typer.Exit(ConfigError.exit_code) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


# The options every engine-running command shares, defined once.
ScenarioPaths = Annotated[list[Path], typer.Argument(help="scenario YAML file(s)", show_default=False)]
ScenarioPath = Annotated[Path, typer.Argument(help="scenario YAML file", show_default=False)]
Engines = Annotated[str | None, typer.Option(help="comma-separated engine names to run (the reference is "
                                                 "required where it must run)")]
AllowMissing = Annotated[bool, typer.Option(help="skip engines that cannot run here (missing package, no CUDA) "
                                                 "instead of exiting 3; the report lists them")]
Cases = Annotated[list[str] | None, typer.Option("--case", help="case id (repeatable; default: all)")]
Out = Annotated[Path, typer.Option(help="where run directories are written")]
Parallel = Annotated[int | None, typer.Option(help="engines run at once (default: cores / threads per engine; "
                                                   "on Ray: all, as the cluster's resources allow)")]


class ExecutorKind(str, Enum):
    local = "local"
    ray = "ray"


ExecutorOpt = Annotated[ExecutorKind, typer.Option("--executor", help="where engine workers run: local subprocesses, "
                                                                      "or actors of a Ray cluster (pip install "
                                                                      "'llm-parity[ray]')")]
RayAddress = Annotated[str | None, typer.Option(help="with --executor ray: `auto` (a cluster started with `ray start` "
                                                     "on this machine or reachable through RAY_ADDRESS), host:port or "
                                                     "ray://host:port; default: start a Ray instance on this machine")]


def executor_scope(executor: ExecutorKind, ray_address: str | None):
    """The executor a command's engines run on, for the command's duration."""
    from harness.executors.choice import using

    return using(executor.value, ray_address)


def selection(engines: str | None, allow_missing: bool, cases: list[str] | None = None):
    """The one place --engines is split."""
    from harness.run.execute import Selection

    names = [e.strip() for e in engines.split(",") if e.strip()] if engines else None
    return Selection(engines=names, cases=cases, allow_missing=allow_missing)


def folder_out(option: str, path: Path | None) -> None:
    """A folder the command writes into: usable, or a one-line error before anything runs."""
    check_option(option, path, lambda p: to_write_problem(p, folder=True),
                 "pass a folder you can write to (it is created if missing)")


def file_out(option: str, path: Path | None) -> None:
    check_option(option, path, lambda p: to_write_problem(p, folder=False),
                 "pass a file name in a folder you can write to")


def run_dir_in(option: str, path: Path) -> None:
    check_option(option, path, folder_to_read_problem, "pass a run directory (reports/<run-id>)")


@app.command()
@cli_errors
def validate(scenarios: ScenarioPaths) -> None:
    """Check scenario files without running anything; exit 2 with file:line on the first problem."""
    from harness.scenario.spec import load

    for path in scenarios:
        loaded = load(path)
        if loaded.incapable:  # an engine without a decoding mode the cases need (beam search)
            raise ConfigError(next(iter(loaded.incapable.values())))
        console.print(f"{path}: ok ({len(loaded.cases)} cases x {len(loaded.spec.engines)} engines, "
                      f"reference {loaded.spec.reference})", highlight=False)


@app.command()
@cli_errors
def run(scenarios: Annotated[list[Path] | None, typer.Argument(help="scenario YAML file(s)",
                                                                show_default=False)] = None,
        engines: Engines = None, out: Out = Path("reports"), parallel: Parallel = None,
        allow_missing: AllowMissing = False, executor: ExecutorOpt = ExecutorKind.local, ray_address: RayAddress = None,
        resume: Annotated[Path | None, typer.Option(
            help="continue an interrupted run in its directory (reports/<run-id>) with the scenario, engines and cases "
                 "it started with: journaled results are reused, engine errors and missing cases run again")] = None,
        plan: Annotated[Path | None, typer.Option(
            help="run nothing: print the actors, their resources and a schedule on the cluster that this file "
                 "describes, with wall time estimated from the per-case costs it gives (see docs/ray.md)")] = None
        ) -> None:
    """Run scenario(s) through their engines and print a verdict table per scenario. Several scenarios run as one
    matrix: on Ray, all their engines at once as the cluster allows."""
    from harness.commands import resume_and_print, run_all_and_print
    from harness.scenario.spec import load

    folder_out("--out", out)
    check_option("--plan", plan, file_to_read_problem, "pass a cluster description file (see docs/ray.md)")
    if resume is not None:
        run_dir_in("--resume", resume)
        if scenarios or engines or allow_missing or plan:
            raise ConfigError("--resume continues a run with the scenario and engines it started with: drop the "
                              "scenario files, --engines, --allow-missing and --plan")
        with executor_scope(executor, ray_address):
            raise typer.Exit(resume_and_print(resume, parallel).exit_code)
    if not scenarios:
        raise ConfigError("nothing to run: give scenario file(s), or --resume RUN_DIR")
    loaded = [load(path) for path in scenarios]  # every file is validated before any engine starts
    if plan is not None:
        from harness.commands import plan_and_print

        raise typer.Exit(plan_and_print(loaded, plan, selection(engines, allow_missing)))
    with executor_scope(executor, ray_address):
        codes = [o.exit_code for o in run_all_and_print(loaded, out, selection(engines, allow_missing), parallel)]
    raise typer.Exit(EXIT_INTERRUPTED if EXIT_INTERRUPTED in codes else max(codes))


@app.command()
@cli_errors
def explain(scenarios: ScenarioPaths,
            case: Annotated[list[str] | None, typer.Option(
                help="case id to explain (repeatable; default: every case that did not match, else the first)")
            ] = None, engines: Engines = None, allow_missing: AllowMissing = False,
            k: Annotated[float | None, typer.Option(help="a point leaves the noise floor when its error exceeds k x "
                                                         "the floor (default: scenario, 10)")] = None,
            out: Out = Path("reports"), parallel: Parallel = None, executor: ExecutorOpt = ExecutorKind.local,
            ray_address: RayAddress = None,
            keep_traces: Annotated[bool, typer.Option(
                help="keep every engine's whole trace (every point at every position) in the run directory; by "
                     "default only the logits rows and the first divergent layer's rows are kept, with every "
                     "point's per-position errors in explain/errors.parquet")] = False) -> None:
    """Run scenario(s), then trace the chosen cases layer by layer in every engine (teacher forcing) and say where
    the engines part and why: which layer and component, sampler or penalty semantics, a near-tie, a hazard. Several
    scenarios run as one matrix and are explained in turn, in the same workers (--case names cases of each)."""
    from harness.commands import explain_all_and_print
    from harness.scenario.spec import load

    folder_out("--out", out)
    loaded = [load(path) for path in scenarios]  # every file is validated before any engine starts
    with executor_scope(executor, ray_address):
        code = explain_all_and_print(loaded, out, selection(engines, allow_missing, case), k, parallel, keep_traces)
    raise typer.Exit(code)


@app.command()
@cli_errors
def transplant(scenario: ScenarioPath, case: Cases = None, engines: Engines = None,
               allow_missing: AllowMissing = False, out: Out = Path("reports"),
               executor: ExecutorOpt = ExecutorKind.local, ray_address: RayAddress = None) -> None:
    """Run every engine's own sampling code on the same logits (the reference's, teacher-forced), compare the
    distributions step by step, name the param behind a disagreement, and report inf/NaN hazards. Only the
    reference generates, so engines that cannot run here are compared too. Exit 1 if a sampler disagrees."""
    from harness.commands import transplant_and_print
    from harness.scenario.spec import load

    folder_out("--out", out)
    with executor_scope(executor, ray_address):
        code = transplant_and_print(load(scenario), out, selection(engines, allow_missing, case))
    raise typer.Exit(code)


@app.command()
@cli_errors
def params(scenario: ScenarioPath, engines: Engines = None, allow_missing: AllowMissing = False,
           all_rows: Annotated[bool, typer.Option("--all", help="every param, not only those that differ")] = False
           ) -> None:
    """What each engine will really do with the scenario's params, computed by the engine's own code (config
    merges, generation_config.json defaults, clamps, greedy rewrites), side by side; differing rows marked.
    Exit 2 if an engine rejects its params."""
    from harness.commands import params_and_print
    from harness.scenario.spec import load

    raise typer.Exit(params_and_print(load(scenario), selection(engines, allow_missing), all_rows))


@app.command()
@cli_errors
def gate(scenarios: ScenarioPaths,
         baseline: Annotated[Path, typer.Option(help="baseline directory (parity baseline save ... --to DIR)")],
         engines: Engines = None, allow_missing: AllowMissing = False,
         junit: Annotated[Path | None, typer.Option(help="write JUnit XML here")] = None,
         summary: Annotated[Path | None, typer.Option(help="write a Markdown summary here")] = None,
         out: Out = Path("reports"), parallel: Parallel = None, executor: ExecutorOpt = ExecutorKind.local,
         ray_address: RayAddress = None) -> None:
    """Run scenarios and fail (exit 1) when a case leaves its expectation or moved against the baseline."""
    from harness.commands import gate_and_print
    from harness.scenario.spec import load

    folder_out("--out", out)
    check_option("--baseline", baseline, folder_to_read_problem,
                 "pass the folder `parity baseline save RUN_DIR --to FOLDER` wrote")
    file_out("--junit", junit)
    file_out("--summary", summary)
    loaded = [load(path) for path in scenarios]
    with executor_scope(executor, ray_address):
        code = gate_and_print(loaded, baseline, out, selection(engines, allow_missing), parallel, junit, summary)
    raise typer.Exit(code)


@app.command()
@cli_errors
def report(run_dir: Annotated[Path, typer.Argument(help="a run directory (reports/<run-id>)")],
           out: Annotated[Path | None, typer.Option(help="HTML file (default RUN_DIR/report.html)")] = None) -> None:
    """Write one self-contained HTML report (inline styles and SVG plots, no network) of a run directory."""
    from harness.report.html import write

    run_dir_in("RUN_DIR", run_dir)
    file_out("--out", out)
    console.print(f"report: {write(run_dir, out)}", highlight=False)


@baseline_app.command("save")
@cli_errors
def baseline_save(run_dir: Annotated[Path, typer.Argument(help="a finished run directory (reports/<run-id>)")],
                  to: Annotated[Path, typer.Option(help="baseline directory, e.g. baselines/main")]) -> None:
    """Store a run's token ids, logprobs, verdicts and versions as the baseline of its scenario."""
    from harness.compare import baseline as baselines

    run_dir_in("RUN_DIR", run_dir)
    folder_out("--to", to)
    console.print(f"baseline saved: {baselines.save(run_dir, to)}", highlight=False)


@app.command("engines")
@cli_errors
def list_engines() -> None:
    """Registered engines (built in and plugins): available here or not and why, versions, what they can do."""
    from harness.commands import engines_and_print

    engines_and_print()


@app.command("fork-server")
@cli_errors
def fork_server(socket_path: Annotated[Path | None, typer.Argument(
        help="Unix socket to listen on (default: llm-parity-fork-server.sock in the temp folder)")] = None) -> None:
    """Import torch, transformers and vLLM once and fork engine workers from here, for many commands: a command run
    with LLM_PARITY_FORK_SERVER=SOCKET starts each worker without importing them again (about 9 s of CPU less per HF
    or vLLM worker on 2 cores). Start it in the environment the commands run in; Ctrl-C stops it."""
    import tempfile

    from harness.core.fork_server import ENV_VAR

    path = socket_path or Path(tempfile.gettempdir()) / "llm-parity-fork-server.sock"
    console.print(f"fork server: importing torch, transformers and vLLM; then run commands with {ENV_VAR}={path}",
                  highlight=False, markup=False)
    os.execv(sys.executable, [sys.executable, "-m", "harness.core.fork_server", str(path)])


@env_app.command("create")
@cli_errors
def env_create(name: Annotated[str, typer.Argument(help="environment name (see `parity env list`)")],
               python: Annotated[str | None, typer.Option(help="base interpreter (default: this one)")] = None,
               dry_run: Annotated[bool, typer.Option(help="only resolve the pinned requirements and list what "
                                                          "would be installed")] = False) -> None:
    """Build .venvs/NAME from the requirements pinned in pyproject.toml (with uv where it is installed, as
    scripts/bootstrap.sh does, else pip); scenarios then name its interpreter."""
    from adapters import envs

    if dry_run:
        with console.status(f"resolving environment {name}"):
            resolver, packages = envs.resolve(name, python)
        console.print(f"{name}: {resolver} would install {len(packages)} packages: {', '.join(packages)}",
                      highlight=False)
        return
    with console.status(f"building environment {name}"):
        path = envs.create(name, python)
    console.print(f"{name}: ready; in a scenario: python: {path}", highlight=False)


@env_app.command("list")
@cli_errors
def env_list() -> None:
    """Declared engine environments and whether they are built."""
    from adapters import envs

    for name, spec in envs.declared().items():
        built = envs.interpreter(name)
        state = f"built at {built}" if built.exists() else "not built"
        console.print(f"{name}: {spec.get('description', '')}; {state}", highlight=False)


@models_app.command("prepare")
@cli_errors
def models_prepare(names: Annotated[list[str] | None, typer.Argument(
                       help="models to prepare (default: all but the on-demand ones)")] = None,
                   force: Annotated[bool, typer.Option(help="rebuild even if already prepared")] = False,
                   engine_files: Annotated[bool, typer.Option(
                       help="also build the engines' own files (llama.cpp's GGUF variants) of every model prepared "
                            "now, rather than on first use (the default for models named here)")] = False) -> None:
    """Convert the bundled models once into the cache (LLM_PARITY_CACHE, default ~/.cache/llm-parity). An engine's
    own files of a model (llama.cpp's GGUF variants) are built on their first use, unless the model is named here or
    --engine-files is given."""
    from harness import models
    from harness.commands import left_for_first_use, prepare_engine_files
    from harness.models import catalog

    problem = next(filter(None, map(catalog.preparable_problem, names or [])), None)
    if problem:
        raise ParityError(problem)
    for name in [n for n in names or [] if n not in models.MODELS]:  # named adapters and merged models
        with console.status(f"preparing {name}"):
            path = catalog.prepare_built(name)
        console.print(f"{name}: prepared at {path}", highlight=False)
    if names and not any(n in models.MODELS for n in names):
        return
    names = [n for n in names or [] if n in models.MODELS]
    for name in names or [n for n, m in models.MODELS.items() if not m.on_demand]:
        already = models.MODELS[name].prepared() and not force
        with console.status(f"preparing {name}"):
            path = models.prepare(name, force=force)
        console.print(f"{name}: {'already prepared' if already else 'prepared'} at {path}", highlight=False)
        for engine, line in prepare_engine_files(name, build=engine_files or bool(names)):
            console.print(f"  {engine}: {line}", highlight=False, markup=False)
    if not names:
        console.print(left_for_first_use(), highlight=False, markup=False)


@models_app.command("list")
@cli_errors
def models_list() -> None:
    """Named models, whether they are prepared, and the engines' own files of those that are (built or not)."""
    from harness import models
    from harness.commands import prepare_engine_files

    for name, model in models.MODELS.items():
        state = f"prepared at {model.folder('float32').parent}" if model.prepared() else "not prepared"
        console.print(f"{name}: {model.description}; {state}", highlight=False)
        for engine, line in prepare_engine_files(name, build=False) if model.prepared() else []:
            console.print(f"  {engine}: {line}", highlight=False, markup=False)
    from harness.models import catalog, lora

    for name, adapter in lora.ADAPTERS.items():  # a scenario's lora:, and merged models <model>+<adapter>
        folder = catalog.models_root() / name
        state = f"prepared at {folder}" if (folder / lora.CONFIG).exists() else "built on first use"
        console.print(f"{name} (LoRA adapter): {adapter.description}; {state}", highlight=False)
