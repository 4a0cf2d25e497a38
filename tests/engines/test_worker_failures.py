"""A worker that is killed, hangs or is interrupted becomes a recorded result; nothing computed is lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.core.processes import group_alive

from helpers import journal_lines, parity, start_parity_run, wait_for, write_scenario

pytestmark = pytest.mark.engines

# four prompts: a case before the killed one and cases after it (eight cost the killed-worker test twice the CPU)
LONG = """\
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  victim: {engine: hf, batch_size: 1}
prompts: ["one", "two", "three", "four"]
params: {max_new_tokens: 400, ignore_eos: true}
"""


def test_killed_worker_costs_only_its_case(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    proc = start_parity_run(write_scenario(tmp_path / "s.yaml", LONG), out)
    wait_for(lambda: journal_lines(out, "victim") >= 1, timeout=120)
    time.sleep(1)  # into the next case: a kill between a result and its batch's end would cost no case
    pid = int(next(out.glob("*/engines/victim/worker.pid")).read_text())
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-2000:]
    run_dir = next(out.iterdir())
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    errors = verdicts[verdicts.verdict == "engine_error"]
    assert len(errors) == 1, verdicts[["case_id", "verdict", "explanation"]]
    assert "killed by signal 9 (SIGKILL)" in errors.explanation.iloc[0]
    assert set(verdicts.verdict) == {"match", "engine_error"}  # earlier and later cases are kept and judged
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["engines"]["victim"]["restarts"] == 1 and len(meta["engines"]["victim"]["worker_pids"]) == 2


def test_case_timeout_kills_and_reports(tmp_path: Path) -> None:
    # the victim's cases are long (400 tokens: no answer within 0.05 s); the reference's need not be
    scenario = LONG.replace("victim: {engine: hf, batch_size: 1}",
                            "victim: {engine: hf, batch_size: 1, timeouts: {case: 0.05}, params: {max_new_tokens: 400}}"
                            ).replace("params: {max_new_tokens: 400, ignore_eos: true}",
                                      "params: {max_new_tokens: 8, ignore_eos: true}")
    run = parity("run", str(write_scenario(tmp_path / "s.yaml", scenario)), out=tmp_path / "reports")
    assert run.code == 1
    errors = run.verdicts.explanation.tolist()
    assert sum(e.startswith("victim: engine error: timed out (no answer within 0.05s); worker killed")
               for e in errors) == 3
    assert sum("not run: the worker failed 3 times" in e for e in errors) == 1


def test_interrupt_stops_every_worker_and_keeps_results(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    proc = start_parity_run(write_scenario(tmp_path / "s.yaml", LONG), out)
    wait_for(lambda: journal_lines(out, "victim") >= 1, timeout=120)
    pids = [int(p.read_text()) for p in out.glob("*/engines/*/worker.pid")]
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "INTERRUPTED" in stdout
    wait_for(lambda: not any(group_alive(pid) for pid in pids), timeout=15)
    run_dir = next(out.iterdir())
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    results = pd.read_parquet(run_dir / "results.parquet")
    assert (results.status == "ok").sum() >= 1  # what was computed before Ctrl-C is in the results


def test_killed_harness_takes_its_workers_along(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    proc = start_parity_run(write_scenario(tmp_path / "s.yaml", LONG), out)
    wait_for(lambda: journal_lines(out, "victim") >= 1, timeout=120)
    pids = [int(p.read_text()) for p in out.glob("*/engines/*/worker.pid")]
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: not any(group_alive(pid) for pid in pids), timeout=15)


BROKEN = """\
model: {model}
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
  vllm-engine-core: {{engine: vllm, options: {{multiprocessing: true}}}}
  vllm-tp2: {{engine: vllm, options: {{tensor_parallel_size: 2}}}}
  vllm-server: {{engine: vllm-server}}
  llama.cpp: {{engine: llama.cpp, options: {{gguf: {gguf}}}}}
  llama.cpp-server: {{engine: llama.cpp-server, options: {{gguf: {gguf}}}}}
prompts: ["hi"]
params: {{max_new_tokens: 2, temperature: 0}}
"""


def _processes_naming(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in words:
            found.append(f"{cmdline.parent.name}: {words[:200]}")
    return found


def _processes_inheriting(text: str) -> list[str]:
    """Processes whose environment mentions `text` (a run's folder: what an engine's children inherit, vLLM's
    tensor-parallel rank workers included, whose command lines name nothing of the run)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if text.encode() in environ.read_bytes():
                found.append(environ.parent.name)
        except OSError:
            continue
    return found


def test_a_failed_load_leaves_no_file_socket_or_process_behind(tmp_path: Path) -> None:
    """Every engine kind fails its load for real (weights cut in half; a GGUF that is only its magic): each is an
    engine error, and afterwards no worker, engine core or server process lives, and no /tmp folder of theirs (vLLM's
    socket folders, named after their process) is left."""
    from harness import models

    broken = tmp_path / "broken-model"
    shutil.copytree(models.resolve("tiny-llama", "float32"), broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    run = parity("run", str(write_scenario(tmp_path / "s.yaml", BROKEN.format(model=broken, gguf=gguf))),
                 "--allow-missing", out=tmp_path / "reports")
    assert run.code == 1, run.stderr[-2000:]
    meta = json.loads((run.run_dir / "run.json").read_text())
    ran = [name for name, engine in meta["engines"].items() if engine["worker_pids"]]
    # llama.cpp where it is installed
    assert {"hf", "vllm", "vllm-engine-core", "vllm-tp2", "vllm-server"} <= set(ran), ran
    results = run.results.set_index("engine")
    assert all(results.loc[name, "status"] == "error" and "could not load" in results.loc[name, "error"]
               for name in ran), results[["status", "error"]]
    pids = [pid for name in ran for pid in meta["engines"][name]["worker_pids"]]
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], pids
    assert not _processes_naming(str(broken)) and not _processes_naming(str(gguf))
    assert not _processes_inheriting(str(run.run_dir)), "a process of the run lives on"
    left = [p.name for p in Path("/tmp").iterdir() if any(f"-{pid}-" in p.name for pid in pids)]
    assert not left, left
