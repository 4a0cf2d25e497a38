"""Baselines: what a gate compares a new run against, one diff-friendly JSON-lines file per scenario.

baselines/NAME/<scenario>.jsonl: a header line (scenario, source run, engine versions), then one line per case and
engine: status, token ids, chosen-token logprobs (rounded to 1e-6), top-k ids, verdict vs the reference and its
first divergence step, and for beam search every returned beam (token ids and per-token logprobs, best first). A
change in one case changes one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.compare.token_rules import COLUMNS, VERDICT_TYPES
from harness.core.errors import ConfigError
from harness.rundir import layout
from harness.rundir.store import read_meta, write_atomic
from harness.rundir.tables import read_beams, read_parquet, read_results, read_steps


def _round(values) -> list[float]:
    return [round(float(v), 6) for v in values]


def _beams_by_case(run_dir: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(engine, case) -> its returned beams, best first, as baseline records hold them."""
    beams = read_beams(run_dir)
    if beams is None:
        return {}
    return {key: [{"token_ids": [int(t) for t in b.token_ids],
                   "logprobs": [None if v is None or pd.isna(v) else round(float(v), 6) for v in b.logprobs]}
                  for b in group.sort_values("rank").itertuples()]
            for key, group in beams.groupby(["engine", "case_id"], sort=False)}


def records_from_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and per-(case, engine) records of a finished run directory."""
    meta = read_meta(run_dir)
    if meta.status != "finished":
        raise ConfigError(f"{run_dir}: the run is {meta.status}: save a baseline from a finished run")
    results = read_results(run_dir)
    steps = read_steps(run_dir)
    verdicts = read_parquet(run_dir, layout.VERDICTS, VERDICT_TYPES, required=False)
    verdicts = (verdicts if verdicts is not None else pd.DataFrame(columns=COLUMNS)).set_index(["engine", "case_id"])
    per_case = {key: group for key, group in steps.groupby(["engine", "case_id"], sort=False)}
    beams = _beams_by_case(run_dir)
    records = []
    for row in results.itertuples():
        key = (row.engine, row.case_id)
        step_rows = per_case.get(key)
        verdict = verdicts.loc[key] if key in verdicts.index else None
        records.append({
            "case_id": row.case_id, "engine": row.engine, "status": row.status, "error": row.error,
            "token_ids": [int(t) for t in row.token_ids],
            "chosen_logprobs": _round(step_rows.chosen_logprob) if step_rows is not None else [],
            "top_ids": [[int(t) for t in ids] for ids in step_rows.top_ids] if step_rows is not None else [],
            "verdict": verdict.verdict if verdict is not None else "reference",
            "first_divergence": int(verdict.first_divergence) if verdict is not None
            and pd.notna(verdict.first_divergence) else -1,
            "beams": beams.get(key, []),
        })
    header = {"scenario": meta.scenario_name, "run_id": meta.run_id, "reference": meta.reference,
              "versions": {name: e.versions for name, e in meta.engines.items()}}
    return header, records


def baseline_file(folder: Path, scenario_name: str, named_in: str) -> Path:
    """folder/<scenario>.jsonl, for a scenario name that is one file name: no path separator, no NUL byte, not "." or
    ".." (a damaged run.json, or a scenario named "a/b", would otherwise write outside the folder or fail in the OS).
    named_in: where the name comes from, for the error."""
    if "/" in scenario_name or "\0" in scenario_name or scenario_name.strip(".") == "":
        raise ConfigError(f"{named_in}: the scenario name {scenario_name!r} cannot name a baseline file (no '/', no "
                          "NUL byte, not only dots): rename the scenario (its `name:` key) and run it again")
    return folder / f"{scenario_name}.jsonl"


def save(run_dir: Path, to: Path) -> Path:
    header, records = records_from_run(run_dir)
    path = baseline_file(to, header["scenario"], f"{run_dir / layout.RUN_JSON}: scenario_name")
    to.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(header, sort_keys=True)] + [json.dumps(r, sort_keys=True) for r in records]
    write_atomic(path, "\n".join(lines) + "\n")
    return path


class BaselineHeader(BaseModel):
    scenario: str
    run_id: str
    reference: str
    versions: dict[str, dict[str, str]]


class BaselineBeam(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token_ids: list[int]
    logprobs: list[float | None]


class BaselineRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    case_id: str
    engine: str
    status: str
    error: str
    token_ids: list[int]
    chosen_logprobs: list[float]
    top_ids: list[list[int]]
    verdict: str
    first_divergence: int
    beams: list[BaselineBeam] = Field(default_factory=list)  # absent in baselines saved before beams were kept


def load(baseline_dir: Path, scenario_name: str,
         named_in: str) -> tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]:
    """A scenario's baseline, every line checked: a truncated or edited file is a ConfigError naming its line.
    named_in: where the scenario's name comes from (baseline_file)."""
    path = baseline_file(baseline_dir, scenario_name, named_in)
    if not path.exists():
        raise ConfigError(f"{path}: no baseline for scenario '{scenario_name}': save one with "
                          f"`parity baseline save RUN_DIR --to {baseline_dir}`")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({type(exc).__name__}): save it again with `parity baseline save`") \
            from None
    if not lines:
        raise ConfigError(f"{path}: empty: save it again with `parity baseline save`")
    header = _line(path, 1, lines[0], BaselineHeader)
    records = [_line(path, n, line, BaselineRecord) for n, line in enumerate(lines[1:], start=2) if line.strip()]
    return header, {(r["engine"], r["case_id"]): r for r in records}


def _line(path: Path, number: int, line: str, shape: type[BaseModel]) -> dict[str, Any]:
    try:
        return shape.model_validate_json(line).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        what = "header" if shape is BaselineHeader else "case record"
        raise ConfigError(f"{path}:{number}: {what}{' ' + where if where else ''}: {first['msg']}: the file was "
                          "edited or damaged; save it again with `parity baseline save`") from None
