"""`parity explain`: after a run, feed each chosen case's reference token sequence (prompt + the reference's
generated tokens) to every traceable engine and to the reference in higher precision (the noise floor), capture every
canonical point, compare point by point and localise where and why the engines part.

Writes into the run directory: engines/<name>/traces/<case>.safetensors (the captures), and explain/ with
errors.parquet (per case, engine, point and position), routing.parquet (a mixture-of-experts model: the experts each
engine chose per case, layer and position, compared), points.parquet (per point: error, floor, ratio, whether it
leaves the floor), localisation.json and summary.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from adapters import registry
from harness import models
from harness.compare.floors import (
    Floors,
    default_k,
    floor_words,
    judge_pass,
    read_floors,
)
from harness.compare.own_top1 import TIE
from harness.compare.trace_diff import top2
from harness.core.errors import ConfigError
from harness.core.shards import shard_readings
from harness.core.types import Result, TraceRequest, TraceResult
from harness.executors.engine_runs import EngineOutcome, Progress, run_engines
from harness.explain.adapter_reading import compare as compare_updates
from harness.explain.adapter_reading import norms as adapter_norms
from harness.explain.adapter_reading import tolerance as update_tolerance
from harness.explain.early_passes import EarlyPasses
from harness.explain.kept_rows import keep_rows
from harness.explain.length_passes import length_dependent_rope, prefix_requests, reread
from harness.explain.localise import Divergence, Localisation, localise
from harness.explain.scored import against_reference
from harness.plan.plans import EnginePlan
from harness.run.outcome import RunOutcome
from harness.run.trace_passes import (
    FORCED,
    FREE,
    TracePasses,
    explained_engines,
    noise_floor_dtype,
    plan_passes,
    trace_request,
)
from harness.rundir.store import write_json
from harness.rundir.tables import read_results, read_steps, write_parquet
from harness.rundir.traces import Trace
from harness.scenario.prompts import load_tokenizer
from harness.semantics.meaning import explain_differences, param_differences


@dataclass
class ExplainOutcome:
    localisations: list[Localisation]
    explain_dir: Path
    notes: list[str]
    interrupted: bool


def choose_cases(outcome: RunOutcome, requested: list[str] | None) -> list[str]:
    """The requested cases, else every case some engine did not match on, else the first case."""
    all_ids = [c.case_id for c in outcome.scenario.cases]
    if requested:
        unknown = [c for c in requested if c not in all_ids]
        if unknown:
            raise ConfigError(f"--case: {unknown} not in {outcome.scenario.path} (cases: {', '.join(all_ids)})")
        return requested
    verdicts = outcome.verdicts
    off = set(verdicts.loc[verdicts["verdict"] != "match", "case_id"]) if not verdicts.empty else set()
    return [c for c in all_ids if c in off] or all_ids[:1]


def explain_run(outcome: RunOutcome, case_ids: list[str] | None, k: float | None, parallel: int,
                progress: Progress,
                on_start: Callable[[list[str], list[str]], None] = lambda names, cases: None,
                keep_traces: bool = False, early: EarlyPasses | None = None) -> ExplainOutcome:
    """Trace the chosen cases in every engine, compare, localise, and write explain/ (keep_traces: every trace
    whole in the run directory too; by default only what harness.explain.kept_rows keeps). early: the reference's
    and the floor's passes, started during the run (used when they trace the same cases)."""
    scenario, run_dir = outcome.scenario, outcome.run_dir
    spec, ref = scenario.spec, scenario.spec.reference
    k = k or spec.explain.k  # None: each pass's dtype and kind decide (harness.compare.floors.default_k)
    cases = choose_cases(outcome, case_ids)
    results = read_results(run_dir).set_index(["engine", "case_id"])
    steps = read_steps(run_dir).set_index(["engine", "case_id", "step"])
    notes: list[str] = []
    requests = []
    for case_id in cases:
        row = results.loc[(ref, case_id)]
        if row["status"] != "ok":
            notes.append(f"{case_id}: not explained: the reference failed ({row['error']})")
            continue
        requests.append(trace_request(case_id, row["prompt_ids"], row["token_ids"]))
    traceable, scorable = explained_engines(scenario)
    notes += [f"{n}: not traced ({spec.engines[n].engine} engines cannot capture activations): its verdict-level "
              "reasoning is given instead" + (", with its teacher-forced top-k logprobs" if n in scorable else "")
              for n in spec.engines if n not in traceable]
    if ref not in traceable:
        able = [name for name, d in registry.descriptions().items() if d.capabilities.traces]
        raise ConfigError(f"explain needs a reference engine that can be traced ({', '.join(able)}); '{ref}' is "
                          f"{spec.engines[ref].engine}: make one of those the reference")
    dtype = spec.engine_dtype(ref)
    high = noise_floor_dtype(spec.engines[ref].engine, dtype)
    if not high:
        notes.append(f"noise floor: {spec.engines[ref].engine} cannot run float64, so the floor is float32's "
                     "rounding unit alone")
    started = early is not None and early.matches(requests)
    if early is not None and not started:  # they trace other cases than these: not used, their folder removed
        early.close(abort=False)
        if early.not_started:
            notes.append(f"the reference's passes could not start during the run ({early.not_started}): they ran "
                         "after it")
    passes = early.passes if started else plan_passes(scenario, run_dir, requests, traceable, scorable, high,
                                                       keep_traces, parallel)
    try:
        on_start([p.name for p in passes.plans], [r.case_id for r in requests])
        outcomes, interrupted = _run_passes(passes.plans, early if started else None, parallel, progress)
        traces = {(name, cid): result for name, o in outcomes.items() for cid, result in o.results.items()}
        reference_folder = models.resolve(spec.reference_model, dtype, str(scenario.path))
        tokenizer = load_tokenizer(reference_folder)
        decode = lambda token: tokenizer.decode([int(token)])  # noqa: E731
        found = _compare_all(outcome, results, steps, requests, traces, passes, k, decode, notes)
        rope = length_dependent_rope(reference_folder)
        if rope and not interrupted:
            outcomes.update(_reread_lengths(outcome, found, requests, traceable, high, keep_traces, parallel,
                                            progress, k, decode, rope, notes))
        if passes.scratch is not None and not interrupted:
            kept = keep_rows(scenario, run_dir, requests, traces, found.per_point, found.localisations,
                             passes.reference_trace, parallel, progress)
            notes += kept.notes
            outcomes.update(kept.outcomes)
    finally:
        passes.remove_scratch()
    localisations, per_position, per_point = found.localisations, found.per_position, found.per_point
    explain_dir = run_dir / "explain"
    explain_dir.mkdir(exist_ok=True)
    if per_position:
        write_parquet(explain_dir / "errors.parquet", pd.concat(per_position, ignore_index=True))
    if per_point:
        write_parquet(explain_dir / "points.parquet", pd.concat(per_point, ignore_index=True))
    if found.routing:
        write_parquet(explain_dir / "routing.parquet", pd.concat(found.routing, ignore_index=True))
    meta = {"k": default_k(dtype, bool(passes.forced), k),
            "floor": floor_words(bool(passes.forced), dtype, high, passes.floor_name),
            "free_floor": passes.free_floor_name and floor_words(False, dtype, high, passes.free_floor_name),
            "forced": passes.forced, "cases": [r.case_id for r in requests],
            "engines": {n: {"load_s": o.load_s, "model_loads": o.model_loads, "versions": o.versions}
                        for n, o in outcomes.items()},
            "during_run": {"passes": early.names, "beside": early.beside} if started else None,
            "notes": notes, "localisations": [loc.model_dump() for loc in localisations]}
    write_json(explain_dir / "localisation.json", meta)
    from harness.explain.localisation_report import write_markdown

    write_markdown(explain_dir / "summary.md", scenario.name, run_dir.name, meta, decode)
    return ExplainOutcome(localisations, explain_dir, notes, interrupted)


