"""The run directory: reports/<run-id>/ with run.json, results.parquet, steps.parquet, verdicts.parquet, summary.md.

Each file is written to a temporary name and renamed, so a reader never sees half a file. Engine journals
(engines/<name>/results.jsonl) are appended as results arrive, so an interrupted run keeps what it computed.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from harness.types import Result


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


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def results_frame(results: list[Result], params: dict[tuple[str, str], str]) -> pd.DataFrame:
    return pd.DataFrame({
        "case_id": [r.case_id for r in results], "engine": [r.engine for r in results],
        "status": [r.status for r in results], "error": [r.error for r in results],
        "params": [params.get((r.engine, r.case_id), "") for r in results],
        "prompt_ids": [r.prompt_ids for r in results], "token_ids": [r.token_ids for r in results],
        "text": [r.text for r in results], "finish_reason": [r.finish_reason for r in results],
        "native_params": [json.dumps(r.native_params) for r in results],
        "warnings": [r.warnings for r in results], "timings": [json.dumps(r.timings) for r in results],
        "effective": [json.dumps(r.effective) for r in results],
        "samples": [r.samples for r in results],
    })


def steps_frame(results: list[Result]) -> pd.DataFrame:
    """One row per generated token: the chosen id and logprob and the top-k alternatives."""
    ok = [r for r in results if r.status == "ok" and not r.samples]  # samples carry no per-step logprobs
    lengths = [len(r.token_ids) for r in ok]
    return pd.DataFrame({
        "case_id": [r.case_id for r, n in zip(ok, lengths) for _ in range(n)],
        "engine": [r.engine for r, n in zip(ok, lengths) for _ in range(n)],
        "step": [i for n in lengths for i in range(n)],
        "token_id": [t for r in ok for t in r.token_ids],
        "chosen_logprob": [v for r in ok for v in r.chosen_logprobs],
        "top_ids": [ids for r in ok for ids in r.top_ids],
        "top_logprobs": [lps for r in ok for lps in r.top_logprobs],
    })

