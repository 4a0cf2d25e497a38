"""Workers forked from the suite's fork server (tests/engines/conftest.py) against workers spawned as a command
without one spawns them: the same tokens and logprobs from HF and vLLM on SmolLM2; a forked worker dies with the
command that asked for it, as a spawned one does."""

from __future__ import annotations

import os
import sys
import time

import pandas as pd
import pytest

from harness.core.fork_server import ENV_VAR
from harness.core.forked_process import run_module

from helpers import parity, start_parity_run, wait_for, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: forked
model: smollm2-135m
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm}
prompts: ["The capital of France is", "def fibonacci(n):"]
params: {max_new_tokens: 8}
"""
FORKED = "worker forked by the fork server"


def test_forked_and_spawned_workers_give_the_same_results(tmp_path, monkeypatch) -> None:
    scenario = write_scenario(tmp_path / "forked.yaml", SCENARIO)
    forked = parity("run", str(scenario), out=tmp_path / "forked")
    monkeypatch.delenv(ENV_VAR)
    spawned = parity("run", str(scenario), out=tmp_path / "spawned")
    assert forked.code == spawned.code == 0, forked.stderr + spawned.stderr
    for engine in ("hf", "vllm"):
        assert FORKED in (forked.run_dir / "engines" / engine / "worker.log").read_text()
        assert FORKED not in (spawned.run_dir / "engines" / engine / "worker.log").read_text()
    key = ["engine", "case_id"]
    for table, order, columns in (("results", key, ["token_ids", "text"]),
                                  ("steps", [*key, "step"], ["chosen_logprob", "top_ids", "top_logprobs"])):
        forked_rows, spawned_rows = (pd.read_parquet(r.run_dir / f"{table}.parquet").sort_values(order)
                                     .reset_index(drop=True)[order + columns] for r in (forked, spawned))
        assert len(forked_rows) > 0
        # bit for bit: the same libraries on the same thread count
        assert forked_rows.astype(str).equals(spawned_rows.astype(str)), table


def test_forked_worker_dies_with_its_command(tmp_path) -> None:
    slow = SCENARIO.replace("max_new_tokens: 8", "max_new_tokens: 2000, ignore_eos: true").replace(
        "vllm: {engine: vllm}", "hf-again: {engine: hf}")
    run = start_parity_run(write_scenario(tmp_path / "slow.yaml", slow), tmp_path / "reports")
    engine_dirs = lambda: list((tmp_path / "reports").glob("*/engines/hf"))  # noqa: E731
    # engine.json is written once the engine is loaded: the worker is generating, and writes nothing for a while
    wait_for(lambda: run.poll() is not None or (engine_dirs() and (engine_dirs()[0] / "engine.json").exists()),
             timeout=120)
    assert run.poll() is None, run.communicate()
    assert FORKED in (engine_dirs()[0] / "worker.log").read_text()
    worker = int((engine_dirs()[0] / "worker.pid").read_text())
    run.kill()
    run.wait(30)
    deadline = time.monotonic() + 10  # the first results, which would fail to reach a dead command, are minutes away
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    assert not _alive(worker), f"worker {worker} outlived the command that asked for it"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, waiting for the fork server to reap it
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_forked_process_ends_without_the_preloaded_modules_exit_noise(tmp_path) -> None:
    """The server imported vLLM and with it triton, whose extension prints a "nanobind: leaked ..." report at
    interpreter exit: a forked process's stderr (a worker's log, the tail of an error message) holds only its own."""
    (tmp_path / "broken.py").write_text("import no_such_module\n")
    done = run_module(sys.executable, "broken", "", 60, {**os.environ, "PYTHONPATH": str(tmp_path)}, tmp_path)
    assert done.returncode == 1 and FORKED in done.stderr
    assert done.stderr.rstrip().endswith("ModuleNotFoundError: No module named 'no_such_module'"), done.stderr[-500:]