def _run_passes(plans: list[EnginePlan], early: EarlyPasses | None, parallel: int,
                progress: Progress) -> tuple[dict[str, EngineOutcome], bool]:
    """Run the passes not started during the run beside those that were, then wait for both; outcomes by plan name,
    in plan order."""
    if early is None:
        return run_engines(plans, parallel, progress)
    early.attach(progress)
    rest = [p for p in plans if p.name not in early.names]
    try:
        outcomes, interrupted = run_engines(rest, parallel, progress, early.recorded)
    except BaseException:
        early.join(abort=True)
        raise
    done, stopped = early.join(abort=interrupted)
    both = {**done, **outcomes}
    return {p.name: both[p.name] for p in plans if p.name in both}, interrupted or stopped


@dataclass
class Compared:
    localisations: list[Localisation] = field(default_factory=list)
    per_position: list[pd.DataFrame] = field(default_factory=list)  # errors.parquet's rows, per engine and case
    per_point: list[pd.DataFrame] = field(default_factory=list)  # points.parquet's rows, per engine and case
    routing: list[pd.DataFrame] = field(default_factory=list)  # routing.parquet's rows (mixture-of-experts models)


def case_floors(traces: dict[tuple[str, str], Result | TraceResult], passes: TracePasses, case_id: str,
                ref_result: TraceResult, found: Compared, reference: str, notes: list[str]) -> Floors:
    """A case's noise floors (the forced one and the free one, where planned), their rows kept for errors.parquet."""
    floors, frames, missing = read_floors(traces, (passes.floor_name, passes.free_floor_name), case_id, ref_result)
    found.per_position += [frame.assign(case_id=case_id, engine=reference, compared_to=name)
                           for name, frame in frames.items()]
    notes += [f"{case_id}: {problem}" for problem in missing]
    return floors


