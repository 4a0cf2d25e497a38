"""`parity explain` for beam search: each engine's own beam-search loop on the reference model's numbers.

Re-scoring the beams an engine returned is not enough: a search prunes among candidates it never returns. So every
engine's loop (HF's generate, vLLM's offline and server loops: adapters.sampling.<engine>.beam_search) runs again, in
that engine's interpreter, with the reference model's logits as the only source of numbers (adapters.sampling.oracle),
and harness.explain.beam_causes tells rules from numerics. Writes explain/beams.json and explain/beams.md into the run
directory.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import models
from harness.compare.beam_rules import beam_cases, beam_tolerance
from harness.core.types import BEAM_EFFECTIVE, Beam, Effective
from harness.explain.beam_causes import BeamExplanation, LoopRun, explain_case
from harness.run.outcome import RunOutcome
from harness.rundir.store import write_atomic, write_json
from harness.rundir.tables import read_beams, read_results
from harness.scenario.prompts import load_tokenizer
from harness.semantics.effective import describe_differences, differing_fields
from harness.semantics.jobs import SamplingJob, SamplingJobFailed


@dataclass
class BeamExplainOutcome:
    explanations: list[BeamExplanation]
    notes: list[str]
    path: Path


def split_cases(outcome: RunOutcome, chosen: list[str]) -> tuple[list[str], list[str]]:
    """(beam-search cases, token-level cases) among the chosen ones."""
    beams = set(beam_cases(outcome.scenario))
    return [c for c in chosen if c in beams], [c for c in chosen if c not in beams]


def _real_beams(run_dir: Path) -> dict[tuple[str, str], list[Beam]]:
    """The beams each engine returned in the run (none when every engine failed: no beams.parquet)."""
    frame = read_beams(run_dir)
    beams: dict[tuple[str, str], list[Beam]] = {}
    for row in ([] if frame is None else frame.sort_values(["engine", "case_id", "rank"]).itertuples()):
        logprobs = [None if pd.isna(v) else float(v) for v in row.logprobs]
        beams.setdefault((row.engine, row.case_id), []).append(Beam(
            token_ids=[int(t) for t in row.token_ids], logprobs=logprobs,
            cum_logprob=row.cum_logprob, score=None if pd.isna(row.score) else row.score,
            finish_reason=row.finish_reason, text=row.text))
    return beams


def _run_loops(outcome: RunOutcome, cases: list[str], real: dict[tuple[str, str], list[Beam]],
               prompt_ids: dict[str, list[int]]) -> dict[str, dict[str, LoopRun | str]]:
    """engine -> case -> its loop on the oracle, or why it could not run. One job per interpreter: the engines that
    share one share the oracle, so each sequence's numbers are computed once."""
    scenario = outcome.scenario
    spec, ref = scenario.spec, scenario.spec.reference
    dtype = spec.engine_dtype(ref)
    model_path = models.resolve(spec.reference_model, dtype, str(scenario.path))
    by_id = {c.case_id: c for c in scenario.cases}
    loops: dict[str, dict[str, LoopRun | str]] = {}
    jobs: dict[str | None, SamplingJob] = {}
    for case_id in cases:  # a case's loops one after another: the oracle keeps that prompt's numbers
        for name, engine in spec.engines.items():
            code = scenario.description(name).sampling_code(engine.options)
            if (name, case_id) not in real:
                continue
            if code is None:
                loops.setdefault(name, {})[case_id] = "it has no sampling code to run here"
                continue
            job = jobs.setdefault(engine.python, SamplingJob("beams", name, code, model_path, dtype, [], engine.python,
                                                             spec.engine_threads(ref)))
            job.items.append({"case_id": case_id, "engine": name, "module": code.module, "kwargs": code.kwargs,
                              "params": by_id[case_id].engine_params[name].model_dump(),
                              "prompt_ids": prompt_ids[case_id], "real": [b.token_ids for b in real[(name, case_id)]]})

    def one(job: SamplingJob) -> list[tuple[str, str, LoopRun | str]]:
        try:
            answer = job.run(timeout=1800)
        except SamplingJobFailed as exc:
            return [(item["engine"], item["case_id"], str(exc)) for item in job.items]
        return [(item["engine"], item["case_id"], item["error"] if "error" in item else LoopRun(
            [Beam.model_validate(b) for b in item["beams"]], item["steps"], item["real_logprobs"]))
            for item in answer["items"]]

    with ThreadPoolExecutor(max_workers=2) as pool:
        for answers in pool.map(one, jobs.values()):
            for engine, case_id, run in answers:
                loops.setdefault(engine, {})[case_id] = run
    return loops


