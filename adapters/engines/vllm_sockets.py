"""Where vLLM's ZMQ sockets live: the run directory when its path is short enough for a Unix socket, else a short
private folder under /tmp, named after the process that made it so that a later vLLM engine can remove the folders
of processes that were killed before they could remove their own."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "parity-rpc-"
ROOT = Path("/tmp")


def socket_dir(workdir: Path) -> Path:
    """The run directory's cache/rpc when its path leaves room for a socket's name (107 bytes in all), else a new
    /tmp/parity-rpc-PID-XXXX that remove_socket_dir removes."""
    inside = workdir / "cache" / "rpc"
    if len(str(inside.resolve())) <= 50:
        return inside
    remove_orphaned_socket_dirs()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=ROOT))


def remove_socket_dir(path: Path) -> None:
    if path.name.startswith(PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def remove_orphaned_socket_dirs() -> None:
    """The /tmp socket folders whose process has gone (a worker killed at a timeout, a crash, a kill -9)."""
    for path in ROOT.glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