def _compare_all(outcome: RunOutcome, results: pd.DataFrame, steps: pd.DataFrame, requests: list[TraceRequest],
                 traces: dict[tuple[str, str], Result | TraceResult], passes: TracePasses, k: float | None, decode,
                 notes: list[str]) -> Compared:
    """Every engine against the reference on every case, the noise floors first; notes collects what is missing."""
    spec, ref = outcome.scenario.spec, outcome.scenario.spec.reference
    found = Compared()
    for request in requests:
        ref_result = traces.get((ref, request.case_id))
        if _trace(ref_result) is None:
            notes.append(f"{request.case_id}: not explained: the reference's trace failed ({_error(ref_result)})")
            continue
        floors = case_floors(traces, passes, request.case_id, ref_result, found, ref, notes)
        for name in spec.engines:
            if name == ref:
                continue
            if not outcome.scenario.description(name).capabilities.traces:
                forced = traces.get((name + FORCED, request.case_id))
                found.localisations.append(untraced(outcome, name, request.case_id, forced, decode,
                                                    Trace(ref_result.path)))
                continue
            loc, frame, points, routed = _explain_engine(outcome, results, steps, request, name,
                                                         traces.get((name, request.case_id)),
                                                         traces.get((name + FREE, request.case_id)), ref_result,
                                                         floors, k, decode)
            found.localisations.append(loc)
            if frame is not None:
                notes += [f"{request.case_id}: {name}: {note}" for note in frame.attrs.get("notes", [])]
                found.per_position.append(frame.assign(case_id=request.case_id, engine=name, compared_to=ref))
                found.per_point.append(points.assign(case_id=request.case_id, engine=name))
            if routed is not None:
                found.routing.append(routed.assign(case_id=request.case_id, engine=name, compared_to=ref))
    return found