def explain_beams(outcome: RunOutcome, cases: list[str]) -> BeamExplainOutcome:
    scenario, run_dir = outcome.scenario, outcome.run_dir
    spec, ref = scenario.spec, scenario.spec.reference
    real = _real_beams(run_dir)
    prompt_ids = _prompt_ids(run_dir, ref)
    loops = _run_loops(outcome, cases, real, prompt_ids)
    tokenizer = load_tokenizer(models.resolve(spec.reference_model, spec.engine_dtype(ref), str(scenario.path)))
    decode = lambda ids: tokenizer.decode([int(t) for t in ids])  # noqa: E731
    notes = sorted({f"{name}: its beam-search loop could not run on the reference model's numbers: {why}"
                    for name, runs in loops.items() for why in runs.values() if isinstance(why, str)})
    by_id = {c.case_id: c for c in scenario.cases}
    effective = _effective(run_dir)
    explanations = []
    for case_id in cases:
        params = by_id[case_id].engine_params[ref]
        n = params.beams_returned
        for name in spec.engines:
            if name == ref:
                continue
            runs = [loops.get(who, {}).get(case_id) for who in (ref, name)]
            missing = [(who, why) for who, why in zip((ref, name), runs) if not isinstance(why, LoopRun)]
            if (ref, case_id) not in real or (name, case_id) not in real or missing:
                reason = "; ".join(f"{who}: {why or 'no beams in this run'}" for who, why in missing) or \
                    "an engine returned no beams in this run"
                explanations.append(BeamExplanation(case_id=case_id, engine=name, reference=ref, cause="failed",
                                                    verdict=f"not explained: {reason}"))
                continue
            explanations.append(explain_case(case_id, ref, name, real[(ref, case_id)], real[(name, case_id)],
                                             runs[0], runs[1], n, decode, tolerance=beam_tolerance(scenario, name),
                                             length_penalty=1.0 if params.length_penalty is None
                                             else params.length_penalty,
                                             rules=_rules(effective, ref, name, case_id)))
    out = run_dir / "explain"
    out.mkdir(exist_ok=True)
    write_json(out / "beams.json", {"oracle": f"{spec.reference_model} in {spec.engine_dtype(ref)} (transformers)",
                                    "notes": notes, "explanations": [e.model_dump() for e in explanations]})
    write_atomic(out / "beams.md", _markdown(scenario.name, run_dir.name, notes, explanations))
    return BeamExplainOutcome(explanations, notes, out / "beams.md")


def _effective(run_dir: Path) -> dict[tuple[str, str], Effective]:
    results = read_results(run_dir)
    found = {(r.engine, r.case_id): json.loads(r.effective) for r in results.itertuples()}
    return {key: Effective.model_validate(e) for key, e in found.items() if e.get("decoding")}


def _rules(effective: dict[tuple[str, str], Effective], ref: str, name: str, case_id: str) -> str:
    """The beam-search settings in which the two engines' own code differs, in words ('' if unknown or equal)."""
    if (ref, case_id) not in effective or (name, case_id) not in effective:
        return ""
    by_engine = {ref: effective[(ref, case_id)], name: effective[(name, case_id)]}
    return describe_differences(by_engine, [f for f in differing_fields(by_engine) if f in BEAM_EFFECTIVE])


def _prompt_ids(run_dir: Path, reference: str) -> dict[str, list[int]]:
    """The prompt ids of each case, as the reference ran them."""
    results = read_results(run_dir)
    return {row.case_id: [int(t) for t in row.prompt_ids] for row in results.itertuples() if row.engine == reference}


def explanation_lines(e: BeamExplanation) -> list[str]:
    return [f"{e.case_id} [{e.engine} vs {e.reference}]: {e.cause}" + (f" (step {e.step})" if e.step is not None
                                                                        else ""), f"  {e.verdict}"]


def _markdown(scenario: str, run_id: str, notes: list[str], explanations: list[BeamExplanation]) -> str:
    lines = [f"# explain (beam search): {scenario}, run {run_id}", "",
             "Each engine's own beam-search loop ran again with the reference model's logits as its only numbers: "
             "rules when the other engine's loop on those numbers reproduces its real beams, numerics when both "
             "loops on the same numbers agree, both when neither alone explains it.", ""]
    lines += [f"- note: {n}" for n in notes]
    for e in explanations:
        lines += ["", f"## {e.case_id}: {e.engine} vs {e.reference}", "",
                  f"**{e.cause}**" + (f" (step {e.step})" if e.step is not None else "") + f": {e.verdict}"]
    return "\n".join(lines) + "\n"
