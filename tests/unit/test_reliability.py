"""Bad input found by the fuzz suite, pinned as plain examples; what a resumed run reuses; servers bound to loopback
unless a scenario opts in. No engine runs here."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from adapters.engines.vllm_server import Options as VllmServerOptions
from harness.core.errors import ConfigError
from harness.core.types import EngineSetup, Request, Result
from harness.core.vocabulary import SamplingParams
from harness.plan.plans import EnginePlan
from harness.plan.requests import reusable, still_to_run
from harness.report.summary import exposed_servers
from harness.rundir.journal import read_journal
from harness.rundir.store import EngineMeta, RunMeta, write_meta
from harness.scenario.spec import load

from helpers import ROOT, parity_in_process, write_scenario

VALID = """\
model: tiny-llama
engines:
  ref: {engine: hf, reference: true}
  other: {engine: hf}
prompts: ["a", "b"]
"""


@pytest.mark.parametrize("text, words", [
    (b"model: \xff\xfe", "not UTF-8 text (byte 0xff at offset 7): save the scenario as UTF-8 YAML"),
    (VALID.replace("  other: {engine: hf}", "  other: {engine: hf}\n  ref: {engine: vllm}").encode(),
     ":5: key 'ref' is given twice in one mapping (first on line 3)"),
    ((VALID + "grid: {top_k: [" + ", ".join(map(str, range(1, 5002))) + "]}\n").encode(),
     ":6: grid: 2 prompts x 5001 grid points make 10002 cases, more than 10000"),
    (VALID.replace('["a", "b"]', "!!python/object/apply:os.system ['true']").encode(), "invalid YAML"),
])
def test_bad_scenario_files_are_one_line_errors(tmp_path: Path, text: bytes, words: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(text)
    done = parity_in_process("validate", str(path))
    assert done.code == 2 and words in done.stderr and str(path) in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not done.traceback


def test_usage_errors_are_one_line_naming_the_help(tmp_path: Path) -> None:
    for args, words in ((["run", "--bogus"], "No such option: --bogus"),
                        (["run", "--parallel", "x", "s.yaml"], "Invalid value for '--parallel'"),
                        (["run"], "nothing to run: give scenario file(s), or --resume RUN_DIR"),
                        (["run", "s.yaml", "--resume", str(tmp_path)], "--resume continues a run with the scenario")):
        done = parity_in_process(*args)
        assert done.code == 2 and words in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1


def test_an_error_quoting_control_characters_stays_one_line(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "s.yaml", VALID.replace("engine: hf}", 'engine: "h\\nf\\u001b[31m"}', 1))
    done = parity_in_process("validate", str(path))
    assert done.code == 2 and "unknown engine 'h f\\x1b[31m'" in done.stderr  # newline folded, escape shown
    assert len(done.stderr.strip().splitlines()) == 1 and "\x1b" not in done.stderr


def _plan(tmp_path: Path, cases: list[str]) -> EnginePlan:
    setup = EngineSetup(name="ref", model_path=tmp_path, dtype="float32", workdir=tmp_path / "engines" / "ref")
    requests = [Request(case_id=c, prompt_ids=[1], params=SamplingParams()) for c in cases]
    return EnginePlan(engine="hf", factory="m:C", package=None, sampling=None, setup=setup, python=None, threads=1,
                      batch_size=8, requests=requests, load_timeout=1, case_timeout=1)


def test_a_journal_is_read_back_without_its_torn_line_and_errors_run_again(tmp_path: Path) -> None:
    ok = Result(case_id="a", engine="ref", status="ok", token_ids=[3])
    failed = Result.engine_error("b", "ref", "engine error: worker killed by signal 9 (SIGKILL)")
    foreign = Result(case_id="zz", engine="ref", status="ok")
    lines = [json.dumps(r.model_dump(mode="json")) for r in (ok, failed, foreign)]
    journal = tmp_path / "results.jsonl"
    journal.write_text("\n".join(lines) + "\n" + lines[0][:25])
    results, skipped = read_journal(journal)
    assert set(results) == {"a", "b", "zz"} and skipped == 1
    plan = _plan(tmp_path, ["a", "b", "c"])
    kept = reusable(plan, results)
    assert list(kept) == ["a"]  # the engine error and the unknown case are not reused
    left = still_to_run([plan], {("ref", case): r for case, r in kept.items()})
    assert [r.case_id for r in left[0].requests] == ["b", "c"]
    assert still_to_run([_plan(tmp_path, ["a"])], {("ref", "a"): ok}) == []  # nothing left: no worker


def test_a_group_of_requests_runs_again_whole_when_one_of_them_is_missing(tmp_path: Path) -> None:
    plan = _plan(tmp_path, ["a", "b", "c", "d"])
    plan = replace(plan, groups=[plan.requests[:2], plan.requests[2:]])  # e.g. an invariance batch of two
    ok = Result(case_id="a", engine="ref", status="ok")
    done = {("ref", "a"): ok, ("ref", "c"): ok, ("ref", "d"): ok}
    [left] = still_to_run([plan], done)
    assert [[r.case_id for r in g] for g in left.groups] == [["a", "b"]]
    assert [r.case_id for r in left.requests] == ["a", "b"]


def test_a_run_written_before_resume_existed_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    write_meta(run, RunMeta(run_id="run", scenario="s.yaml", scenario_name="s", scenario_text=VALID, model="m",
                            reference="ref", started="now"))
    done = parity_in_process("run", "--resume", str(run))
    assert done.code == 2 and "written by a version without --resume: run the scenario again" in done.stderr


def test_servers_bind_loopback_unless_the_scenario_allows_remote(tmp_path: Path) -> None:
    assert VllmServerOptions().bind == "127.0.0.1"
    with pytest.raises(ValueError, match="bind 0.0.0.0 is not a loopback address"):
        VllmServerOptions(bind="0.0.0.0")
    assert VllmServerOptions(bind="0.0.0.0", allow_remote=True).bind == "0.0.0.0"
    path = write_scenario(tmp_path / "s.yaml", VALID.replace("other: {engine: hf}",
                                                             "other: {engine: vllm-server, options: {bind: 0.0.0.0}}"))
    with pytest.raises(ConfigError, match=r"s.yaml:4: engines.other.options: .*set allow_remote: true"):
        load(path)


def test_reports_name_a_server_that_listened_beyond_loopback() -> None:
    def meta(listening: str) -> RunMeta:
        engine = EngineMeta(engine="vllm-server", dtype="float32", threads=1, python="p", model_path="m",
                            versions={"server_listening": listening})
        return RunMeta(run_id="r", scenario="s", scenario_name="s", scenario_text="", model="m", reference="hf",
                       started="now", engines={"served": engine})

    assert exposed_servers(meta("127.0.0.1:8000")) == [] and exposed_servers(meta("[::1]:8000")) == []
    assert exposed_servers(meta("0.0.0.0:8000"))[0].startswith("served: the server the harness started listened on "
                                                               "0.0.0.0:8000, not on a loopback address")


PROBE = """
import subprocess, sys, time
from harness.core.processes import descendants, stop_descendants
ignores = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
server = subprocess.Popen([sys.executable, "-c", ignores], start_new_session=True)
plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
deadline = time.monotonic() + 20
while len(descendants(os.getpid())) < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
print(len(descendants(os.getpid())))
stop_descendants(grace_s=1.0)
print(len(descendants(os.getpid())), server.poll() is not None, plain.poll() is not None)
"""


def test_stop_descendants_ends_children_in_other_sessions_and_their_children() -> None:
    """What a failed load leaves running (a server in a session of its own, with a child of its own; a child that
    ignores SIGTERM) is ended by the worker before it reports the failure. In a process of its own: this one's
    children (the suite's fork server) are not the test's to stop."""
    done = subprocess.run([sys.executable, "-c", "import os" + PROBE], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "0", "True", "True"], done.stdout
