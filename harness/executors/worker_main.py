"""Worker process: loads one engine once and serves generate (or trace) requests from the harness. A worker of an
engine whose description allows it (worker_reuse) may then be told to unload it, and later to load the next engine of
the same kind: the first is closed, and the worker's log moves to the new engine's.

Run as `python -m harness.executors.worker_main` by the harness (possibly with another interpreter); it speaks
harness.executors.wire. Protocol messages go to a duplicate of the original stdout; fd 1 is pointed at stderr so that
anything the engine prints lands in the worker log instead of corrupting the protocol. However the worker ends
(close, EOF, SIGTERM, the harness dying), the engine is closed, so a server it started is stopped.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from harness.core.processes import die_with_parent, exit_before_finalisation, stop_descendants
from harness.executors.wire import decode, send


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through Worker.serve's finally: the engine closes


@contextmanager
def long_lived_objects() -> Iterator[None]:
    """Importing and loading an engine makes objects that live as long as the worker (about 680,000 for vLLM). The
    cyclic collector would traverse them over and over while they are made, and again in every gc.collect() the
    engine itself calls while loading: measured, 2 s of a 10-11 s vLLM import and load. Rare collections meanwhile,
    then those objects frozen out of every later collection."""
    thresholds = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.freeze()
        gc.set_threshold(*thresholds)


def short_error(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:600]


class Worker:
    def __init__(self, protocol: IO[str], started: float, log: IO[str] | None = None):
        self.protocol = protocol
        self.log = log or sys.stderr  # where tracebacks go: the worker log (a process's stderr is that file)
        self.started = started  # time.monotonic() when main() began: comparable with the harness's clock
        self.engine: Any = None
        self.load_message: dict[str, Any] = {}
        self.planned: Any = None  # effective params of every case the harness will send, computing since load

    def serve(self, lines) -> int:
        try:
            for line in lines:
                message = decode(line)
                if message["op"] == "load":
                    self.write_log_to(message.get("log"))
                    if not self.load(message):
                        return 1
                if message["op"] == "unload":  # kept idle for a later engine: free the memory meanwhile
                    self.unload()
                if message["op"] in ("generate", "trace", "score"):
                    self.run_batch(message["op"], message["requests"])
                if message["op"] == "close":
                    return 0
            return 0
        finally:
            if self.engine is not None:
                self.engine.close()

    def unload(self) -> None:
        """Close the engine loaded (before another load, or to free its memory while kept idle)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
            gc.unfreeze()  # the engine's objects were frozen after its load: collectable again
            gc.collect()

    def write_log_to(self, log_path: str | None) -> None:
        """A worker serving another plan writes to that plan's log from here on."""
        if log_path:
            sys.stderr.flush()
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 2)
            os.close(log)

    def load(self, message: dict[str, Any]) -> bool:
        """message: {"factory": "module:Class", "setup": EngineSetup, "sampling": SamplingCode fields or None,
        "package": the engine package of an in-process engine, imported first so that its import time is reported apart
        from loading, "params": the distinct params of the engine's cases, whose effective params start at once,
        "log": where the worker writes from now on, for a worker reused from another engine, "keep": the engine
        loaded here has this plan's configuration: it serves the plan as loaded if it can (Engine.reuse)}."""
        import importlib

        from adapters.registry import engine_class
        from harness.core.types import EngineSetup
        from harness.core.vocabulary import SamplingParams

        self.load_message = message
        try:
            setup = EngineSetup.model_validate(message["setup"])
            before = imported = time.monotonic()
            loads = not (message.get("keep") and self.kept(setup))
            self.note(f"{setup.name}: loading {setup.model_path} in {setup.dtype} ({message['factory']})" if loads
                      else f"{setup.name}: served by the engine loaded in this worker")
            if loads:
                self.unload()
                with long_lived_objects():
                    if message.get("package"):
                        importlib.import_module(message["package"])
                        gc.freeze()  # not traversed by the engine's own gc.collect() calls while it loads
                    imported = time.monotonic()
                    self.engine = engine_class(message["factory"])(setup)
            loaded = time.monotonic()
            if loads:
                self.note(f"{setup.name}: ready in {loaded - before:.1f} s")
            send(self.protocol, {"event": "ready", "versions": self.engine.versions(), "load_s": loaded - before,
                                 "model_loaded": loads, "phases": {"main_at": self.started,
                                                                   "imports_s": imported - before,
                                                                   "load_s": loaded - imported}})
            self.planned = self.effective([SamplingParams.model_validate(p) for p in message.get("params", [])])
            return True
        except Exception as exc:  # any load failure is reported, then the worker ends
            traceback.print_exc(file=self.log)
            stop_descendants()  # whatever the half-made engine started (an engine core, a server) ends first
            send(self.protocol, {"event": "fatal", "error": short_error(exc)})
            return False

    def note(self, line: str) -> None:
        """A line of the worker's own in its log (which engine it serves, from when), among the engine's output."""
        who = f"worker {os.getpid()}" if threading.current_thread() is threading.main_thread() else "worker thread"
        print(f"[{who}] {line}", file=self.log, flush=True)

    def kept(self, setup: Any) -> bool:
        """Whether the engine loaded here serves the next plan of its configuration as loaded (Engine.reuse)."""
        reuse = getattr(self.engine, "reuse", None)
        try:
            return bool(reuse is not None and reuse(setup))
        except Exception:  # an engine that cannot say is loaded anew
            traceback.print_exc(file=self.log)
            return False

    def run_batch(self, op: str, raw_requests: list[dict[str, Any]]) -> None:
        """op generate: Request -> Result; op trace: TraceRequest -> TraceResult (engine.trace); op score:
        TraceRequest -> Result (engine.score)."""
        from harness.core.types import Request, TraceRequest

        requests = [(Request if op == "generate" else TraceRequest).model_validate(r) for r in raw_requests]
        done: set[str] = set()
        try:
            params = {r.case_id: r.params for r in requests if op == "generate"}
            planned = self.planned is not None and self.planned.covers(params.values())
            effective = self.planned if planned else self.effective(list(params.values()))
            for result in getattr(self.engine, op)(requests):
                done.add(result.case_id)
                if effective is not None and result.case_id in params and result.status == "ok":
                    before = time.monotonic()
                    result.effective = effective.get(params[result.case_id])
                    result.timings["effective_s"] = time.monotonic() - before  # the wait: what its path pays
                send(self.protocol, {"event": "result", "result": result.model_dump(mode="json")})
        except Exception as exc:  # a failing batch becomes per-case errors; the worker stays up
            traceback.print_exc(file=self.log)
            for request in requests:
                if request.case_id not in done:
                    send(self.protocol, {"event": "case_error", "case_id": request.case_id,
                                         "error": short_error(exc)})
        send(self.protocol, {"event": "batch_done"})

    def effective(self, params: list[Any]) -> Any:
        """What the engine's own sampling code makes of these params, computed in the background while the engine
        generates (cached on disk per engine version, model and params); None for an engine without sampling code."""
        from adapters.sampling.effective_cache import InBackground

        code = self.load_message.get("sampling")
        setup = self.load_message["setup"]
        if code is None or not params:
            return None
        # a server's client has not loaded the engine package: its sampling code runs in a child process
        return InBackground(code["module"], code["kwargs"], setup["model_path"], setup["dtype"], params,
                            apart=not self.load_message.get("package"))


def main() -> int:
    started = time.monotonic()
    die_with_parent()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return Worker(protocol, started).serve(sys.stdin)


if __name__ == "__main__":
    exit_before_finalisation(main())  # the engine is closed and every message sent