def _reread_lengths(outcome: RunOutcome, found: Compared, requests: list[TraceRequest], traceable: list[str],
                    high: str | None, keep_traces: bool, parallel: int, progress: Progress, k: float | None, decode,
                    rope: str, notes: list[str]) -> dict:
    """Trace each diverged case the full pass left unsettled again up to its divergent step, and read it
    (harness.explain.length_passes); returns the passes' outcomes, by plan name."""
    scenario, ref = outcome.scenario, outcome.scenario.spec.reference
    wanted = prefix_requests(requests, found.localisations)
    if not wanted:
        return {}
    totals = {r.case_id: len(r.token_ids) for r in requests}
    passes = plan_passes(scenario, outcome.run_dir, list({r.case_id: r for r in wanted.values()}.values()),
                         traceable, [], high, keep_traces, parallel, free_passes=False)
    try:
        outcomes, _ = run_engines(passes.plans, parallel, progress)
        traces = {(name, cid): result for name, o in outcomes.items() for cid, result in o.results.items()}
        for index, loc in enumerate(found.localisations):
            request = wanted.get(f"{loc.case_id}\n{loc.engine}")
            ref_result = traces.get((ref, request.case_id)) if request else None
            result = traces.get((loc.engine, request.case_id)) if request else None
            if request is None or _trace(ref_result) is None or _trace(result) is None:
                continue
            floors = case_floors(traces, passes, request.case_id, ref_result, Compared(), ref, notes)
            judged = judge_pass(result, ref_result, floors, scenario.spec.engine_dtype(ref), k)
            found.per_position.append(judged.frame.assign(case_id=request.case_id, engine=loc.engine,
                                                          compared_to=ref))
            found.per_point.append(judged.points.assign(case_id=request.case_id, engine=loc.engine))
            prefix = localise(judged.points, case_id=loc.case_id, engine=loc.engine, reference=ref,
                              prompt_equal=True, divergence=None, nonfinite={}, param_note="", k=judged.k,
                              decode=decode, routing=judged.routing, forced=result.forced,
                              fused={ref: Trace(ref_result.path).fused, loc.engine: Trace(result.path).fused})
            found.localisations[index] = reread(loc, prefix, len(request.token_ids), totals[loc.case_id], rope)
    finally:
        passes.remove_scratch()
    return {f"{name}@prefix": o for name, o in outcomes.items()}


UNTRACED_CAUSE = {"match": "none", "benign_tie": "near_tie", "hazard": "hazard", "engine_error": "no_trace"}


def untraced(outcome: RunOutcome, name: str, case_id: str, forced: Result | None = None,
             decode: Callable[[int], str] = str, reference: Trace | None = None) -> Localisation:
    """An engine that cannot be traced still gets the verdict-level reasoning of the run: the divergence step, the
    near-tie rule, whether a token was chosen after the logits (its own top-1 check), the params that differ; and,
    where it can score a given text (teacher-forced top-k logprobs, e.g. a server's echo), what it ranks first at
    the divergent step given the reference's tokens, and how far those logprobs are from the reference's own
    (reference: its trace)."""
    ref = outcome.scenario.spec.reference
    row = outcome.verdicts.set_index(["engine", "case_id"]).loc[(name, case_id)]
    picked_after = "chosen after the logits" in row["explanation"]
    cause = UNTRACED_CAUSE.get(row["verdict"], "sampler" if picked_after else "untraced")
    step = int(row["first_divergence"]) if row["first_divergence"] is not None and row["first_divergence"] >= 0 \
        else None
    verdict = f"not traced (no per-layer capture for this engine); from the run: {row['verdict']}: {row['explanation']}"
    scored = against_reference(forced, reference) if forced is not None and reference is not None else ""
    if scored:
        verdict += f"; {scored}"
    if forced is not None and step is not None:
        note, forced_cause = forced_note(name, forced, step, int(row["ref_token"]), int(row["engine_token"]), decode)
        verdict += f"; {note}"
        cause = forced_cause or cause
    return Localisation(case_id=case_id, engine=name, reference=ref, cause=cause, first_step=step, verdict=verdict)


