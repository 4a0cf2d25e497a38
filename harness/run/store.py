"""The run directory: reports/<run-id>/ with run.json, results.parquet, steps.parquet, verdicts.parquet, summary.md
(and beams.parquet when cases decode by beam search).

Each file is written to a temporary name and renamed, so a reader never sees half a file. Engine journals
(engines/<name>/results.jsonl) are appended as results arrive, so an interrupted run keeps what it computed.
run.json records the layout's format_version: a reader tells an older layout from a broken file and says which.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


def read_parquet(run_dir: Path, name: str, columns: list[str] | None = None,
                 required: bool = True) -> pd.DataFrame | None:
    """A parquet file of a run directory; a missing (when required), truncated or foreign file is a ConfigError."""
    path = run_dir / name
    if not path.exists():
        if required:
            raise ConfigError(f"{path}: missing: the run did not finish writing its results; run the scenario again")
        return None
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises many kinds for a damaged file
        raise ConfigError(f"{path}: unreadable parquet ({type(exc).__name__}): the file is damaged; run the "
                          "scenario again") from None
    missing = [c for c in columns or [] if c not in frame.columns]
    if missing:
        raise ConfigError(f"{path}: columns {missing} are missing: the file was edited or is from another "
                          "layout; run the scenario again")
    return frame


RESULT_COLUMNS = ["case_id", "engine", "status", "error", "params", "prompt_ids", "token_ids", "text",
                  "finish_reason", "ended_by", "native_params", "warnings", "timings", "effective", "samples"]
STEP_COLUMNS = ["case_id", "engine", "step", "token_id", "chosen_logprob", "top_ids", "top_logprobs"]
BEAM_COLUMNS = ["case_id", "engine", "rank", "token_ids", "logprobs", "cum_logprob", "score", "finish_reason", "text"]


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
