"""Beam-search verdicts: each engine's returned beams against the reference's, case by case.

Four facts per case and engine, over the best N beams (N = num_return_sequences, else num_beams, or fewer when an
engine returned fewer): the best beam is identical; the beam set is identical (order-insensitive); the scores of the
beams both returned agree within the tolerance (the cumulative logprob, and the engine's final score where both
report one); the step where the best beams first differ. The verdict is `match` when all hold, else `diverged`.
Knows nothing about engines: which rules they apply is in their effective params, which the explanation cites.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pandas as pd

from harness.compare.gate import DEFAULT_LOGPROB_TOLERANCE
from harness.core.types import Beam, Result
from harness.scenario.spec import LoadedScenario
from harness.semantics.meaning import explain_differences, param_differences

Decode = Callable[[int], str]
Judge = Callable[[LoadedScenario, dict[tuple[str, str], Result], Decode], pd.DataFrame]


@dataclass
class BeamComparison:
    compared: int  # beams compared per side
    best_identical: bool
    set_identical: bool
    first_divergence: int  # of the best beams; -1: identical
    shared: list[tuple[Beam, Beam]] = field(default_factory=list)  # (reference, other) beams with the same tokens
    cum_deltas: list[float] = field(default_factory=list)
    score_deltas: list[float] = field(default_factory=list)

    @property
    def max_cum_delta(self) -> float:
        return max(self.cum_deltas, default=math.nan)

    @property
    def max_score_delta(self) -> float:
        return max(self.score_deltas, default=math.nan)

    def scores_within(self, tolerance: float) -> bool:
        return all(d <= tolerance for d in self.cum_deltas + self.score_deltas)

    def matches(self, tolerance: float) -> bool:
        """The verdict's rule: the same best beam, the same beam set, and their scores within the tolerance."""
        return self.best_identical and self.set_identical and self.scores_within(tolerance)


def beam_tolerance(scenario: LoadedScenario, engine: str) -> float:
    """The largest |delta| of a shared beam's cumulative logprob or score that still matches, for one engine."""
    return scenario.spec.engine_expectation(engine).max_logprob_delta or DEFAULT_LOGPROB_TOLERANCE