def forced_note(name: str, forced: Result, step: int, ref_token: int, engine_token: int,
                decode: Callable[[int], str]) -> tuple[str, str | None]:
    """What an untraced engine ranks first at the divergent step when fed the reference's tokens, and the cause that
    implies (None: no change to the run's reading)."""
    if forced.status != "ok":
        return f"no teacher-forced logprobs ({forced.error})", None
    if step >= len(forced.top_ids) or len(forced.top_ids[step]) < 2:
        return f"the teacher-forced logprobs have no top-2 at step {step}", None
    top, values = forced.top_ids[step], forced.top_logprobs[step]
    margin = values[0] - values[1]
    text = (f"teacher-forced on the reference's tokens, at step {step} {name} ranks {decode(top[0])!r} "
            f"first, {margin:.3g} nats above {decode(top[1])!r}")
    if top[0] == ref_token and engine_token != ref_token:
        return (text + ": given the same tokens it agrees with the reference, so its generation chose "
                f"{decode(engine_token)!r} after the logits (sampler or penalty semantics)"), "sampler"
    if top[0] == engine_token:
        return text + ": its own logits prefer the token it generated, a difference in the logits", None
    return text, None


def _trace(result: TraceResult | None) -> Trace | None:
    return Trace(result.path) if result is not None and result.status == "ok" else None


def _error(result: TraceResult | None) -> str:
    return "not run (interrupted)" if result is None else result.error


def _divergence(steps: pd.DataFrame, ref: str, name: str, request: TraceRequest, step: int, ref_trace: Trace,
                trace: Trace) -> Divergence | None:
    """Both engines at the first divergent step, as generated (steps.parquet) and teacher-forced (the traces)."""
    try:
        ref_row, row = steps.loc[(ref, request.case_id, step)], steps.loc[(name, request.case_id, step)]
    except KeyError:  # one side ended before this step (a length difference, not a token difference)
        return None
    position = request.prompt_len + step - 1
    (forced_ref_top, forced_ref_margin), (forced_top, forced_margin) = top2(ref_trace, position), top2(trace, position)
    return Divergence(step=step, ref_token=int(ref_row["token_id"]), engine_token=int(row["token_id"]),
                      ref_top=[int(t) for t in ref_row["top_ids"][:2]], ref_margin=_margin(ref_row),
                      engine_top=[int(t) for t in row["top_ids"][:2]], engine_margin=_margin(row),
                      ref_took_argmax=_took_argmax(ref_row), engine_took_argmax=_took_argmax(row), position=position,
                      forced_ref_top=forced_ref_top, forced_ref_margin=forced_ref_margin,
                      forced_engine_top=forced_top, forced_engine_margin=forced_margin)


def _margin(step_row) -> float:
    values = step_row["top_logprobs"]
    return float(values[0] - values[1]) if len(values) > 1 else float("nan")


def _took_argmax(step_row) -> bool:
    """Whether the chosen token is (tied with) the best of the raw logits, as greedy decoding without penalties
    picks it; exact ties count, since engines break them differently."""
    return bool(step_row["chosen_logprob"] >= step_row["top_logprobs"][0] - TIE)


