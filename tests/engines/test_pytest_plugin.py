"""The pytest plugin collects a scenario file's cases as test items, with the verdict as the failure message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_scenario

pytestmark = pytest.mark.engines

PLUGGED = """\
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  batched: {engine: hf, options: {batched: true}}
  penalised: {engine: hf, params: {repetition_penalty: 3.0}}
prompts: ["Hello world, this is", "Once upon a time"]
params: {max_new_tokens: 16}
"""


def test_scenario_cases_become_test_items(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "plugged.yaml", PLUGGED)
    proc = subprocess.run([sys.executable, "-m", "pytest", str(scenario), "-v", "-p", "no:cacheprovider",
                           "--parity-out", str(tmp_path / "reports")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "plugged.yaml::p0[batched] PASSED" in out and "plugged.yaml::p1[batched] PASSED" in out
    assert "plugged.yaml::p0[penalised] FAILED" in out
    assert "diverged: diverged at step" in out and "repetition_penalty: unset vs 3.0" in out
    assert len(list((tmp_path / "reports").iterdir())) == 1  # one run served all items
