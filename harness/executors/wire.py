"""The harness <-> worker protocol: one JSON object per line.

harness -> worker (stdin):  {"op": "load", ...}  {"op": "generate", "requests": [...]}  {"op": "close"}
worker -> harness (a dedicated pipe, not stdout, which engines print to):
    {"event": "ready", "versions": {...}, "load_s": float}
    {"event": "result", "result": {...}}              one per request, as soon as it is ready
    {"event": "case_error", "case_id": str, "error": str}
    {"event": "batch_done"}
    {"event": "fatal", "error": str}                  the engine could not load
"""

from __future__ import annotations

import json
from typing import IO, Any


def send(stream: IO[str], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def decode(line: str) -> dict[str, Any]:
    return json.loads(line)
