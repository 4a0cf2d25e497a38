"""The evidence a run reads near-ties with (harness.compare.tie_noise), gathered after its engines have answered and
before its verdicts:

1. the noise pass: for every greedy case some engine diverged on, the reference scores its own tokens in higher
   precision on its own weights (float32 for a bfloat16 or float16 run, float64 for a float32 one; a logits-only
   teacher-forced pass, kept in engines/<reference>@noise/traces/), which gives each case's noise;
2. the layer checks: every divergence that reads as a near-tie against that noise, in an engine that can be traced,
   is checked the way `parity explain` checks it (the reference's full trace, the floor's and the engine's passes,
   every layer started from the reference's input, harness.compare.floors.judge_pass): a component out of its floor
   means the divergence is not a near-tie, whatever the margin. The traces are compared as they are captured, in a
   scratch folder removed afterwards; what the check found is in the verdict's explanation.
"""

from __future__ import annotations

from pathlib import Path

from harness.compare.beam_rules import beam_cases
from harness.compare.diff import compare
from harness.compare.floors import judge_pass, read_floors
from harness.compare.tie_noise import LayerCheck, TieEvidence, measure, tie_bounds
from harness.core.points import COMPONENT, parse
from harness.core.types import Result, TraceRequest, TraceResult
from harness.executors import choice
from harness.executors.engine_runs import Progress, run_engines
from harness.plan.invariance_checks import Check
from harness.plan.plans import engine_plan
from harness.run.trace_passes import noise_floor_dtype, plan_passes, trace_request
from harness.rundir.traces import Trace
from harness.scenario.spec import LoadedScenario

NOISE = "@noise"  # plan-name suffix of the reference's noise pass


def gather(scenario: LoadedScenario, run_dir: Path, results: dict[tuple[str, str], Result], parallel: int | None,
           progress: Progress, checks: list[Check] | None = None) -> TieEvidence:
    """The noise of every diverged greedy case (an engine apart from the reference, or an invariance knob's variant
    apart from its baseline: checks) and the layer check of every near-tie (results: as compared)."""
    spec, ref = scenario.spec, scenario.spec.reference
    if spec.sampling:
        return TieEvidence()
    searched = set(beam_cases(scenario))
    cases = [c.case_id for c in scenario.cases if c.case_id not in searched]
    diverged = sorted({case for case in cases for name in spec.engines if name != ref and _apart(results, ref, name,
                                                                                              case)}
                      | (knobs_apart(checks or [], results) & set(cases)))
    if not diverged:
        return TieEvidence()
    high = noise_floor_dtype(spec.engines[ref].engine, spec.engine_dtype(ref))
    if high is None:
        evidence = TieEvidence(unmeasured=f"{spec.engines[ref].engine} cannot run in higher precision, so no noise "
                                          "was measured: only exact ties are near-ties")
        unchecked = LayerCheck(clean=True, unchecked="no noise floor: the reference cannot run in higher precision")
        evidence.layers = dict.fromkeys(near_ties(scenario, results, evidence, diverged), unchecked)
        return evidence
    with choice.kept_loaded([engine_plan(scenario, ref, run_dir, [], op="trace", compute_dtype=high).load_key]):
        evidence = TieEvidence(noise=_noise(scenario, run_dir, results, diverged, high, parallel, progress))
        missing = [c for c in diverged if c not in evidence.noise]
        if missing:
            evidence.unmeasured = f"the noise pass failed on {', '.join(missing)}: only exact ties are near-ties there"
        ties = near_ties(scenario, results, evidence, diverged)
        evidence.layers = _layer_checks(scenario, run_dir, results, ties, high, parallel, progress)
    return evidence


def knobs_apart(checks: list[Check], results: dict[tuple[str, str], Result]) -> set[str]:
    """The cases where an invariance knob's variant generated other tokens than its baseline."""
    return {a.case_id.split("#", 1)[0] for check in checks
            if not (check.unsupported or check.sampled or check.control or check.baseline is None
                    or check.variant is None)
            for a, b in zip(check.baseline.requests, check.variant.requests, strict=False)
            if _differ(results.get((check.baseline.config, a.case_id)), results.get((check.variant.config,
                                                                                     b.case_id)))}


def _apart(results: dict[tuple[str, str], Result], ref: str, name: str, case: str) -> bool:
    return _differ(results.get((ref, case)), results.get((name, case)))


def _differ(a: Result | None, b: Result | None) -> bool:
    """Both answered and their tokens differ."""
    return a is not None and b is not None and a.status == b.status == "ok" and a.token_ids != b.token_ids


def _noise(scenario: LoadedScenario, run_dir: Path, results: dict[tuple[str, str], Result], cases: list[str],
           high: str, parallel: int | None, progress: Progress) -> dict:
    """Each case's noise: the reference's generation against its own tokens scored in `high`."""
    ref, dtype = scenario.spec.reference, scenario.spec.engine_dtype(scenario.spec.reference)
    requests = [TraceRequest(case_id=c, token_ids=[*results[(ref, c)].prompt_ids, *results[(ref, c)].token_ids],
                             prompt_len=len(results[(ref, c)].prompt_ids), points=["logits"]) for c in cases]
    plan = engine_plan(scenario, ref, run_dir, requests, op="trace", plan_name=ref + NOISE, compute_dtype=high)
    outcomes, _ = run_engines([plan], parallel, progress)
    noise = {}
    for case, traced in outcomes[plan.name].results.items():
        if isinstance(traced, TraceResult) and traced.status == "ok":
            trace = Trace(traced.path)
            first, end = trace.span("logits")
            noise[case] = measure(results[(ref, case)], trace.rows("logits", first, end), dtype, high)
    return noise


