"""Is an engine invariant to how its requests are served? One knob (batching, order, concurrency, prefix cache, chunked
prefill, speculative decoding, seed, a repeat) runs the same cases under a baseline and a variant configuration of
the same engine; this module judges the pair. Knows nothing about engines.

Verdicts per knob, over all its cases:
  identical         token ids, chosen logprobs and top-k lists bitwise equal
  text_diverged     token ids equal but the text or the finish reason differs, an answer the server split (calls,
                    reasoning) splits otherwise, or a streamed answer's chunks are not whole text (a character split
                    between chunks, a stop string leaked): the client reads another answer
  tokens_identical  token ids equal; the largest chosen-token |delta logprob| is the drift
  diverged          tokens differ: at the first divergent case and step, a near-tie flip when the baseline's top-2
                    margin there, and the drift on the steps both shared, are within twice the engine's own noise
                    measured apart from the knob (its repeat knob's drift, else the scenario's max_logprob_delta;
                    neither: only exact ties), a real difference otherwise
  distribution_match / distribution_diverged   sampled knobs whose random stream may change (speculative
                    decoding): a G-test on the first tokens of many samples
  distribution_undetermined   every case's prefixes are rarer than the G-test needs (nothing left to compare after
                    pooling): the check could not see, and fails (a case that alone is undetermined is named)
  unsupported       the engine cannot turn this knob (the reason says engine, version, device)
  engine_error      a side failed
A negative control (a change that must make the generation differ) must come out diverged; one that does not means
the check could not have seen a difference, and fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel

from harness.compare import text_rules, tool_rules
from harness.compare.diff import compare
from harness.compare.sampling_parity import described, g_test, prefixes
from harness.compare.tie_noise import BAND
from harness.core.types import Result

InvarianceVerdict = Literal["identical", "tokens_identical", "text_diverged", "diverged", "distribution_match",
                            "distribution_diverged", "distribution_undetermined", "unsupported", "engine_error"]
FAILING = {"diverged", "text_diverged", "distribution_diverged", "distribution_undetermined", "engine_error"}


class InvarianceRow(BaseModel):
    """One row of invariance.parquet."""

    engine: str
    knob: str
    baseline: str  # what the baseline configuration is, in words
    variant: str
    verdict: InvarianceVerdict
    control: bool = False  # a negative control: it must come out diverged
    expected: bool = True
    first_divergence: int | None = None
    near_tie: bool | None = None  # diverged: the first divergence is a near-tie flip (None: not a token divergence)
    case_id: str | None = None  # the first divergent case
    max_abs_logprob_delta: float | None = None
    cases: int = 0
    explanation: str = ""


Noise = tuple[float, float, str]  # an engine's own noise measured apart from the knob judged: how far a gap between
# two top tokens moves, how far a chosen token's logprob drifts, and where it came from


@dataclass(frozen=True)
class KnobNoise:
    """What a knob's near-tie band is made of: the engine's noise for any case, and a case's own where it was
    measured (the reference's rounding noise on it: harness.compare.tie_noise); the larger of the two counts."""

    default: Noise = (0.0, 0.0, "no noise measured apart from the knob (no repeat knob, no max_logprob_delta, no "
                                "noise pass): only exact ties")
    cases: dict[str, Noise] = field(default_factory=dict)

    def of(self, case_id: str) -> Noise:
        case = self.cases.get(case_id.split("#", 1)[0])  # an invariance request's id carries its configuration
        if case is None:
            return self.default
        if self.default[0] == self.default[1] == 0.0:
            return case
        return (max(case[0], self.default[0]), max(case[1], self.default[1]), f"{case[2]}; {self.default[2]}")


UNMEASURED = KnobNoise()


def judge_pair(baseline: list[Result], variant: list[Result], decode: Callable[[int], str],
               noise: KnobNoise = UNMEASURED) -> dict:
    """Verdict fields for one knob: baseline[i] and variant[i] are the same case. noise: the engine's own noise
    measured apart from this knob (a near-tie is within twice it)."""
    failed = [r for r in (*baseline, *variant) if r.status != "ok"]
    if failed:
        return {"verdict": "engine_error", "case_id": failed[0].case_id, "cases": len(baseline),
                "explanation": f"{failed[0].case_id}: {failed[0].error}"}
    verdict = _judge_tokens(baseline, variant, decode, noise)
    if verdict["verdict"] != "diverged":
        differences = answer_differences(baseline, variant)
        if differences:
            verdict = {**verdict, "verdict": "text_diverged", "case_id": differences[0][0],
                       "explanation": f"token ids equal, but {len(differences)} answer(s) read otherwise; first "
                                      f"{differences[0][0]}: {differences[0][1]}"}
    return {**verdict, "explanation": verdict["explanation"] + _variant_warnings(baseline, variant)}


def answer_differences(baseline: list[Result], variant: list[Result]) -> list[tuple[str, str]]:
    """(case, what differs) where the client reads another answer from equal ids: the text, or for an answer the
    server split, its calls (as JSON values), reasoning and content (tool_rules: whitespace alone is no finding); the
    finish reason; a streamed answer's chunks (text_rules.delta_findings)."""
    found = []
    for a, b in zip(baseline, variant, strict=True):
        problems = []
        if a.message or b.message:
            split = tool_rules.split_difference(a.message or {"content": a.text}, b.message or {"content": b.text})
            if split is not None:
                problems.append(f"the answer splits otherwise: {split.words}")
        elif a.text != b.text:
            problems.append(text_rules.text_difference(b.text, a.text, against="the baseline's", finding=""))
        if a.finish_reason.lower() != b.finish_reason.lower():
            problems.append(f"finish reason {a.finish_reason!r} against {b.finish_reason!r}")
        for r in (a, b):
            problems += text_rules.delta_findings(r.deltas, r.text, list(r.native_params.get("stop") or []),
                                                  r.effective.get("include_stop_str_in_output"))
        if problems:
            found.append((a.case_id, "; ".join(problems)))
    return found


def _variant_warnings(baseline: list[Result], variant: list[Result]) -> str:
    """The warnings only the variant's results carry (a param its configuration drops, say): a likely cause."""
    extra = sorted({w for r in variant for w in r.warnings} - {w for r in baseline for w in r.warnings})
    return f"; only the variant warns: {'; '.join(extra)}" if extra else ""


def _judge_tokens(baseline: list[Result], variant: list[Result], decode: Callable[[int], str],
                  noise: KnobNoise) -> dict:
    frame = compare(baseline, variant)
    drift = float(np.nanmax(frame["max_abs_logprob_delta"].to_numpy(dtype=float), initial=0.0))
    drift = 0.0 if np.isnan(drift) else drift
    common = {"cases": len(baseline), "max_abs_logprob_delta": drift}
    diverged = frame[frame["verdict"] == "diverged"]
    if diverged.empty:
        if all(_bitwise_equal(a, b) for a, b in zip(baseline, variant, strict=True)):
            return {**common, "verdict": "identical",
                    "explanation": f"token ids, logprobs and top-k lists bitwise equal on {len(baseline)} case(s)"}
        return {**common, "verdict": "tokens_identical",
                "explanation": f"token ids equal on {len(baseline)} case(s); logprobs drift by up to {drift:.3g}"}
    row = diverged.sort_values("first_divergence").iloc[0]
    step = int(row["first_divergence"])
    case = next(r for r in baseline if r.case_id == row["case_id"])
    gap = _gap(case, step, int(row["engine_token"]))
    margin, drifts, source = noise.of(row["case_id"])
    tie, bound = BAND * margin, BAND * drifts
    near_tie = gap is not None and 0.0 <= gap <= tie and drift <= bound
    if gap is None:
        where = "the variant's token is not in the baseline's top-k there"
    elif gap < 0:
        where = f"the baseline ranks the variant's token {-gap:.3g} nats above the token it drew (a sampled draw)"
    else:
        where = f"the baseline ranks the variant's token {gap:.3g} nats below its own"
    if drift > bound and gap is not None and 0.0 <= gap <= tie:
        where += f", but the variant drifts by {drift:.3g} on the steps both shared (bound {bound:.3g})"
    band = f"twice the engine's own noise ({tie:.3g}: {source})"
    reason = f"a near-tie flip: {where}, within {band}" if near_tie else f"a real difference: {where}, beyond {band}"
    return {**common, "verdict": "diverged", "first_divergence": step, "case_id": row["case_id"], "near_tie": near_tie,
            "explanation": (f"{len(diverged)} of {len(baseline)} case(s) diverge; first {row['case_id']} at step "
                            f"{step}: baseline {_token(decode, row['ref_token'])}, variant "
                            f"{_token(decode, row['engine_token'])}: {reason}")}


def judge_samples(baseline: list[Result], variant: list[Result], steps: int, alpha: float) -> dict:
    """For knobs that change the random stream but must keep the distribution: a G-test per case on the first
    `steps` tokens of the samples, Bonferroni over cases. A case whose test is undetermined (every prefix too rare)
    decides nothing and is named; with no case decided the knob is undetermined."""
    failed = [r for r in (*baseline, *variant) if r.status != "ok" or not r.samples]
    if failed:
        return {"verdict": "engine_error", "case_id": failed[0].case_id, "cases": len(baseline),
                "explanation": f"{failed[0].case_id}: {failed[0].error or 'no samples'}"}
    threshold = alpha / len(baseline)
    tests = [(a.case_id, g_test(prefixes(a.samples, steps), prefixes(b.samples, steps)))
             for a, b in zip(baseline, variant, strict=True)]
    counts = f"{len(baseline[0].samples)} vs {len(variant[0].samples)} samples per case"
    undetermined = [(case, t) for case, t in tests if t["p"] is None]
    unsure = (f"; {len(undetermined)} case(s) undetermined, first {undetermined[0][0]}: "
              f"{described(undetermined[0][1])}: draw more samples or test fewer steps (invariance: samples, steps)"
              if undetermined else "")
    decided = [(case, t) for case, t in tests if t["p"] is not None]
    if not decided:
        return {"verdict": "distribution_undetermined", "cases": len(baseline), "case_id": undetermined[0][0],
                "explanation": f"G-test on the first {steps} token(s), {counts}{unsure}"
                               + _variant_warnings(baseline, variant)}
    worst_case, worst = min(decided, key=lambda t: t[1]["p"])
    verdict = "distribution_diverged" if worst["p"] < threshold else "distribution_match"
    return {"verdict": verdict, "cases": len(baseline), "case_id": worst_case,
            "explanation": (f"G-test on the first {steps} token(s), {counts}: smallest p={worst['p']:.3g} "
                            f"({worst_case}; threshold {threshold:.3g} = alpha {alpha:g} / {len(baseline)} cases)"
                            f"{unsure}" + _variant_warnings(baseline, variant))}


def _gap(baseline: Result, step: int, token: int) -> float | None:
    """How far below the token it chose the baseline ranked the token the variant chose at this step (None: not in
    its top-k). An exact tie is a gap of 0 whichever token the variant took; a negative gap means the baseline drew a
    lower-ranked token (sampling), which is never a near-tie flip."""
    if step >= len(baseline.top_ids) or token not in baseline.top_ids[step]:
        return None
    values = baseline.top_logprobs[step]
    return float(baseline.chosen_logprobs[step] - values[baseline.top_ids[step].index(token)])


def control_expected(verdict: str) -> bool:
    """A negative control passes only if it saw the difference it was built to cause."""
    return verdict in ("diverged", "distribution_diverged")


def _bitwise_equal(a: Result, b: Result) -> bool:
    return (a.token_ids == b.token_ids and a.chosen_logprobs == b.chosen_logprobs and a.top_ids == b.top_ids
            and a.top_logprobs == b.top_logprobs)


def _token(decode: Callable[[int], str], token) -> str:
    return "(end)" if token is None or int(token) < 0 else repr(decode(int(token)))
