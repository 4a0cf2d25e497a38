"""Stopping a process group (harness.core.processes.stop_group), as a worker's kill and a server's stop both do:
SIGTERM, then SIGKILL whatever of the group is left after the grace period, the leader and every process it started
alike. The processes here are shell scripts (no engine)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from adapters.http.server_process import ServerProcess
from harness.core.processes import group_alive, stop_group
from harness.executors.local_process import WorkerHandle

from helpers import wait_for

IGNORES_SIGTERM = "trap '' TERM; echo ready; exec sleep 60"
# a leader that ends on SIGTERM, leaving behind in its group a process it started that does not (an ignored signal
# stays ignored in the processes a shell starts)
LEAVES_A_CHILD = "trap '' TERM; sleep 60 & trap - TERM; echo ready; wait"


def group_leader(script: str) -> subprocess.Popen:
    process = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout.readline() == "ready\n"
    return process


def test_a_leader_that_ignores_sigterm_is_killed_once_the_grace_is_over() -> None:
    process = group_leader(IGNORES_SIGTERM)
    started = time.monotonic()
    stop_group(process, grace_s=0.5)
    assert process.poll() == -signal.SIGKILL and 0.5 <= time.monotonic() - started < 5
    assert not group_alive(process.pid)


def test_a_workers_kill_leaves_nothing_of_its_group(tmp_path: Path) -> None:
    """A worker that ends on SIGTERM while an engine process it started does not: the engine process goes too (the
    worker's kill used to return once the worker itself had ended)."""
    worker = WorkerHandle("w", None, 1, tmp_path / "w.log")
    worker.process = group_leader(LEAVES_A_CHILD)
    worker.kill(grace=0.5)
    assert worker.process.poll() == -signal.SIGTERM and not group_alive(worker.process.pid)


def test_a_servers_stop_leaves_nothing_of_its_group(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = ServerProcess(["sh", "-c", LEAVES_A_CHILD], dict(os.environ), log,
                           tmp_path / "server.pid")
    wait_for(lambda: log.read_text() == "ready\n", timeout=30)
    server.stop(grace=0.5)
    assert server.process.poll() == -signal.SIGTERM and not group_alive(server.process.pid) and server.log.closed
