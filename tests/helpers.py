"""Shared test helpers: run the real `parity` CLI in a subprocess (real exit codes) or in-process (typer's runner, for
the fast tier), write scenario files, wait for a background run."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


@dataclass
class ParityRun:
    code: int
    stdout: str
    stderr: str
    run_dir: Path | None

    @property
    def verdicts(self) -> pd.DataFrame:
        return pd.read_parquet(self.run_dir / "verdicts.parquet")

    @property
    def results(self) -> pd.DataFrame:
        return pd.read_parquet(self.run_dir / "results.parquet")

    @property
    def meta(self) -> dict:
        return json.loads((self.run_dir / "run.json").read_text())


# Output no command of the project writes: a traceback, triton's "nanobind: leaked ..." report at exit, a tqdm bar
# (its carriage returns read as line ends here), a Python warning
FOREIGN = re.compile(r"Traceback \(most recent call last\)|nanobind|leaked (instance|type|function)|\d+%\|.*\||"
                     r"\d+(\.\d+)?(it/s|s/it)\]|\w+Warning: ")


def foreign_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if FOREIGN.search(line)]


def parity(*args: str, out: Path | None = None, timeout: float = 900, env: dict[str, str] | None = None) -> ParityRun:
    """Run `python -m harness ARGS` (with --out for runs) and return its exit code, output and run directory. Every
    line it prints must be the project's own (a quiet console): any foreign line fails the test."""
    cmd = [sys.executable, "-m", "harness", *args]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})
    foreign = foreign_lines(proc.stdout + proc.stderr)
    assert not foreign, f"parity {' '.join(args)} printed lines the project did not write: {foreign[:5]}"
    run_dirs = sorted(out.iterdir()) if out is not None and out.exists() else []
    run = ParityRun(proc.returncode, proc.stdout, proc.stderr, run_dirs[-1] if run_dirs else None)
    if args[0] == "explain":  # every run explained, when several scenarios were
        disagree = [d for run_dir in run_dirs for d in explain_disagreements(run_dir)]
        assert not disagree, f"parity {' '.join(args)}: run and explain disagree: {disagree[:5]}"
    return run


def explain_disagreements(run_dir: Path) -> list[str]:
    """Cases where `parity explain` and the run's verdict disagree: a case the run judged apart that explain finds
    no cause for, beams the run matched that explain finds a cause for, or a near-tie one of them reads and the other
    does not. Every explain of the suite is held to it."""
    verdicts_file, explain_dir = run_dir / "verdicts.parquet", run_dir / "explain"
    if not verdicts_file.exists() or not explain_dir.exists():
        return []
    verdicts = pd.read_parquet(verdicts_file).set_index(["case_id", "engine"])["verdict"]
    explained = []
    for name, key, beams in (("localisation.json", "localisations", False), ("beams.json", "explanations", True)):
        if (explain_dir / name).exists():
            explained += [(e, beams) for e in json.loads((explain_dir / name).read_text())[key]]
    found = []
    for e, beams in explained:
        run = verdicts.get((e["case_id"], e["engine"]))
        if run is None or e["cause"] in ("failed", "no_trace"):
            continue
        tie_apart = (run == "benign_tie" and e["cause"] not in ("near_tie", "untraced", "length")) or (
            run == "diverged" and e["cause"] == "near_tie")  # one reading of a near-tie, in the run and in explain
        if (run != "match" and e["cause"] == "none") or (beams and run == "match" and e["cause"] != "none") or \
                tie_apart:
            found.append(f"{e['case_id']} [{e['engine']}]: run {run}, explain {e['cause']}: {e['verdict'][:200]}")
    return found


def write_scenario(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def fake_distribution(site: Path, module: str, source: str, entry_points: dict[str, dict[str, str]]) -> None:
    """An installed package as importlib.metadata sees it, in `site` (put it on sys.path): the module `module` with
    `source`, and a .dist-info declaring entry points ({group: {name: "module:attribute"}})."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(source)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        for group, points in entry_points.items()))


def start_parity_run(scenario: Path, out: Path, *args: str) -> subprocess.Popen:
    """`parity run` in the background, for tests that kill or interrupt something mid-run. Its SIGINT disposition is
    the default whatever this process inherited: a suite started as a background job of a non-interactive shell
    runs with SIGINT ignored, which a child would inherit and then never see the Ctrl-C these tests send."""
    return subprocess.Popen([sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out), *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def journal_lines(out: Path, engine: str) -> int:
    """How many results an engine of the (single) run under `out` has journaled so far."""
    journals = list(out.glob(f"*/engines/{engine}/results.jsonl"))
    return len(journals[0].read_text().splitlines()) if journals else 0


@functools.cache
def _built_once(get_command):
    return functools.cache(get_command)


@dataclass
class InProcess:
    code: int
    stdout: str
    stderr: str
    traceback: str  # of an exception that escaped the command ("" when none did)


def parity_in_process(*args: str) -> InProcess:
    """`parity ARGS` through typer's test runner in this process: fast, for commands that run no engine."""
    import typer.main
    import typer.testing

    from harness.cli import app

    # typer's runner rebuilds the click command from the app's functions on every call, half of a fuzz example's
    # time (tests/fuzz); the CLI does not change within a test process, so it is built once
    typer.testing._get_command = _built_once(typer.main.get_command)
    result = typer.testing.CliRunner().invoke(app, list(args))
    escaped = result.exc_info if result.exception and not isinstance(result.exception, SystemExit) else None
    return InProcess(result.exit_code, result.stdout, result.stderr,
                     "".join(traceback.format_exception(*escaped)) if escaped else "")


@dataclass
class GgufTensor:
    type: str  # F32, Q4_K, ...
    elements: int
    data: np.ndarray  # float32 or float16 values, or a quantised type's raw bytes (as gguf's reader gives them)


def gguf_tensors(path: Path) -> dict[str, GgufTensor]:
    """Each tensor of a GGUF file, read where harness.models.gguf_header's table says it is (gguf's GGUFReader took
    12 s of CPU to parse Gemma 3's vocabulary first)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from harness.models.gguf_header import read

    data = np.memmap(path, mode="r", dtype=np.uint8)
    tensors = {}
    for info in read(path, keys=())[1]:
        kind = GGMLQuantizationType(info.kind)
        block, size = GGML_QUANT_SIZES[kind]
        elements = math.prod(info.shape)
        raw = data[info.offset:info.offset + elements // block * size]
        values = {"F32": np.float32, "F16": np.float16}.get(kind.name)
        tensors[info.name] = GgufTensor(kind.name, elements, raw.view(values) if values else raw)
    return tensors


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]


def chromium(user_data: Path, *args: str) -> subprocess.CompletedProcess:
    """The real headless Chromium the report tests open reports in."""
    binary = shutil.which("chromium")
    assert binary, "chromium is missing: run scripts/ensure_chromium.sh (make test does)"
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data}", *args], capture_output=True,
                          text=True, timeout=180)
