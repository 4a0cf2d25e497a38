"""`parity run --resume`: a real run is interrupted at several points (Ctrl-C; SIGKILL of the harness, of a worker,
of the server it started: llama.cpp's, which starts in seconds), then resumed in its directory. Journaled results are
reused, not recomputed, and the run ends with the content of a run that was never interrupted. The killed server is
frozen first, so it dies with cases still pending however loaded the machine is; its finished cases are kept."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.core.processes import group_alive

from helpers import ParityRun, journal_lines, parity, start_parity_run, wait_for, write_scenario

pytestmark = pytest.mark.engines

# 300 tokens: about 2.7 s a case for HF at batch 1 on the tiny model, long enough to kill or interrupt inside a case;
# four prompts leave the killed-worker test a case after the one it kills (eight cost every test twice the time)
LONG = """\
model: tiny-llama
engines:
  hf: {engine: hf, reference: true, batch_size: 1}
  victim: {engine: hf, batch_size: 1, params: {repetition_penalty: 1.1}, expect: {tokens: any}}
prompts: ["one", "two", "three", "four"]
params: {max_new_tokens: 300, ignore_eos: true}
"""

# 16 tokens: llama-cpp-python's server sorts the whole vocabulary in Python for every token's logprobs (about 0.18 s
# a token on an AVX2 EPYC, the model's own step is 2 ms); the frozen server, not the length, keeps cases pending
SERVED = """\
name: served
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  served: {engine: llama.cpp-server, options: {concurrency: 1, retries: 1}, expect: {tokens: any}}
prompts: ["one", "two", "three", "four"]
params: {temperature: 0, max_new_tokens: 16, ignore_eos: true}
"""

# run.json keys that are timings, pids, timestamps or where the run and its scenario file are; every other key
# (the scenario's text included) must be equal
VOLATILE = {"run_id", "scenario", "started", "finished", "wall_s", "phases", "resumed"}
VOLATILE_ENGINE = {"load_s", "worker_pids", "restarts", "phases"}


def content(run_dir: Path) -> dict:
    """What a run says, without timings, pids and timestamps."""
    meta = json.loads((run_dir / "run.json").read_text())
    meta = {k: v for k, v in meta.items() if k not in VOLATILE}
    meta["engines"] = {n: {k: v for k, v in e.items() if k not in VOLATILE_ENGINE} for n, e in meta["engines"].items()}
    for engine in meta["engines"].values():  # the served engine's startup time is a timing
        engine["versions"].pop("server_startup_s", None)
        engine["versions"].pop("server", None)  # its URL, and where it listened, name the port it was given
        engine["versions"].pop("server_listening", None)
    summary = (run_dir / "summary.md").read_text()
    return {"meta": meta, "summary verdicts": summary[summary.index("## Verdicts"):],
            "results": pd.read_parquet(run_dir / "results.parquet").drop(columns=["timings"]),
            "steps": pd.read_parquet(run_dir / "steps.parquet"),
            "verdicts": pd.read_parquet(run_dir / "verdicts.parquet")}


def journal(run_dir: Path, engine: str) -> dict[str, str]:
    """case id -> its journal line, as written."""
    lines = (run_dir / "engines" / engine / "results.jsonl").read_text().splitlines()
    return {json.loads(line)["case_id"]: line for line in lines if line.endswith("}")}


def assert_same_content(resumed: Path, uninterrupted: Path) -> None:
    got, want = content(resumed), content(uninterrupted)
    assert got["meta"] == want["meta"]
    assert got["summary verdicts"] == want["summary verdicts"]
    for name in ("results", "steps", "verdicts"):
        pd.testing.assert_frame_equal(got[name], want[name], obj=name)


def resume(run_dir: Path) -> ParityRun:
    run = parity("run", "--resume", str(run_dir))
    return ParityRun(run.code, run.stdout, run.stderr, run_dir)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    run = parity("run", str(write_scenario(tmp / "long.yaml", LONG)), out=tmp / "reports")
    assert run.code == 0, run.stdout[-2000:]
    return run.run_dir


def interrupted_run(tmp_path: Path, scenario: str, engine: str, after: int, *args: str):
    out = tmp_path / "reports"
    proc = start_parity_run(write_scenario(tmp_path / "long.yaml", scenario), out, *args)
    wait_for(lambda: journal_lines(out, engine) >= after, timeout=300)
    return proc, next(out.iterdir())


def test_ctrl_c_then_resume(tmp_path: Path, uninterrupted: Path) -> None:
    # one engine at a time, so the victim always runs in the worker hf finished with: Ctrl-C once killed it through
    # hf's run, which still held it, and the victim's thread, not yet told to stop, journaled an engine error
    proc, run_dir = interrupted_run(tmp_path, LONG, "victim", 2, "--parallel", "1")
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and f"parity run --resume {run_dir}" in stdout
    before = {**journal(run_dir, "hf"), **{f"victim/{k}": v for k, v in journal(run_dir, "victim").items()}}
    assert 2 <= len(before) < 8

    run = resume(run_dir)
    assert run.code == 0, run.stdout[-2000:]
    assert f"{len(before)} of 8 results reused, {8 - len(before)} to run" in run.stdout
    after = {**journal(run_dir, "hf"), **{f"victim/{k}": v for k, v in journal(run_dir, "victim").items()}}
    assert all(after[case] == line for case, line in before.items())  # reused as written: not recomputed
    assert_same_content(run_dir, uninterrupted)
    assert len(run.meta["resumed"]) == 1


def test_killed_harness_then_resume_skips_a_torn_line(tmp_path: Path, uninterrupted: Path) -> None:
    proc, run_dir = interrupted_run(tmp_path, LONG, "victim", 3)
    proc.kill()
    proc.communicate(timeout=60)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    journaled = journal(run_dir, "victim")
    with open(run_dir / "engines" / "victim" / "results.jsonl", "a") as f:  # what a kill mid-write leaves
        f.write(next(iter(journaled.values()))[:70])

    run = resume(run_dir)
    assert run.code == 0, run.stdout[-2000:]
    assert "1 damaged journal line(s) skipped" in run.stdout
    assert all(journal(run_dir, "victim")[case] == line for case, line in journaled.items())
    assert_same_content(run_dir, uninterrupted)


def _computing(pid: int, window: float = 0.3) -> bool:
    """Whether a process spends most of a short window on the CPU (a worker inside a case, not waiting for one)."""
    def ticks() -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks

    before = ticks()
    time.sleep(window)
    return (ticks() - before) / os.sysconf("SC_CLK_TCK") > window / 2


def test_killed_worker_then_resume_runs_its_case_again(tmp_path: Path, uninterrupted: Path) -> None:
    proc, run_dir = interrupted_run(tmp_path, LONG, "victim", 2)
    pid = int((run_dir / "engines" / "victim" / "worker.pid").read_text())
    # killed inside a case, not between two (a worker killed while it waits for its next case costs no case): on a
    # loaded machine a fixed delay after the journal's second line could land between cases
    wait_for(lambda: _computing(pid), timeout=60)
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=300)
    assert proc.returncode == 1  # the run went on; the killed worker's case is an engine error
    killed = pd.read_parquet(run_dir / "verdicts.parquet").query("verdict == 'engine_error'")
    assert len(killed) == 1 and "killed by signal 9" in killed.explanation.iloc[0]

    run = resume(run_dir)
    assert run.code == 0, run.stdout[-2000:]
    assert "7 of 8 results reused, 1 to run" in run.stdout
    assert_same_content(run_dir, uninterrupted)


def test_resuming_a_finished_run_changes_nothing(uninterrupted: Path) -> None:
    before = content(uninterrupted)
    run = resume(uninterrupted)
    assert run.code == 0 and "8 of 8 results reused, 0 to run" in run.stdout
    after = content(uninterrupted)
    assert after["meta"] == before["meta"]
    for name in ("results", "steps", "verdicts"):
        pd.testing.assert_frame_equal(after[name], before[name], obj=name)


def test_killed_server_then_resume(tmp_path: Path) -> None:
    whole = parity("run", str(write_scenario(tmp_path / "whole.yaml", SERVED)), out=tmp_path / "whole")
    assert whole.code == 0, whole.stdout[-2000:]
    proc, run_dir = interrupted_run(tmp_path, SERVED, "served", 1)
    server_pid = int((run_dir / "engines" / "served" / "server.pid").read_text())
    os.kill(server_pid, signal.SIGSTOP)  # frozen: it answers nothing more, however loaded the machine is
    time.sleep(0.5)  # an answer already on its way is journalled
    assert journal_lines(tmp_path / "reports", "served") < 4  # cases are still pending when the server dies
    os.kill(server_pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-2000:]
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    failed = verdicts.query("verdict == 'engine_error'")
    assert len(verdicts) == 4 and 1 <= len(failed) <= 3  # the journalled case is kept
    assert all("server process killed by signal 9 (SIGKILL)" in e for e in failed.explanation)
    wait_for(lambda: not group_alive(server_pid), timeout=30)  # its whole process group went with it

    run = resume(run_dir)
    assert run.code == 0, run.stdout[-2000:]
    assert f"{8 - len(failed)} of 8 results reused, {len(failed)} to run" in run.stdout
    assert_same_content(run_dir, whole.run_dir)


def test_a_run_still_being_written_is_not_resumed(tmp_path: Path) -> None:
    proc, run_dir = interrupted_run(tmp_path, LONG, "victim", 1)
    try:
        run = resume(run_dir)
        assert run.code == 2 and "another parity process" in run.stderr and "is writing this run" in run.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
