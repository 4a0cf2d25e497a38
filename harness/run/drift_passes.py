"""The teacher-forced passes of the quantisation drift verdicts (harness.verdicts.drift): for every engine with a
`drift:` block, each case's text (its baseline's prompt and generated tokens) is run through the engine and its
full-precision baseline with the full logits of every position captured (a trace of the logits point only). The
logits stay in engines/<name>@drift-<baseline>/traces/.
"""

from __future__ import annotations

from pathlib import Path

from harness.core.types import Result, TraceRequest, TraceResult
from harness.executors.engine_runs import Progress, run_engines
from harness.plan.plans import engine_plan
from harness.scenario.spec import LoadedScenario
from harness.verdicts.drift import measured

PLAN_SUFFIX = "@drift"


def run_passes(scenario: LoadedScenario, run_dir: Path, results: dict[tuple[str, str], Result],
               parallel: int | None, progress: Progress) -> dict[tuple[str, str, str], TraceResult]:
    """Every teacher-forced pass the drift verdicts need: (engine, the baseline whose texts it read, case) -> its
    trace; empty when no engine has a drift verdict."""
    pairs = measured(scenario)
    if not pairs:
        return {}
    requests = {baseline: _requests(scenario, baseline, results) for baseline in set(pairs.values())}
    # (engine, the baseline whose texts it reads): a baseline reads its own; an engine can be both (f32 vs HF, and
    # the baseline of q8_0), so each pass is named after both
    passes = dict.fromkeys([(b, b) for b in pairs.values()] + list(pairs.items()))
    owner = {f"{engine}{PLAN_SUFFIX}-{source}": (engine, source) for engine, source in passes if requests[source]}
    plans = [engine_plan(scenario, engine, run_dir, requests[source], op="trace", plan_name=name)
             for name, (engine, source) in owner.items()]
    outcomes, _ = run_engines(plans, parallel, progress) if plans else ({}, False)
    return {(*owner[name], cid): r for name, o in outcomes.items() for cid, r in o.results.items()}


def _requests(scenario: LoadedScenario, baseline: str, results: dict[tuple[str, str], Result]) -> list[TraceRequest]:
    """One logits-only teacher-forced pass per case the baseline generated tokens for."""
    out = []
    for case in scenario.cases:
        result = results.get((baseline, case.case_id))
        if result is not None and result.status == "ok" and result.token_ids:
            out.append(TraceRequest(case_id=case.case_id, token_ids=[*result.prompt_ids, *result.token_ids],
                                    prompt_len=len(result.prompt_ids), points=["logits"]))
    return out
