"""Worker process: loads one engine once and serves generate requests from the harness.

Run as `python -m harness.worker` by the harness (possibly with another interpreter); it speaks harness.protocol.
Protocol messages go to a duplicate of the original stdout; fd 1 is pointed at stderr so that anything the
engine prints lands in the worker log instead of corrupting the protocol. However the worker ends (close, EOF,
SIGTERM, the harness dying), the engine is closed, so a server it started is stopped.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

from harness.lifetime import die_with_parent
from harness.protocol import decode, send

def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through Worker.serve's finally: the engine closes


def _short(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:600]


class Worker:
    def __init__(self, protocol: IO[str]):
        self.protocol = protocol
        self.engine: Any = None
        self.spec: dict[str, Any] = {}
        self.effective_cache: dict[str, dict[str, Any]] = {}

    def serve(self, lines) -> int:
        try:
            for line in lines:
                message = decode(line)
                if message["op"] == "load" and not self.load(message):
                    return 1
                if message["op"] in ("generate", "trace"):
                    self.run_batch(message["op"], message["requests"])
                if message["op"] == "close":
                    return 0
            return 0
        finally:
            if self.engine is not None:
                self.engine.close()

    def load(self, message: dict[str, Any]) -> bool:
        from adapters.registry import engine_class

        started = time.perf_counter()
        self.spec = message
        try:
            cls = engine_class(message["engine"])
            self.engine = cls(message["name"], Path(message["model_path"]), message["dtype"], message["options"],
                              Path(message["workdir"]), **({"trace": True} if message.get("trace") else {}))
            send(self.protocol, {"event": "ready", "versions": self.engine.versions(),
                                 "load_s": time.perf_counter() - started})
            return True
        except Exception as exc:  # any load failure is reported, then the worker ends
            traceback.print_exc()
            send(self.protocol, {"event": "fatal", "error": _short(exc)})
            return False

    def run_batch(self, op: str, raw_requests: list[dict[str, Any]]) -> None:
        """op generate: Request -> Result; op trace: TraceRequest -> TraceResult (engine.trace)."""
        from harness.types import Request, TraceRequest

        requests = [(TraceRequest if op == "trace" else Request).from_json(r) for r in raw_requests]
        done: set[str] = set()
        try:
            params = {r.case_id: r.params for r in requests if op == "generate"}
            for result in getattr(self.engine, op)(requests):
                done.add(result.case_id)
                if result.case_id in params:
                    result.effective = self.effective(params[result.case_id])
                send(self.protocol, {"event": "result", "result": result.to_json()})
        except Exception as exc:  # a failing batch becomes per-case errors; the worker stays up
            traceback.print_exc()
            for request in requests:
                if request.case_id not in done:
                    send(self.protocol, {"event": "case_error", "case_id": request.case_id, "error": _short(exc)})
        send(self.protocol, {"event": "batch_done"})

    def effective(self, params: Any) -> dict[str, Any]:
        """What the engine's own sampling code makes of these params (cached per distinct params)."""
        key = params.model_dump_json()
        if key not in self.effective_cache:
            self.effective_cache[key] = compute_effective(self.spec, params)
        return self.effective_cache[key]


def compute_effective(spec: dict[str, Any], params: Any) -> dict[str, Any]:
    import importlib

    from adapters.registry import sampling_code

    code = sampling_code(spec["engine"], spec["options"])
    if code is None:
        return {}
    try:
        module = importlib.import_module(code[0])
        return module.effective(Path(spec["model_path"]), params, spec["dtype"], **code[1]).to_json()
    except Exception as exc:  # informational: never fails a case
        return {"notes": [f"effective params not computed: {_short(exc)}"]}


def main() -> int:
    die_with_parent()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return Worker(protocol).serve(sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
