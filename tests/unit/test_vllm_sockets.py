"""vLLM's socket folders under /tmp: one per process, and those of processes that were killed are removed by the next
engine that needs one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.engines import vllm_sockets
from adapters.engines.vllm_sockets import remove_socket_dir, socket_dir


def a_dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_processes_folder_goes_and_a_live_ones_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_sockets, "ROOT", tmp_path)
    orphaned = tmp_path / f"parity-rpc-{a_dead_pid()}-abcd"
    alive = tmp_path / f"parity-rpc-{os.getppid()}-efgh"
    unrelated = tmp_path / "parity-rpc-notapid"
    for folder in (orphaned, alive, unrelated):
        folder.mkdir()
    made = socket_dir(tmp_path / ("a-run-directory-too-deep-for-a-socket-" * 2))
    assert made.parent == tmp_path and made.name.startswith(f"parity-rpc-{os.getpid()}-")
    assert not orphaned.exists() and alive.exists() and unrelated.exists()
    remove_socket_dir(made)
    assert not made.exists()


def test_a_short_run_directory_holds_its_own_sockets() -> None:
    assert socket_dir(Path("/reports/run")) == Path("/reports/run/cache/rpc")
