"""The run directory's parquet tables (results, steps, beams and the verdict tables): written whole to a temporary name
and renamed, read back with each column checked against the kind of value it must hold, so a damaged or hand-edited
file is a one-line error. Apart from harness.rundir.store so that starting a run does not wait for pandas and
pyarrow."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.core.errors import ConfigError
from harness.core.types import Result
from harness.rundir import layout


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


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
    if len(column) == column.null_count and (nullable or not len(column)):
        return None  # no values, none of a wrong kind (pandas types an empty or all-None column float64)
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


def read_results(run_dir: Path) -> pd.DataFrame:
    """results.parquet, checked: one row per (engine, case)."""
    return read_parquet(run_dir, layout.RESULTS, RESULT_TYPES)


def read_steps(run_dir: Path) -> pd.DataFrame:
    """steps.parquet, checked: one row per generated token."""
    return read_parquet(run_dir, layout.STEPS, STEP_TYPES)


def read_beams(run_dir: Path) -> pd.DataFrame | None:
    """beams.parquet, checked; None when the run searched no beams."""
    return read_parquet(run_dir, layout.BEAMS, BEAM_TYPES, required=False)


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
