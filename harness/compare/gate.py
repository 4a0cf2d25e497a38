"""`parity gate`: a run must meet its scenario's expectations AND not have moved against a saved baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.compare import baseline
from harness.compare.baseline import records_from_run

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
    return reasons


def judge_run(run_dir: Path, baseline_dir: Path, expected: dict[tuple[str, str], tuple[bool, str]],
              tolerances: dict[str, float]) -> list[GateCase]:
    """Gate cases of one run. expected: (engine, case) -> (as expected?, explanation) from the run's verdicts."""
    header, records = records_from_run(run_dir)
    _, old_records = baseline.load(baseline_dir, header["scenario"])
    cases = []
    for record in records:
        key = (record["engine"], record["case_id"])
        case = GateCase(header["scenario"], record["case_id"], record["engine"])
        ok, explanation = expected.get(key, (True, ""))
        if not ok:
            case.failures.append(f"out of expectation: {explanation}")
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
