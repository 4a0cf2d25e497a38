"""A command's side of the fork server (harness.core.fork_server): a forked worker behind a handle that polls, waits
and reports its exit like subprocess.Popen, or a whole run of a module with its output, like subprocess.run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from harness.core.fork_server import ENV_VAR


class ForkedProcess:
    """A worker whose parent is the fork server: the server tells its exit code over the request's connection."""

    def __init__(self, pid: int, stdin: IO[str], replies: IO[str]):
        self.pid, self.stdin = pid, stdin
        self.returncode: int | None = None
        self._ended = threading.Event()
        threading.Thread(target=self._wait_for_exit, args=(replies,), daemon=True).start()

    def _wait_for_exit(self, replies: IO[str]) -> None:
        with replies:
            line = replies.readline()
        # no line: the server died, and Linux sent its workers SIGTERM (harness.core.processes.die_with_parent)
        self.returncode = json.loads(line)["exit"] if line else -signal.SIGTERM
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
        return self.returncode


def fork_worker(module: str, env: dict[str, str], cwd: Path, python: str, stdout: int, stderr: int,
                args: list[str] | None = None) -> ForkedProcess | None:
    """`python -m module args...` forked by the server LLM_PARITY_FORK_SERVER names, with this environment, folder,
    stdout and stderr (file descriptors) and a new stdin pipe; None when no server is named, none answers, or it
    cannot serve this python: then spawn the worker as usual."""
    address = os.environ.get(ENV_VAR)
    if not address:
        return None
    stdin_read, stdin_write = os.pipe()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(address)
        request = {"module": module, "args": args or [], "env": env, "cwd": str(cwd), "python": python,
                   "harness_pid": os.getpid()}
        socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [stdin_read, stdout, stderr])
        replies = connection.makefile("r", encoding="utf-8")
        reply = json.loads(replies.readline() or "{}")
    except (OSError, ValueError):
        reply, replies = {}, None
    finally:
        os.close(stdin_read)
        connection.close()  # the reply stream keeps the socket open
    if "pid" not in reply:
        os.close(stdin_write)
        if replies is not None:
            replies.close()
        return None
    return ForkedProcess(reply["pid"], os.fdopen(stdin_write, "w", encoding="utf-8"), replies)


def run_module(python: str, module: str, text_input: str, timeout: float, env: dict[str, str],
               cwd: Path) -> subprocess.CompletedProcess:
    """`python -m module` fed text_input, its output captured, like subprocess.run: forked by the fork server when one
    is named and serves this python, else spawned."""
    args = [python, "-m", module]
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    process = fork_worker(module, env, cwd, python, out_write, err_write)
    os.close(out_write)
    os.close(err_write)
    if process is None:
        os.close(out_read)
        os.close(err_read)
        return subprocess.run(args, input=text_input, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    with ThreadPoolExecutor(2) as readers:
        stdout, stderr = (readers.submit(_read_all, fd) for fd in (out_read, err_read))
        try:
            with process.stdin:
                process.stdin.write(text_input)
        except BrokenPipeError:  # it ended without reading: its exit code and stderr say why
            pass
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise subprocess.TimeoutExpired(args, timeout) from None
        return subprocess.CompletedProcess(args, code, stdout.result(), stderr.result())


def _read_all(fd: int) -> str:
    with open(fd, encoding="utf-8", errors="replace") as stream:
        return stream.read()
