"""`parity gate`: a run must meet its scenario's expectations AND not have moved against a saved baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.compare import baseline
from harness.compare.baseline import records_from_run
from harness.rundir import layout

DEFAULT_LOGPROB_TOLERANCE = 1e-3


@dataclass
class GateCase:
    scenario: str
    case_id: str
    engine: str
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def _first_difference(old: list[int], new: list[int]) -> int:
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return i
    return min(len(old), len(new)) if len(old) != len(new) else -1


def _logprob_move(old: list[float | None], new: list[float | None], before: int) -> float:
    """The largest |difference| of two logprob lists over their first `before` steps where both have a value."""
    pairs = [(a, b) for a, b in zip(old[:before], new[:before], strict=False) if a is not None and b is not None]
    if not pairs:
        return 0.0
    was, now = zip(*pairs, strict=True)
    return float(np.abs(np.subtract(was, now)).max())


def beam_moves(old: list[dict], new: list[dict], tolerance: float) -> list[str]:
    """Why the beams of a beam-search case moved against their baseline (the best beam's tokens are the case's own
    token ids, gated by compare_to_baseline; its logprobs and every other beam are gated here)."""
    if not new:
        return []
    if not old:
        return ["the baseline holds no beams (saved before baselines kept them): save it again to gate every beam"]
    reasons = [f"{len(new)} beam(s) returned, the baseline has {len(old)}"] if len(new) != len(old) else []
    for rank, (was, now) in enumerate(zip(old, new, strict=False)):
        step = _first_difference(was["token_ids"], now["token_ids"])
        if rank and step >= 0:
            reasons.append(f"beam {rank + 1} moved against the baseline from step {step}")
        delta = _logprob_move(was["logprobs"], now["logprobs"], step if step >= 0 else len(now["logprobs"]))
        if delta > tolerance:
            reasons.append(f"beam {rank + 1}'s token logprobs moved by {delta:.3g} > tolerance {tolerance:g}")
    return reasons


def compare_to_baseline(old: dict, new: dict, tolerance: float) -> list[str]:
    """Why a case/engine result moved against its baseline record (empty: it did not)."""
    if new["status"] != "ok":
        return [] if old["status"] != "ok" else [f"new engine error: {new['error']}"]
    if old["status"] != "ok":
        return []  # it used to fail and now works: not a regression
    reasons = []
    step = _first_difference(old["token_ids"], new["token_ids"])
    if step >= 0:
        reasons.append(f"tokens moved against the baseline from step {step}")
    shared = min(len(old["chosen_logprobs"]), len(new["chosen_logprobs"]), step if step >= 0 else 10**9)
    if shared:
        delta = np.abs(np.subtract(old["chosen_logprobs"][:shared], new["chosen_logprobs"][:shared])).max()
        if delta > tolerance:
            reasons.append(f"chosen-token logprobs moved by {delta:.3g} > tolerance {tolerance:g}")
    old_div, new_div = old["first_divergence"], new["first_divergence"]
    if new_div >= 0 and (old_div < 0 or new_div < old_div):
        was = "none" if old_div < 0 else f"step {old_div}"
        reasons.append(f"first divergence from the reference moved earlier: {was} -> step {new_div}")
    return reasons + beam_moves(old.get("beams", []), new.get("beams", []), tolerance)


def out_of_expectation(tables: list[pd.DataFrame]) -> dict[tuple[str, str], str]:
    """(engine, case) -> why it is out of expectation, from every verdict table whose rows are one per engine and
    case (tokens, text, constraint, drift, a plug-in family's): a row of any of them that is not as expected fails
    the case; their explanations are joined."""
    found: dict[tuple[str, str], list[str]] = {}
    for rows in tables:
        for row in rows.itertuples():
            if not row.expected:
                found.setdefault((row.engine, row.case_id), []).append(row.explanation)
    return {key: "; ".join(why) for key, why in found.items()}


def judge_run(run_dir: Path, baseline_dir: Path, unexpected: dict[tuple[str, str], str],
              tolerances: dict[str, float]) -> list[GateCase]:
    """Gate cases of one run. unexpected: (engine, case) -> why the run's verdicts hold it out of expectation."""
    header, records = records_from_run(run_dir)
    _, old_records = baseline.load(baseline_dir, header["scenario"], f"{run_dir / layout.RUN_JSON}: scenario_name")
    cases = []
    for record in records:
        key = (record["engine"], record["case_id"])
        case = GateCase(header["scenario"], record["case_id"], record["engine"])
        if key in unexpected:
            case.failures.append(f"out of expectation: {unexpected[key]}")
        if key not in old_records:
            case.failures.append("not in the baseline: save a new baseline for this scenario")
        else:
            case.failures += compare_to_baseline(old_records[key], record, tolerances.get(record["engine"],
                                                                                         DEFAULT_LOGPROB_TOLERANCE))
        cases.append(case)
    return cases


def invariance_cases(scenario: str, rows: pd.DataFrame) -> list[GateCase]:
    """One gate case per invariance knob and engine: it fails when the knob is out of its expectation (a knob
    listed under invariance.identical that is no longer identical, a control that did not fire, ...)."""
    return [GateCase(scenario, f"invariance:{r.knob}", r.engine,
                     [] if r.expected else [f"invariance {r.knob}: {r.verdict}: {r.explanation}"])
            for r in rows.itertuples()]
