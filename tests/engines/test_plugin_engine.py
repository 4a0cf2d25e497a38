"""The engine contract, proven by an engine written by following docs/adding-an-engine.md: examples/loop-engine is
pip-installed as its own package (into a private target directory, registered through the `llm_parity.engines`
entry point) and works through `parity engines`, `validate`, `params` and `run` with no edit to the harness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: loop-vs-hf
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  loop: {engine: loop}
  loop-nocache: {engine: loop, options: {use_cache: false}}
  loop-penalised: {engine: loop, params: {repetition_penalty: 1.3}, expect: {tokens: any}}
prompts: ["Hello world, this is", {id: chat, messages: [{role: user, content: "Hi there"}]}]
params: {temperature: 0, max_new_tokens: 12, ignore_eos: true}
expect: {tokens: exact, max_logprob_delta: 0.001}
"""


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("plugin")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target), str(ROOT / "examples" / "loop-engine")],
                   check=True, timeout=300, capture_output=True)
    assert (target / "parity_loop_engine-0.1.0.dist-info" / "entry_points.txt").exists()
    return target


@pytest.fixture(scope="module")
def with_plugin(plugin_path: Path):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_path), old]))
    yield
    if old is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Path:
    return write_scenario(tmp_path_factory.mktemp("loop") / "loop.yaml", SCENARIO)


@pytest.fixture(scope="module")
def loop_run(with_plugin, scenario: Path) -> ParityRun:
    return parity("run", str(scenario), out=scenario.parent / "reports")


def test_the_plugin_is_listed_by_parity_engines(with_plugin) -> None:
    run = parity("engines")
    assert run.code == 0
    line = next(line for line in run.stdout.splitlines() if line.startswith("| loop |"))
    assert "| yes |" in line and "example plugin" in line and "sampling code" in line


def test_validate_and_params_use_its_description_and_sampling_code(with_plugin, scenario: Path) -> None:
    assert parity("validate", str(scenario)).code == 0
    bad = write_scenario(scenario.parent / "bad.yaml", SCENARIO.replace("use_cache: false", "use_cach: false"))
    refused = parity("validate", str(bad))
    assert refused.code == 2 and "engines.loop-nocache.options.use_cach: unknown key" in refused.stderr
    params = parity("params", str(scenario), "--all")
    assert params.code == 0, params.stderr
    assert "argmax" in params.stdout and "loop-penalised: repetition_penalty=1.3 NOT APPLIED" in params.stdout


def test_run_matches_hf_token_for_token(loop_run: ParityRun) -> None:
    assert loop_run.code == 0, loop_run.stdout[-3000:]
    verdicts = loop_run.verdicts.set_index(["engine", "case_id"])
    for engine in ("loop", "loop-nocache"):
        assert set(verdicts.loc[engine].verdict) == {"match"}, verdicts.loc[engine].explanation.tolist()
        assert verdicts.loc[engine].max_abs_logprob_delta.max() < 1e-3
    assert loop_run.meta["engines"]["loop"]["versions"]["transformers"]


def test_params_it_cannot_honour_are_warned_in_the_run(loop_run: ParityRun) -> None:
    assert "loop-penalised: repetition_penalty=1.3 NOT APPLIED: the loop engine has no penalties" in \
        " ".join(loop_run.stdout.split())
    row = loop_run.results.set_index(["engine", "case_id"]).loc[("loop-penalised", "p0")]
    assert any("NOT APPLIED" in w for w in row.warnings)
