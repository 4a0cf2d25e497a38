"""The harness side of a worker that runs in a thread of the harness instead of a process of its own: for the client of
a server the harness does not start (an attached `openai` engine). Such a client only sends HTTP requests, so a process
would cost an interpreter, its imports and its exit (about 0.8 s of CPU) for nothing; the server it talks to is where a
crash could happen. It runs the same worker loop (harness.executors.worker_main.Worker) over the same protocol, the
messages passing through queues instead of pipes; what it logs goes to the engine's worker.log."""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

from harness.executors.local_process import WorkerGone, next_message
from harness.executors.wire import decode


class _Outbox:
    """The worker loop's protocol stream: each line it writes is a message for the harness."""

    def __init__(self, messages: queue.Queue):
        self.messages = messages

    def write(self, text: str) -> None:
        for line in text.splitlines():
            self.messages.put(decode(line))

    def flush(self) -> None:
        pass


class WorkerThread:
    pid = None  # no process: nothing to signal, no worker.pid

    def __init__(self, name: str, log_path: Path):
        self.name, self.log_path = name, log_path
        self.spawned_at: float | None = None
        self.inbox: queue.Queue = queue.Queue()  # protocol lines for the worker loop; None ends it
        self.messages: queue.Queue = queue.Queue()  # its messages; None once it ended
        self.thread: threading.Thread | None = None
        self.loop: Any = None  # the worker loop (harness.executors.worker_main.Worker) once started
        self.ended = ""
        self.killed = False

    def start(self) -> None:
        self.spawned_at = time.monotonic()
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"worker {self.name}")
        self.thread.start()

    def _serve(self) -> None:
        from harness.executors.worker_main import Worker, short_error

        with open(self.log_path, "a", buffering=1) as log:  # line by line: readable while it runs
            try:
                self.loop = Worker(_Outbox(self.messages), self.spawned_at, log)
                self.loop.serve(iter(self.inbox.get, None))
                self.ended = self.ended or "worker thread ended"
            except BaseException as exc:  # the loop reports engine errors itself: this is the loop failing
                self.ended = self.ended or f"worker thread failed: {short_error(exc)}"
            finally:
                self.messages.put(None)

    def send(self, message: dict[str, Any]) -> None:
        if self.thread is None or not self.thread.is_alive():
            raise WorkerGone(self.ended or "worker thread not running")
        self.inbox.put(json.dumps(message))

    def receive(self, timeout: float) -> dict[str, Any]:
        return next_message(self.messages, timeout, lambda: self.ended)

    def stop(self, grace: float = 30.0) -> None:
        """Close politely: the loop closes the engine and ends; a request still in flight ends with its timeout.
        After kill() nothing is awaited (Ctrl-C): the daemon thread ends by itself or with the harness."""
        if self.thread is not None and self.thread.is_alive() and not self.killed:
            self.inbox.put(json.dumps({"op": "close"}))
            self.inbox.put(None)
            self.thread.join(grace)

    def kill(self) -> None:
        """No thread can be killed: the harness stops listening at once (what the loop sends after this is never
        read) and the loop ends after the batch it is in, or with the harness. (Closing the engine's connections
        here would wait for the requests in flight.)"""
        self.ended, self.killed = self.ended or "worker thread stopped", True
        self.inbox.put(None)
        self.messages.put(None)
