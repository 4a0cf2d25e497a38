"""The run directory: reports/<run-id>/ with run.json, results.parquet, steps.parquet, verdicts.parquet, summary.md
(and beams.parquet when cases decode by beam search).

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

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harness.errors import ConfigError
from harness.types import Result

# 1: the layout before run.json carried a format_version; 2: typed run.json, engine setups, ended_by in results
FORMAT_VERSION = 2


class EngineMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str
    dtype: str
    threads: int
    options: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    python: str
    model_path: str
    versions: dict[str, str] = Field(default_factory=dict)
    load_s: list[float] = Field(default_factory=list)
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
    write_atomic(run_dir / "run.json", meta.model_dump_json(indent=2) + "\n")


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


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def read_meta(run_dir: Path) -> RunMeta:
    """run.json of a run directory, checked: not a run directory, an older layout, or a broken file, each a
    one-line ConfigError that says what to do."""
    path = run_dir / "run.json"
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


def read_parquet(run_dir: Path, name: str, types: dict[str, str] | None = None,
                 required: bool = True) -> pd.DataFrame | None:
    """A parquet file of a run directory, its columns checked against `types` (column -> kind, see _matches); a
    missing (when required), truncated, foreign or hand-edited file is a ConfigError naming the file and column."""
    path = run_dir / name
    if not path.exists():
        if required:
            raise ConfigError(f"{path}: missing: the run did not finish writing its results; run the scenario again")
        return None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises many kinds for a damaged file
        raise ConfigError(f"{path}: unreadable parquet ({type(exc).__name__}): the file is damaged; run the "
                          "scenario again") from None
    missing = [c for c in types or {} if c not in table.column_names]
    if missing:
        raise ConfigError(f"{path}: columns {missing} are missing: the file was edited or is from another "
                          "layout; run the scenario again")
    for column, kind in (types or {}).items():
        problem = _column_problem(table.column(column), kind)
        if problem:
            raise ConfigError(f"{path}: column {column}: {problem}: the file was edited or damaged; run the scenario "
                              "again")
    return table.to_pandas()


def _column_problem(column: pa.ChunkedArray, kind: str) -> str | None:
    """Why a column does not hold values of `kind` (str, int, float, bool, json: a string holding a JSON object,
    json|empty: the same or "", list[...]; a trailing ? allows nulls), or None."""
    nullable, kind = kind.endswith("?"), kind.removesuffix("?")
    if not _matches(kind, column.type):
        return f"holds {column.type}, not {kind}"
    if not nullable and len(column) and (pa.types.is_null(column.type) or _nulls(column)):
        return "has empty (null) values"
    if kind in ("json", "json|empty"):
        for value in column.to_pylist():
            if value == "" and kind == "json|empty":
                continue
            try:
                parsed = json.loads(value)
            except ValueError:
                return f"{value[:40]!r} is not JSON"
            if not isinstance(parsed, dict):
                return f"{value[:40]!r} is not a JSON object"
    return None


def _matches(kind: str, type_: pa.DataType) -> bool:
    if pa.types.is_null(type_):  # no values at all (an empty list column, a column of nulls)
        return True
    if kind.startswith("list["):
        return (pa.types.is_list(type_) or pa.types.is_large_list(type_)) and _matches(kind[5:-1], type_.value_type)
    checks = {"str": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
              "int": pa.types.is_integer, "float": lambda t: pa.types.is_floating(t) or pa.types.is_integer(t),
              "bool": pa.types.is_boolean}
    checks["json"] = checks["json|empty"] = checks["str"]
    return checks[kind](type_)


def _nulls(column: pa.ChunkedArray | pa.Array) -> int:
    """Nulls in a column, in its lists too."""
    count = column.null_count
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        count += _nulls(pc.list_flatten(column))
    return count


# The columns of results, steps and beams.parquet and the kind of value each holds (checked when read back).
RESULT_TYPES = {"case_id": "str", "engine": "str", "status": "str", "error": "str", "params": "json|empty",
                "prompt_ids": "list[int]", "token_ids": "list[int]", "text": "str", "finish_reason": "str",
                "ended_by": "str", "native_params": "json", "warnings": "list[str]", "timings": "json",
                "effective": "json", "samples": "list[list[int]]"}
STEP_TYPES = {"case_id": "str", "engine": "str", "step": "int", "token_id": "int", "chosen_logprob": "float",
              "top_ids": "list[int]", "top_logprobs": "list[float]"}
BEAM_TYPES = {"case_id": "str", "engine": "str", "rank": "int", "token_ids": "list[int]", "logprobs": "list[float]?",
              "cum_logprob": "float?", "score": "float?", "finish_reason": "str", "text": "str"}
RESULT_COLUMNS, STEP_COLUMNS, BEAM_COLUMNS = list(RESULT_TYPES), list(STEP_TYPES), list(BEAM_TYPES)


def results_frame(results: list[Result], params: dict[tuple[str, str], str],
                  ended_by: dict[tuple[str, str], str]) -> pd.DataFrame:
    return pd.DataFrame({
        "case_id": [r.case_id for r in results], "engine": [r.engine for r in results],
        "status": [r.status for r in results], "error": [r.error for r in results],
        "params": [params.get((r.engine, r.case_id), "") for r in results],
        "prompt_ids": [r.prompt_ids for r in results], "token_ids": [r.token_ids for r in results],
        "text": [r.text for r in results], "finish_reason": [r.finish_reason for r in results],
        "ended_by": [ended_by.get((r.engine, r.case_id), "") for r in results],
        "native_params": [json.dumps(r.native_params) for r in results],
        "warnings": [r.warnings for r in results], "timings": [json.dumps(r.timings) for r in results],
        "effective": [json.dumps(r.effective) for r in results],
        "samples": [r.samples for r in results],
    }, columns=RESULT_COLUMNS)


def steps_frame(results: list[Result]) -> pd.DataFrame:
    """One row per generated token: the chosen id and logprob and the top-k alternatives."""
    ok = [r for r in results if r.status == "ok" and not r.samples]  # samples carry no per-step logprobs
    lengths = [len(r.chosen_logprobs) for r in ok]
    return pd.DataFrame({
        "case_id": [r.case_id for r, n in zip(ok, lengths) for _ in range(n)],
        "engine": [r.engine for r, n in zip(ok, lengths) for _ in range(n)],
        "step": [i for n in lengths for i in range(n)],
        "token_id": [t for r, n in zip(ok, lengths) for t in r.token_ids[:n]],
        "chosen_logprob": [v for r in ok for v in r.chosen_logprobs],
        "top_ids": [ids for r in ok for ids in r.top_ids],
        "top_logprobs": [lps for r in ok for lps in r.top_logprobs],
    }, columns=STEP_COLUMNS)


def beams_frame(results: list[Result]) -> pd.DataFrame:
    """One row per returned beam: its rank (0 = best), token ids, per-token logprobs, cumulative logprob and the
    engine's final score."""
    rows = [(r.case_id, r.engine, rank, b.token_ids, b.logprobs, b.cum_logprob, b.score, b.finish_reason, b.text)
            for r in results if r.status == "ok" for rank, b in enumerate(r.beams)]
    return pd.DataFrame(rows, columns=BEAM_COLUMNS)