def near_ties(scenario: LoadedScenario, results: dict[tuple[str, str], Result], evidence: TieEvidence,
              cases: list[str]) -> list[tuple[str, str]]:
    """(engine, case) whose divergence reads as a near-tie against the measured noise (or the scenario's tie
    margin; an unmeasured case: an exact tie), before any layer check."""
    spec, ref = scenario.spec, scenario.spec.reference
    found = []
    for name in spec.engines:
        if name == ref:
            continue
        pairs = [(results[(ref, c)], results[(name, c)]) for c in cases if _apart(results, ref, name, c)]
        if not pairs:
            continue
        frame = compare([a for a, _ in pairs], [b for _, b in pairs])
        expectation = spec.engine_expectation(name)
        margins, bounds = tie_bounds(frame["case_id"], evidence, expectation.tie_margin,
                                     expectation.max_logprob_delta)
        within = frame["tie_candidate"] & (frame["ref_top2_margin"] <= margins) & ~(
            frame["max_abs_logprob_delta"] > bounds)
        found += [(name, case) for case in frame.loc[within.to_numpy(), "case_id"]]
    return found


def _layer_checks(scenario: LoadedScenario, run_dir: Path, results: dict[tuple[str, str], Result],
                  ties: list[tuple[str, str]], high: str, parallel: int | None,
                  progress: Progress) -> dict[tuple[str, str], LayerCheck]:
    """Each near-tie's forced per-layer comparison (an engine that cannot be traced: why not)."""
    spec, ref = scenario.spec, scenario.spec.reference
    checks: dict[tuple[str, str], LayerCheck] = {}
    traceable = {n for n in spec.engines if scenario.description(n).capabilities.traces}
    local = choice.current().name == "local"  # a Ray cluster's workers may not see the reference's trace
    for name, case in ties:
        if name not in traceable or ref not in traceable or not local:
            who = name if name not in traceable else ref
            why = f"{spec.engines[who].engine} engines cannot be traced" if local else \
                "a Ray cluster's workers are not fed the reference's layer inputs"
            checks[(name, case)] = LayerCheck(clean=True, unchecked=why)
    wanted = [(n, c) for n, c in ties if (n, c) not in checks]
    if not wanted:
        return checks
    cases = sorted({c for _, c in wanted})
    requests = [trace_request(c, results[(ref, c)].prompt_ids, results[(ref, c)].token_ids) for c in cases]
    engines = [ref, *sorted({n for n, _ in wanted})]
    passes = plan_passes(scenario, run_dir, requests, engines, [], high, False, parallel or 1, free_passes=False)
    try:
        outcomes, _ = run_engines(passes.plans, parallel, progress)
        traces = {(name, cid): r for name, o in outcomes.items() for cid, r in o.results.items()}
        for name, case in wanted:
            checks[(name, case)] = _check(traces, (passes.floor_name, passes.free_floor_name), name, case,
                                          scenario)
    finally:
        passes.remove_scratch()
    return checks


def _check(traces: dict, floor_names: tuple[str | None, ...], name: str, case: str,
           scenario: LoadedScenario) -> LayerCheck:
    """One near-tie's layer check, as explain judges the pass (its k the scenario's where it sets one). A check that
    could not run (a failed pass, no floor) excuses nothing: not clean."""
    spec, ref = scenario.spec, scenario.spec.reference
    ref_result, result = traces.get((ref, case)), traces.get((name, case))
    for who, traced in ((ref, ref_result), (name, result)):
        if not (isinstance(traced, TraceResult) and traced.status == "ok"):
            return LayerCheck(clean=False, unchecked=f"{who}'s traced pass failed: "
                                                     f"{traced.error if traced is not None else 'not run'}")
    floors, _, missing = read_floors(traces, floor_names, case, ref_result)
    if floors.forced is None and floors.free is None:
        return LayerCheck(clean=False, unchecked=missing[0] if missing else "no noise floor")
    judged = judge_pass(result, ref_result, floors, spec.engine_dtype(ref), spec.explain.k)
    points = judged.points
    reach = float(points["sensitivity"].max()) if "sensitivity" in points else float("nan")
    out = points[points["leaves_floor"].to_numpy(dtype=bool)]
    if out.empty and not (ref_result.nonfinite or result.nonfinite):
        return LayerCheck(clean=True, k=judged.k, sensitivity=reach)
    if out.empty:
        return LayerCheck(clean=False, unchecked="an inf or NaN in a capture")
    first = out.iloc[0]
    return LayerCheck(clean=False, point=str(first["point"]), component=COMPONENT.get(parse(first["point"])[1], ""),
                      ratio=float(first["ratio"]), k=judged.k, sensitivity=reach)
