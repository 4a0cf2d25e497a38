"""The harness side of one worker process: start, talk, time out, stop. A dead worker is a message, not a crash."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.core.forked_process import ForkedProcess, fork_worker
from harness.core.paths import PROJECT_ROOT
from harness.core.processes import stop_group, worker_env
from harness.executors.wire import decode, send

WORKER_MODULE = "harness.executors.worker_main"


class WorkerGone(Exception):
    """The worker exited or was killed; the message says how, with its last stderr lines."""


class WorkerTimeout(Exception):
    pass


def next_message(messages: queue.Queue, timeout: float, why_gone: Callable[[], str]) -> dict[str, Any]:
    """A worker's next message from its queue (None there: it ended): WorkerTimeout when none comes in time."""
    try:
        message = messages.get(timeout=timeout)
    except queue.Empty:
        raise WorkerTimeout(f"no answer within {timeout:g}s") from None
    if message is None:
        raise WorkerGone(why_gone())
    return message


# Linux sends a worker its parent-death signal (harness.core.processes.die_with_parent) when the *thread* that spawned
# it ends, and an engine's thread ends with its phase of the command. Every worker is spawned from this one thread,
# which lives as long as the harness, so a worker kept for a later phase (harness.executors.worker_pool) lives on.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-spawner")


class WorkerHandle:
    def __init__(self, name: str, python: str | None, threads: int, log_path: Path, import_paths: list[str] = ()):
        self.name, self.log_path = name, log_path
        self.python = python or sys.executable
        self.threads, self.import_paths = threads, list(import_paths)
        self.process: subprocess.Popen | ForkedProcess | None = None
        self.spawned_at: float | None = None  # time.monotonic() when the process was spawned
        self.messages: queue.Queue = queue.Queue()

    def start(self) -> None:
        # The protocol pipe is the worker's stdout; the worker moves engine prints to stderr (the log).
        self.log = open(self.log_path, "ab")
        read_fd, write_fd = os.pipe()
        self.spawned_at = time.monotonic()
        env = worker_env(self.threads, self.import_paths)
        self.process = fork_worker(WORKER_MODULE, env, PROJECT_ROOT, self.python, write_fd, self.log.fileno()) or \
            _spawner.submit(subprocess.Popen, [self.python, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                            stdout=write_fd, stderr=self.log, cwd=PROJECT_ROOT, text=True, env=env,
                            start_new_session=True).result()
        os.close(write_fd)
        threading.Thread(target=self._read, args=(os.fdopen(read_fd),), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.messages.put(decode(line))
        self.messages.put(None)  # end of stream: the worker is gone

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def send(self, message: dict[str, Any]) -> None:
        try:
            send(self.process.stdin, message)
        except (BrokenPipeError, OSError):
            raise WorkerGone(self.death_message()) from None

    def receive(self, timeout: float) -> dict[str, Any]:
        return next_message(self.messages, timeout, self.death_message)

    def death_message(self) -> str:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        how = ("still running" if code is None else f"killed by signal {-code} ({signal.Signals(-code).name})"
               if code < 0 else f"exited with code {code}")
        return f"worker {how}; last stderr: {' | '.join(self.last_log_lines())}"

    def last_log_lines(self, n: int = 3) -> list[str]:
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [line.strip() for line in deque(f, maxlen=200) if line.strip()]
        except OSError:
            return []
        return [line[:300] for line in lines[-n:]]

    def stop(self, grace: float = 30.0) -> None:
        """Close politely, then SIGTERM, then SIGKILL the worker's whole process group."""
        self.ask_to_stop()
        self.await_stop(grace)

    def ask_to_stop(self) -> None:
        """Tell the worker to close its engine and end, without waiting: several workers then end side by side."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.send({"op": "close"})
            self.process.stdin.close()
        except (WorkerGone, OSError, ValueError):
            self.kill()

    def await_stop(self, grace: float = 30.0) -> None:
        """Wait for a worker asked to stop to end; past grace, SIGTERM then SIGKILL its process group."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self, grace: float = 5.0) -> None:
        """SIGTERM the worker's process group, then SIGKILL what is left of it after grace: the engine processes it
        started go with it."""
        if self.process is None or self.process.poll() is not None:
            return
        stop_group(self.process, grace)
