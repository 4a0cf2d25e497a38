"""The run directory: reports/<run-id>/ with run.json, results.parquet, steps.parquet, verdicts.parquet, summary.md
(and beams.parquet when cases decode by beam search); its parquet tables are harness.rundir.tables.

Each file is written to a temporary name and renamed, so a reader never sees half a file. Engine journals
(engines/<name>/results.jsonl) are appended as results arrive, so an interrupted run keeps what it computed (and
`parity run --resume` continues from them). run.json records the layout's format_version: a reader tells an older
layout from a broken file and says which. Every file read back is checked before it is used (run.json against its
model, each parquet file's columns against their types), so a damaged or hand-edited file is a one-line error.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harness.core.errors import ConfigError
from harness.rundir import layout

# 1: the layout before run.json carried a format_version; 2: typed run.json, engine setups, ended_by in results;
# 3: one pass column, `expected`, in every verdict table (drift.parquet had `ok`)
# 4: drift.parquet names the weights each engine ran (a GGUF's real tensor-type mix)
FORMAT_VERSION = 4


class EngineMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str
    dtype: str
    threads: int
    options: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    python: str
    model_path: str
    lora: str = ""  # the LoRA adapter's folder it applied at serving time
    versions: dict[str, str] = Field(default_factory=dict)
    load_s: list[float] = Field(default_factory=list)
    model_loads: int = 0  # engines constructed for the run's plan (0: served by one left loaded by a plan before)
    worker_pids: list[int] = Field(default_factory=list)
    restarts: int = 0
    # where the engine's time went: process start, imports, load (first worker), generate and effective params
    # (summed over its results)
    phases: dict[str, float] = Field(default_factory=dict)


class RunSelection(BaseModel):
    """What a run ran of its scenario, recorded so that `parity run --resume` runs the same engines and cases."""

    model_config = ConfigDict(extra="forbid")

    engines: list[str]
    cases: list[str] | None = None
    allow_missing: bool = False


class RunMeta(BaseModel):
    """run.json: what the run was, where, with which engines and versions, and how it ended."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    run_id: str
    scenario: str
    scenario_name: str
    scenario_text: str
    model: str
    reference: str
    started: str
    finished: str = ""
    machine: dict[str, Any] = Field(default_factory=dict)
    prompt_ids: dict[str, list[int]] = Field(default_factory=dict)
    prompt_warnings: dict[str, list[str]] = Field(default_factory=dict)  # prompt id -> what is off about its ids
    # engine -> prompt id -> what is off about its ids for that engine's own model file (a user's GGUF)
    engine_prompt_warnings: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    status: str = "running"  # running | finished | interrupted
    skipped: dict[str, str] = Field(default_factory=dict)  # engine -> why it could not run here (--allow-missing)
    wall_s: float = 0.0
    exit_code: int | None = None
    engines: dict[str, EngineMeta] = Field(default_factory=dict)
    warnings: dict[str, list[str]] = Field(default_factory=dict)
    effective_differences: list[tuple[list[str], str]] = Field(default_factory=list)
    phases: dict[str, float] = Field(default_factory=dict)  # the harness's own: prepare, engines, write
    selection: RunSelection | None = None  # None: written before --resume existed
    resumed: list[str] = Field(default_factory=list)  # when `parity run --resume` continued the run


def new_run_dir(root: Path, scenario_name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root.resolve() / f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', scenario_name)}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


def write_atomic(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_meta(run_dir: Path, meta: RunMeta) -> None:
    write_atomic(run_dir / layout.RUN_JSON, meta.model_dump_json(indent=2) + "\n")


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Held while a process writes the run directory: a second `parity run --resume` of a run still going is refused.
    The kernel drops the lock when its holder dies, however it dies."""
    with open(run_dir / ".lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise ConfigError(f"{run_dir}: another parity process (pid {holder}) is writing this run: wait for it to "
                              "end, or stop it first") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def read_meta(run_dir: Path) -> RunMeta:
    """run.json of a run directory, checked: not a run directory, an older layout, or a broken file, each a
    one-line ConfigError that says what to do."""
    path = run_dir / layout.RUN_JSON
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no run.json): pass a reports/<run-id> folder")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable ({type(exc).__name__}: {str(exc)[:120]}): the run directory is "
                          "damaged; run the scenario again") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a run.json (a JSON object is expected): run the scenario again")
    version = data.get("format_version", 1)
    if version != FORMAT_VERSION:
        raise ConfigError(f"{path}: written in run-directory format {version}, this llm-parity reads format "
                          f"{FORMAT_VERSION}: run the scenario again with this version (or read it with the one "
                          "that wrote it)")
    try:
        return RunMeta.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}: the file was edited or damaged; run the scenario "
                          "again") from None


def read_json(run_dir: Path, name: str, shape: Any) -> Any:
    """A JSON file of a run directory, validated as `shape` (a pydantic model or type); None when it is absent. A
    truncated or edited file is a ConfigError naming the file and the key."""
    path = run_dir / name
    if not path.exists():
        return None
    try:
        return TypeAdapter(shape).validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where + ': ' if where else ''}{first['msg']}: the file was edited or damaged; run "
                          "the command that wrote it again") from None
    except OSError as exc:
        raise ConfigError(f"{path}: unreadable ({exc.strerror}): run the command that wrote it again") from None
