"""Every script in benchmarks/ runs to exit 0 at its smallest setting, so that a change to the verdicts, the run
directory or the planning cannot break one unnoticed (a text-verdict change once made server_overhead.py's run exit 1
on an `ignore_eos` answer whose last id happened to be an EOS: its smallest setting here keeps that prompt, p2 at 64
tokens). The numbers they print are not judged: on a shared 2-core machine they are noise at this size. The Ray one
comes last: by then test_ray's cluster (the file before this one in tests/conftest.py's order) has ended."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, write_scenario

pytestmark = pytest.mark.engines

# the smallest runs: one prompt of a few tokens on the tiny model, one repeat, warm caches
TINY = """\
name: {name}
model: tiny-llama
dtype: float32
threads: 1
engines:
{engines}
prompts: [{{id: capital, text: "The capital of France is"}}]
params: {{temperature: 0, max_new_tokens: 4}}
expect: {{tokens: exact, max_logprob_delta: 0.001}}
"""
HF_AND_VLLM = "  hf: {engine: hf, reference: true}\n  vllm: {engine: vllm, options: {enforce_eager: true}}"
HF_TWICE = "  hf: {engine: hf, reference: true}\n  hf-batched: {engine: hf, options: {batched: true}}"
HF_INVARIANCE = HF_TWICE + "\ninvariance: {knobs: [repeat, batch]}"


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("benchmarks")
    return {name: write_scenario(folder / f"{name}.yaml", TINY.format(name=name, engines=engines))
            for name, engines in (("tiny-hf-vllm", HF_AND_VLLM), ("tiny-hf", HF_TWICE),
                                  ("tiny-invariance", HF_INVARIANCE))}


def benchmark(script: str, *args: str | Path, timeout: float = 600) -> str:
    """Run benchmarks/SCRIPT with ARGS; it must exit 0. Its output."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_server_overhead_runs_its_ignore_eos_prompts(tmp_path: Path) -> None:
    out = benchmark("server_overhead.py", "--prompts", "3", "--tokens", "64", "--repeats", "1", "--modes", "warm",
                    "--layouts", "shared")
    assert "== warm: medians of 1, 6 requests of 64 tokens ==" in out and "ratio parity/plain" in out


def test_overhead_runs(scenarios: dict[str, Path]) -> None:
    out = benchmark("overhead.py", "--repeats", "1", "--modes", "warm", "--scenario", scenarios["tiny-hf-vllm"])
    assert "ratio parity/plain" in out and "parity harness:" in out


def test_scale_runs() -> None:
    out = benchmark("scale.py", "--counts", "2", "--engines", "hf", "--repeats", "1", "--tokens", "4", "--no-whole")
    assert "# 2 cases x 4 greedy tokens" in out and "parity harness: prepare" in out


def test_invariance_cost_runs(scenarios: dict[str, Path]) -> None:
    out = benchmark("invariance_cost.py", scenarios["tiny-invariance"])
    assert "ratio parity/plain" in out


def test_trace_overhead_runs() -> None:
    out = benchmark("trace_overhead.py", "--model", "tiny-llama", "--positions", "16")
    assert "parity explain" in out and "ratio" in out


def test_ray_overhead_runs(scenarios: dict[str, Path]) -> None:
    out = benchmark("ray_overhead.py", "--repeats", "1", scenarios["tiny-hf"])
    assert "repeat 1 ray:" in out and "ray / local wall time:" in out
