"""Quantisation drift verdicts of `parity run`: for every engine with a `drift:` block, each case's text (its
baseline's prompt and generated tokens) is teacher-forced through the engine and its full-precision baseline, the
full logits of every position are captured (a trace of the logits point only), and the next-token distributions are
compared with llama.cpp's perplexity --kl-divergence measures (harness.compare.drift).

Writes into the run directory: drift.parquet (per case and engine: the measures, the thresholds' verdict and its
explanation) and drift_tokens.parquet (per case, engine and scored token: KLD, delta p, same top-1), which the
report's distribution plot reads; the logits stay in engines/<name>@drift-<baseline>/traces/.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.compare import drift
from harness.run.executor import Progress, run_engines
from harness.run.plan import engine_plan
from harness.run.tables import write_parquet
from harness.scenario.spec import LoadedScenario
from harness.types import Result, TraceRequest, TraceResult

COLUMNS = ["case_id", "engine", "against", "status", "ok", *drift.DriftStats.__dataclass_fields__, "explanation"]
TOKEN_COLUMNS = ["case_id", "engine", "position", "kld", "delta_p", "same_top"]
PLAN_SUFFIX = "@drift"


def measured(scenario: LoadedScenario) -> dict[str, str]:
    """engine -> its baseline, for the engines of this run with a drift verdict."""
    spec = scenario.spec
    return {name: spec.drift_baseline(name) for name in spec.engines if spec.drift_baseline(name) in spec.engines}


def measure(scenario: LoadedScenario, run_dir: Path, results: dict[tuple[str, str], Result], parallel: int | None,
            progress: Progress) -> pd.DataFrame:
    """Run the teacher-forced passes and judge every (case, measured engine); an empty frame when no engine has a
    drift verdict."""
    pairs = measured(scenario)
    if not pairs:
        return pd.DataFrame(columns=COLUMNS)
    requests = {baseline: _requests(scenario, baseline, results) for baseline in set(pairs.values())}
    # (engine, the baseline whose texts it reads): a baseline reads its own; an engine can be both (f32 vs HF, and
    # the baseline of q8_0), so each pass is named after both
    passes = dict.fromkeys([(b, b) for b in pairs.values()] + list(pairs.items()))
    owner = {f"{engine}{PLAN_SUFFIX}-{source}": (engine, source) for engine, source in passes if requests[source]}
    plans = [engine_plan(scenario, engine, run_dir, requests[source], op="trace", plan_name=name)
             for name, (engine, source) in owner.items()]
    outcomes, _ = run_engines(plans, parallel, progress) if plans else ({}, False)
    traces = {(*owner[name], cid): r for name, o in outcomes.items() for cid, r in o.results.items()}
    rows, tokens = [], []
    for name, baseline in pairs.items():
        thresholds = scenario.spec.engines[name].drift.model_dump(exclude={"against"})
        for case in scenario.cases:
            row, per_token = _judge(name, baseline, case.case_id, results, traces, thresholds)
            rows.append(row)
            if per_token is not None:
                tokens.append(per_token)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    write_parquet(run_dir / "drift.parquet", frame)
    write_parquet(run_dir / "drift_tokens.parquet",
                  pd.concat(tokens, ignore_index=True) if tokens else pd.DataFrame(columns=TOKEN_COLUMNS))
    return frame


def _requests(scenario: LoadedScenario, baseline: str, results: dict[tuple[str, str], Result]) -> list[TraceRequest]:
    """One logits-only teacher-forced pass per case the baseline generated tokens for."""
    out = []
    for case in scenario.cases:
        result = results.get((baseline, case.case_id))
        if result is not None and result.status == "ok" and result.token_ids:
            out.append(TraceRequest(case_id=case.case_id, token_ids=[*result.prompt_ids, *result.token_ids],
                                    prompt_len=len(result.prompt_ids), points=["logits"]))
    return out


def _judge(name: str, baseline: str, case_id: str, results: dict[tuple[str, str], Result],
           traces: dict[tuple[str, str], TraceResult], thresholds: dict) -> tuple[dict, pd.DataFrame | None]:
    base_result = results.get((baseline, case_id))
    failed = {"case_id": case_id, "engine": name, "against": baseline, "status": "error", "ok": False}
    if base_result is None or base_result.status != "ok" or not base_result.token_ids:
        return {**failed, "explanation": f"no drift verdict: the baseline {baseline} generated no tokens for this "
                                         "case"}, None
    found = {engine: traces.get((engine, baseline, case_id)) for engine in (baseline, name)}
    problems = [f"{engine}: {_trace_error(found[engine])}" for engine in found if _trace_error(found[engine])]
    if problems:
        return {**failed, "explanation": "no drift verdict: the teacher-forced pass failed (" + "; ".join(problems)
                + ")"}, None
    prompt_len = len(base_result.prompt_ids)
    sequence = np.array([*base_result.prompt_ids, *base_result.token_ids])
    scored = slice(prompt_len - 1, len(sequence) - 1)  # the positions that predict the generated tokens
    per_token = _token_drift(found[baseline].path, found[name].path, scored, sequence[prompt_len:])
    stats = drift.summarize(per_token)
    ok, explanation = drift.judge(stats, thresholds, name, baseline)
    row = {"case_id": case_id, "engine": name, "against": baseline, "status": "ok", "ok": ok, **stats.as_dict(),
           "explanation": explanation}
    tokens = pd.DataFrame({"case_id": case_id, "engine": name, "position": np.arange(stats.tokens),
                           "kld": per_token.kld, "delta_p": per_token.delta_p, "same_top": per_token.same_top})
    return row, tokens


def _trace_error(result: TraceResult | None) -> str:
    if result is None:
        return "not run"
    return "" if result.status == "ok" else result.error


def _token_drift(base_path: str, path: str, scored: slice, targets: np.ndarray) -> drift.TokenDrift:
    """Per-token drift over the scored rows of two traces' logits, read and measured a bounded chunk of rows at a
    time (a 262k-vocabulary row is 2 MB in float64)."""
    from harness.explain.trace_diff import Trace, row_chunks

    base, other = Trace(base_path), Trace(path)
    width = base.shape("logits")[1]
    parts = [drift.token_drift(base.rows("logits", scored.start + a, scored.start + b),
                               other.rows("logits", scored.start + a, scored.start + b), targets[a:b])
             for a, b in row_chunks(len(targets), width)]
    return drift.concat(parts)