def first_difference(a: list[int], b: list[int]) -> int:
    """The first step where two token sequences differ (the shorter one's end counts); -1 if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def compare_beams(reference: list[Beam], other: list[Beam], wanted: int) -> BeamComparison:
    n = min(wanted, len(reference), len(other))
    ref, oth = reference[:n], other[:n]
    ref_sets = sorted(tuple(b.token_ids) for b in ref)
    oth_by_tokens = {tuple(b.token_ids): b for b in oth}
    shared = [(b, oth_by_tokens[tuple(b.token_ids)]) for b in ref if tuple(b.token_ids) in oth_by_tokens]
    first = first_difference(ref[0].token_ids, oth[0].token_ids) if n else -1
    out = BeamComparison(compared=n, best_identical=n > 0 and first == -1,
                         set_identical=ref_sets == sorted(oth_by_tokens) and len(ref) == len(oth),
                         first_divergence=first, shared=shared)
    for a, b in shared:
        if a.cum_logprob is not None and b.cum_logprob is not None:
            out.cum_deltas.append(abs(a.cum_logprob - b.cum_logprob))
        if a.score is not None and b.score is not None:
            out.score_deltas.append(abs(a.score - b.score))
    return out


def _text(beam: Beam, decode: Decode, limit: int = 60) -> str:
    text = beam.text or "".join(decode(t) for t in beam.token_ids)
    return repr(text if len(text) <= limit else "..." + text[-limit:])


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def describe(c: BeamComparison, ref: Result, other: Result, tolerance: float, decode: Decode) -> str:
    """The four facts in words, with the beams involved."""
    ref_beams, oth_beams = ref.beams[: c.compared], other.beams[: c.compared]
    parts = []
    if c.best_identical:
        parts.append(f"identical best beam ({len(ref_beams[0].token_ids)} tokens)")
    else:
        step = c.first_divergence
        parts.append(f"best beams differ from step {step}: reference {_text(ref_beams[0], decode)} "
                     f"(cum logprob {_num(ref_beams[0].cum_logprob)}, score {_num(ref_beams[0].score)}), "
                     f"{other.engine} {_text(oth_beams[0], decode)} (cum logprob {_num(oth_beams[0].cum_logprob)}, "
                     f"score {_num(oth_beams[0].score)})")
    if c.set_identical:
        parts.append(f"same {c.compared} beams")
    else:
        shared = {tuple(a.token_ids) for a, _ in c.shared}
        only_ref = [b for b in ref_beams if tuple(b.token_ids) not in shared]
        only_oth = [b for b in oth_beams if tuple(b.token_ids) not in shared]
        parts.append(f"{len(c.shared)} of {c.compared} beams shared; only the reference's: "
                     + ", ".join(f"#{ref_beams.index(b)} {_text(b, decode, 40)}" for b in only_ref)
                     + f"; only {other.engine}'s: "
                     + ", ".join(f"#{oth_beams.index(b)} {_text(b, decode, 40)}" for b in only_oth))
    if not c.shared:
        parts.append("no beam in common, so no score to compare")
    elif c.scores_within(tolerance):
        parts.append(f"scores of the shared beams within {tolerance:g} (cum logprob max |delta| "
                     f"{_num(c.max_cum_delta)}, final score max |delta| {_num(c.max_score_delta)})")
    else:
        worst = max(c.shared, key=lambda pair: abs((pair[0].score or 0) - (pair[1].score or 0)))
        parts.append(f"scores of the shared beams differ beyond {tolerance:g}: cum logprob max |delta| "
                     f"{_num(c.max_cum_delta)}, final score max |delta| {_num(c.max_score_delta)} (e.g. "
                     f"{_text(worst[0], decode, 30)}: reference {_num(worst[0].score)}, {other.engine} "
                     f"{_num(worst[1].score)})")
    return "; ".join(parts)


def judge_beams(scenario: LoadedScenario, results: dict[tuple[str, str], Result], decode: Decode) -> pd.DataFrame:
    """One verdict row per beam-search case and non-reference engine (columns of harness.compare.token_rules)."""
    from harness.compare.token_rules import COLUMNS, effective_note

    spec, ref_name = scenario.spec, scenario.spec.reference
    rows = []
    for engine in spec.engines:
        if engine == ref_name:
            continue
        expectation = spec.engine_expectation(engine)
        tolerance = beam_tolerance(scenario, engine)
        for case in scenario.cases:
            ref, other = results.get((ref_name, case.case_id)), results.get((engine, case.case_id))
            row = {"case_id": case.case_id, "engine": engine, "reference": ref_name}
            failed = [r or Result.engine_error(case.case_id, n, "not run: the run was interrupted")
                      for r, n in ((ref, ref_name), (other, engine)) if r is None or r.status != "ok" or not r.beams]
            if failed:
                rows.append({**row, "verdict": "engine_error", "expected": False, "explanation": "; ".join(
                    f"{r.engine}: {r.error or 'returned no beams'}" for r in failed)})
                continue
            c = compare_beams(ref.beams, other.beams, case.engine_params[ref_name].beams_returned)
            verdict = "match" if c.matches(tolerance) else "diverged"
            given = param_differences(case.engine_params[ref_name], case.engine_params[engine])
            text = "; ".join(t for t in (describe(c, ref, other, tolerance, decode), explain_differences(given),
                                         effective_note(ref, other, set(given))) if t)
            cum = c.cum_deltas
            step = c.first_divergence
            rows.append({**row, "verdict": verdict, "expected": _expected(verdict, expectation.tokens),
                         "first_divergence": step, "ref_len": len(ref.beams[0].token_ids),
                         "engine_len": len(other.beams[0].token_ids),
                         "max_abs_logprob_delta": c.max_cum_delta,
                         "mean_abs_logprob_delta": sum(cum) / len(cum) if cum else math.nan,
                         "ref_token": _at(ref.beams[0], step), "engine_token": _at(other.beams[0], step),
                         "best_beam_identical": c.best_identical, "beam_set_identical": c.set_identical,
                         "beam_scores_within": c.scores_within(tolerance), "max_beam_score_delta": c.max_score_delta,
                         "beams_compared": c.compared, "explanation": text})
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def _at(beam: Beam, step: int) -> int:
    return beam.token_ids[step] if 0 <= step < len(beam.token_ids) else -1


def _expected(verdict: str, tokens: str) -> bool:
    return verdict == "match" or (tokens == "any" and verdict == "diverged")


def beam_cases(scenario: LoadedScenario) -> list[str]:
    """The cases decoded by beam search (every engine of such a case searches beams: the scenario checks it)."""
    return [c.case_id for c in scenario.cases if c.engine_params[scenario.spec.reference].num_beams]


def judge_all(judge_tokens: Judge, scenario: LoadedScenario, results: dict[tuple[str, str], Result],
              decode: Decode) -> pd.DataFrame:
    """Token-level verdicts for the ordinary cases, beam verdicts for the beam-search ones, in one table."""
    beams = set(beam_cases(scenario))
    parts = []
    for judge, searched in ((judge_tokens, False), (judge_beams, True)):
        cases = [c for c in scenario.cases if (c.case_id in beams) == searched]
        if cases:
            ids = {c.case_id for c in cases}
            parts.append(judge(replace(scenario, cases=cases), {k: r for k, r in results.items() if k[1] in ids},
                               decode))
    filled = [p for p in parts if not p.empty]
    return pd.concat(filled, ignore_index=True) if filled else parts[0]
