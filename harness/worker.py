"""Worker process: loads one engine once and serves generate requests from the harness.

Run as `python -m harness.worker` by the harness (possibly with another interpreter); it speaks harness.protocol.
Protocol messages go to a duplicate of the original stdout; fd 1 is pointed at stderr so that anything the
engine prints lands in the worker log instead of corrupting the protocol.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from harness.protocol import decode, send

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when the harness dies, so no engine outlives its run."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _short(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:600]


def main() -> int:
    _die_with_parent()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from adapters.registry import engine_class
    from harness.types import Request

    engine = None
    for line in sys.stdin:
        message = decode(line)
        op = message["op"]
        if op == "load":
            started = time.perf_counter()
            try:
                cls = engine_class(message["engine"])
                engine = cls(message["name"], Path(message["model_path"]), message["dtype"], message["options"],
                             Path(message["workdir"]))
                send(protocol, {"event": "ready", "versions": engine.versions(),
                                "load_s": time.perf_counter() - started})
            except Exception as exc:  # any load failure is reported, then the worker ends
                traceback.print_exc()
                send(protocol, {"event": "fatal", "error": _short(exc)})
                return 1
        elif op == "generate":
            requests = [Request.from_json(r) for r in message["requests"]]
            done: set[str] = set()
            try:
                for result in engine.generate(requests):
                    done.add(result.case_id)
                    send(protocol, {"event": "result", "result": result.to_json()})
            except Exception as exc:  # a failing batch becomes per-case errors; the worker stays up
                traceback.print_exc()
                for request in requests:
                    if request.case_id not in done:
                        send(protocol, {"event": "case_error", "case_id": request.case_id, "error": _short(exc)})
            send(protocol, {"event": "batch_done"})
        elif op == "close":
            if engine is not None:
                engine.close()
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