def _explain_engine(outcome: RunOutcome, results: pd.DataFrame, steps: pd.DataFrame, request: TraceRequest, name: str,
                    result: TraceResult | None, free: TraceResult | None, ref_result: TraceResult, floors: Floors,
                    override_k: float | None, decode):
    """One engine vs the reference on one case: its localisation, per-position errors and per-point summary. free:
    the engine's free pass (the logits of its own layers' outputs), where its traced pass was layer-forced."""
    spec, ref = outcome.scenario.spec, outcome.scenario.spec.reference
    ref_trace, trace = _trace(ref_result), _trace(result)
    if trace is None:
        return (Localisation(case_id=request.case_id, engine=name, reference=ref, cause="no_trace",
                             verdict=f"no trace from {name}: {_error(result)}"),
                None, None, None)
    judged = judge_pass(result, ref_result, floors, spec.engine_dtype(ref), override_k)
    frame, points, routed, k = judged.frame, judged.points, judged.routing, judged.k
    free_trace = _trace(free) if free is not None else None
    if result.forced and free_trace is None:
        frame.attrs.setdefault("notes", []).append(
            f"its free logits pass failed ({_error(free)}): the readings at the divergent step use the logits of its "
            "forced pass, whose last layer started from the reference's")
    logits_trace = free_trace or trace
    if trace.metadata.get("capture_note"):
        frame.attrs.setdefault("notes", []).append(trace.metadata["capture_note"])
    if bool(ref_result.routes) != bool(result.routes):
        blind = name if ref_result.routes else ref
        frame.attrs.setdefault("notes", []).append(
            f"the chosen experts are not compared: {blind}'s architecture map says nowhere its routing returns them "
            "(the router logits and the block's output are compared as points where both capture them)")
    verdict = outcome.verdicts.set_index(["engine", "case_id"]).loc[(name, request.case_id)]
    divergence = None
    if verdict["verdict"] in ("diverged", "benign_tie") and verdict["first_divergence"] >= 0:
        divergence = _divergence(steps, ref, name, request, int(verdict["first_divergence"]), ref_trace,
                                 logits_trace)
    case = next(c for c in outcome.scenario.cases if c.case_id == request.case_id)
    prompt_equal = list(results.loc[(ref, request.case_id)]["prompt_ids"]) == list(
        results.loc[(name, request.case_id)]["prompt_ids"]) if (name, request.case_id) in results.index else True
    param_note = explain_differences(param_differences(case.engine_params[ref], case.engine_params[name]))
    nonfinite = {r.engine: r.nonfinite for r in (ref_result, result) if r.nonfinite}
    ending = _ending(results, ref, name, request.case_id, verdict) if divergence is None else ""
    loc = localise(points, case_id=request.case_id, engine=name, reference=ref, prompt_equal=prompt_equal,
                   divergence=divergence, nonfinite=nonfinite, fused={ref: ref_trace.fused, name: trace.fused},
                   param_note=param_note, k=k, decode=decode, ending=ending,
                   missing_map="; ".join(dict.fromkeys(filter(None, (t.metadata.get("missing_map", "")
                                                                     for t in (ref_trace, trace))))),
                   near_tie=verdict["verdict"] == "benign_tie", routing=routed,
                   adapter=adapter_difference(ref_trace, trace, name), forced=result.forced,
                   run_reading=_not_a_tie(verdict["explanation"]), shards=shard_readings(trace.metadata),
                   caches={who: t.metadata["kv_cache"] for who, t in ((ref, ref_trace), (name, trace))
                           if t.metadata.get("kv_cache")})
    return loc, frame, points, routed


def _not_a_tie(explanation: str) -> str:
    """The run's reason a divergence is no near-tie, from its verdict's explanation ('' where it gives none)."""
    return next((part.strip() for part in explanation.split("; ") if part.strip().startswith("not a near-tie")), "")


def adapter_difference(ref_trace: Trace, trace: Trace, name: str) -> dict | None:
    """The two engines' LoRA updates compared, where both applied an adapter (None otherwise)."""
    ref_norms, norms = adapter_norms(ref_trace.metadata), adapter_norms(trace.metadata)
    if ref_norms is None or norms is None:
        return None
    dtypes = (ref_trace.metadata.get("dtype", "float32"), trace.metadata.get("dtype", "float32"))
    return compare_updates(ref_norms, norms, int(trace.metadata.get("lora_rank", "0")), name, update_tolerance(*dtypes))


def _ending(results: pd.DataFrame, ref: str, name: str, case_id: str, verdict: pd.Series) -> str:
    """The run judged the case apart with no token step to compare: the engines agree token for token up to where
    one of them stops. How each ended, in words ('' when the run saw no difference)."""
    if verdict["verdict"] == "match" or (name, case_id) not in results.index:
        return ""
    ends = {who: results.loc[(who, case_id)] for who in (ref, name)}
    lengths = {who: len(row["token_ids"]) for who, row in ends.items()}
    if lengths[ref] == lengths[name]:
        return ""
    how = ", ".join(f"{who} after {lengths[who]} tokens (finish reason {row['finish_reason'] or 'unknown'!s})"
                    for who, row in ends.items())
    return (f"the generated tokens agree for the first {min(lengths.values())} steps and the engines stop at "
            f"different steps: {how}")
