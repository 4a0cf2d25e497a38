"""Start, watch and stop a server process on 127.0.0.1: free port, readiness poll, log file, no orphans.

The server gets its own process group (so stopping it also stops the engine processes it spawns) and a
parent-death signal (so it goes down when its worker dies, even by SIGKILL).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from harness.core.forked_process import ForkedProcess, fork_worker
from harness.core.processes import die_with_parent, stop_group


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, pid_path: Path):
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.process: subprocess.Popen | ForkedProcess = forked(cmd, env, self.log.fileno()) or subprocess.Popen(
            cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent)
        pid_path.write_text(str(self.process.pid))

    def gone(self) -> str | None:
        """None while the server runs; otherwise how it ended, with its last log lines."""
        code = self.process.poll()
        if code is None:
            return None
        how = f"killed by signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exited with code {code}"
        return f"server process {how}; last log: {' | '.join(self.last_log_lines())}"

    def last_log_lines(self, n: int = 2) -> list[str]:
        try:
            lines = [line.strip() for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return []
        return [line[:300] for line in lines[-n:]]

    def wait_ready(self, url: str, timeout: float, headers: dict[str, str] | None = None) -> float:
        """Poll url (with headers: a server that wants a key guards its health path too) until it answers 200;
        returns seconds waited. Raises RuntimeError if the server dies or is slow."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            gone = self.gone()
            if gone:
                raise RuntimeError(f"server did not start: {gone}")
            try:
                if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server not ready within {timeout:g}s; log: {self.log_path}")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the server's process group, then SIGKILL whatever is left after the grace period."""
        stop_group(self.process, grace)
        self.process.poll()
        self.log.close()


def forked(cmd: list[str], env: dict[str, str], log: int) -> ForkedProcess | None:
    """A `python -m module ...` server forked by the fork server, when one is named (harness.core.forked_process):
    vLLM's API server then skips its 10-17 s of imports. It gets its own session and dies with this process, as a
    spawned one does; None: spawn it."""
    if len(cmd) < 3 or cmd[1] != "-m":
        return None
    process = fork_worker(cmd[2], env, Path.cwd(), cmd[0], log, log, args=cmd[3:])
    if process is not None:
        process.stdin.close()  # what it reads is an empty stdin, as from /dev/null
    return process
