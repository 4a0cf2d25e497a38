"""What a run directory's engine journals say was already computed, for `parity run --resume`.

Each engine journals its results to engines/<name>/results.jsonl as they arrive, one JSON line each, and describes
its worker (versions, load times, pids) in engines/<name>/engine.json once it is ready. After a Ctrl-C, a SIGKILL of
the harness, of a worker or of a server, those files are all that is certain. Here they are read back tolerantly:
a torn last line (the harness killed mid-write) or any line that is not a result of this run is skipped, never
trusted. Which results are reused and which plans still have work is decided here, whatever executes the plans:
an executor only has to journal each result as it arrives (one JSON line, flushed) and call save_engine_info when
a worker is ready, as harness.executors.engine_runs does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from harness.core.types import Result
from harness.rundir.store import write_atomic, write_json

JOURNAL = "results.jsonl"
ENGINE_INFO = "engine.json"


def read_journal(path: Path) -> tuple[dict[str, Result], int]:
    """The results a journal holds, the last one per case, and how many lines were skipped as unreadable."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return {}, 0
    results: dict[str, Result] = {}
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            result = Result.model_validate(json.loads(line))
        except (ValueError, ValidationError):  # a torn last line, or one damaged by hand
            skipped += 1
            continue
        results[result.case_id] = result
    return results, skipped


def rewrite_journal(workdir: Path, kept: dict[str, Result]) -> None:
    """Leave only the kept results in an engine's journal (a torn line must not glue itself to the next append)."""
    lines = "".join(json.dumps(r.model_dump(mode="json")) + "\n" for r in kept.values())
    workdir.mkdir(parents=True, exist_ok=True)
    write_atomic(workdir / JOURNAL, lines)


class EngineInfo(BaseModel):
    """engines/<name>/engine.json: what a resumed run needs to describe an engine it does not start again."""

    versions: dict[str, str] = Field(default_factory=dict)
    load_s: list[float] = Field(default_factory=list)
    model_loads: int = 0
    worker_pids: list[int] = Field(default_factory=list)
    restarts: int = 0
    phases: dict[str, float] = Field(default_factory=dict)


def save_engine_info(workdir: Path, info: dict[str, Any]) -> None:
    """Written by the executor each time a worker is ready."""
    write_json(workdir / ENGINE_INFO, EngineInfo(**info).model_dump())


def read_engine_info(workdir: Path) -> dict[str, Any]:
    """engine.json's fields; empty ones when it is missing or unreadable: that loses an engine's description (its
    versions), never a result."""
    try:
        return EngineInfo.model_validate_json((workdir / ENGINE_INFO).read_bytes()).model_dump()
    except (OSError, ValidationError):
        return EngineInfo().model_dump()
