"""A worker run in a thread of the harness (a client of a server the harness does not start) behaves as a worker
process does at its edges: a load failure is a `fatal` message and then the worker is gone, its traceback goes to
the engine's worker.log (never the console), a polite stop ends it, and a stopped worker refuses messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.executors.local_process import WorkerGone
from harness.executors.local_thread import WorkerThread

SETUP = {"name": "client", "model_path": "/nonexistent", "dtype": "float32", "workdir": "/nonexistent"}


def test_a_load_failure_is_fatal_then_gone_and_logged(tmp_path: Path, capsys) -> None:
    worker = WorkerThread("client", tmp_path / "worker.log")
    worker.start()
    worker.send({"op": "load", "factory": "adapters.engines.no_such_engine:Engine", "setup": SETUP,
                 "sampling": None, "package": None, "params": []})
    message = worker.receive(30)
    assert message["event"] == "fatal" and "No module named 'adapters.engines.no_such_engine'" in message["error"]
    with pytest.raises(WorkerGone, match="worker thread ended"):
        worker.receive(30)
    assert "Traceback" in (tmp_path / "worker.log").read_text()
    assert "Traceback" not in capsys.readouterr().err
    assert worker.pid is None


def test_a_stopped_worker_thread_ends_and_refuses_messages(tmp_path: Path) -> None:
    worker = WorkerThread("client", tmp_path / "worker.log")
    worker.start()
    worker.stop(grace=10)
    assert not worker.thread.is_alive()
    with pytest.raises(WorkerGone):
        worker.send({"op": "generate", "requests": []})


def test_a_killed_worker_thread_is_gone_at_once(tmp_path: Path) -> None:
    worker = WorkerThread("client", tmp_path / "worker.log")
    worker.start()
    worker.kill()
    with pytest.raises(WorkerGone, match="worker thread stopped"):
        worker.receive(1)
    worker.thread.join(10)
    assert not worker.thread.is_alive()
