"""Turn engine results into a verdict table: diff vs the reference, expectation check, and plain-words reasons."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from harness.compare.diff import apply_ties, compare, error_rows
from harness.compare.ending import UNKNOWN, Ending
from harness.compare.logprob_kinds import kinds_apart
from harness.compare.own_top1 import OffTop1, off_top1
from harness.compare.tie_noise import TieEvidence, margin_words, tie_bounds
from harness.core.prompt_notes import made_by
from harness.core.types import Effective, Result
from harness.core.vocabulary import NEUTRAL, PENALTIES, SamplingParams
from harness.scenario.spec import LoadedScenario
from harness.semantics.effective import describe_differences, differing_fields
from harness.semantics.meaning import explain_differences, param_differences

Decode = Callable[[int], str]
VerdictName = Literal["match", "benign_tie", "diverged", "hazard", "engine_error"]


class Verdict(BaseModel):
    """One row of verdicts.parquet: one case, one engine, against the reference."""

    model_config = ConfigDict(extra="forbid")

    case_id: str
    engine: str
    reference: str
    verdict: VerdictName
    expected: bool
    first_divergence: int | None = None  # -1: no divergence
    ref_len: int | None = None
    engine_len: int | None = None
    max_abs_logprob_delta: float | None = None
    mean_abs_logprob_delta: float | None = None
    ref_token: int | None = None
    engine_token: int | None = None
    ref_top2_margin: float | None = None
    engine_token_in_ref_topk: bool | None = None
    ref_token_in_engine_topk: bool | None = None
    # beam-search cases (harness.compare.beam_rules): first_divergence is the best beams', max_abs_logprob_delta the
    # largest cumulative-logprob |delta| of the beams both returned
    best_beam_identical: bool | None = None
    beam_set_identical: bool | None = None
    beam_scores_within: bool | None = None
    max_beam_score_delta: float | None = None
    beams_compared: int | None = None
    explanation: str = ""


COLUMNS = list(Verdict.model_fields)
# verdicts.parquet's columns and the kind of value each holds (harness.rundir.tables.read_parquet checks them); the
# optional numbers are stored as floats, NaN where unset
VERDICT_TYPES = {"case_id": "str", "engine": "str", "reference": "str", "verdict": "str", "expected": "bool",
                 **{name: "float?" for name in COLUMNS[5:13]}, "engine_token_in_ref_topk": "bool?",
                 "ref_token_in_engine_topk": "bool?", "explanation": "str"}


def _result_or_missing(results: dict[tuple[str, str], Result], engine: str, case_id: str) -> Result:
    return results.get((engine, case_id)) or Result.engine_error(case_id, engine, "not run: the run was interrupted")


def judge(scenario: LoadedScenario, results: dict[tuple[str, str], Result], decode: Decode,
          ties: TieEvidence | None = None, endings: dict[tuple[str, str], Ending] | None = None) -> pd.DataFrame:
    """Every engine against the reference, case by case. ties: the measured noise and layer checks near-ties are
    read with (harness.run.tie_checks; None: none measured, so only exact ties are near-ties); endings: how each
    answer ended (harness.compare.ending), whose findings lead a divergence where one side stopped."""
    ties = ties or TieEvidence()
    spec, ref_name = scenario.spec, scenario.spec.reference
    off = {key: off_top1(r, _temperature(r, scenario.cases, key)) for key, r in results.items() if r.status == "ok"}
    frames = []
    for engine in spec.engines:
        if engine == ref_name:
            continue
        refs = [_result_or_missing(results, ref_name, c.case_id) for c in scenario.cases]
        others = [_result_or_missing(results, engine, c.case_id) for c in scenario.cases]
        ok = np.array([r.status == "ok" and o.status == "ok" for r, o in zip(refs, others, strict=False)], dtype=bool)
        expectation = spec.engine_expectation(engine)
        parts = []
        if ok.any():
            pick = np.flatnonzero(ok)
            compared = compare([refs[i] for i in pick], [others[i] for i in pick])
            margins, bounds = tie_bounds(compared["case_id"], ties, expectation.tie_margin,
                                         expectation.max_logprob_delta)
            checks = [ties.layers.get((engine, case)) for case in compared["case_id"]]
            parts.append(apply_ties(compared, margins, bounds, np.array([c is None or c.clean for c in checks])))
        if (~ok).any():
            pick = np.flatnonzero(~ok)
            parts.append(error_rows([refs[i] for i in pick], [others[i] for i in pick]))
        frame = pd.concat(parts, ignore_index=True).set_index("case_id").loc[[c.case_id for c in scenario.cases]]
        frame = frame.reset_index()
        frame["reference"] = ref_name
        hazards = [_hazard(refs[i], others[i], off, case, decode)
                   for i, case in enumerate(scenario.cases)]
        frame.loc[[bool(h) for h in hazards], "verdict"] = "hazard"
        meanings = [scenario.description(n).logprob_meaning(spec.engines[n].options) for n in (ref_name, engine)]
        processed_side = engine if meanings[1].processed else ref_name  # whose sampler made its logprobs
        apart = [kinds_apart(ref_name, meanings[0], engine, meanings[1], case.engine_params[processed_side])
                 for case in scenario.cases]
        frame["expected"] = _expected(frame, expectation, np.array([bool(a) for a in apart]))
        frame["explanation"] = [
            "; ".join(filter(None, [apart[i], hazard or _explain(
                row, refs[i], others[i], case.engine_params[ref_name], case.engine_params[engine], decode, off,
                TieReading(ties, expectation.tie_margin), endings or {})]))
            for i, (case, row, hazard) in enumerate(zip(scenario.cases, frame.itertuples(), hazards, strict=True))]
        frames.append(frame)
    if not frames:  # only the reference ran (parity transplant): nothing to compare
        return pd.DataFrame(columns=COLUMNS)
    table = pd.concat(frames, ignore_index=True)
    return table.reindex(columns=COLUMNS)


def _expected(frame: pd.DataFrame, expectation, kinds_apart: np.ndarray) -> pd.Series:
    """kinds_apart: the cases whose two logprobs are not the same quantity (harness.compare.logprob_kinds): their
    difference is no drift and is not held to max_logprob_delta."""
    allowed = {"exact": {"match"}, "benign_ties": {"match", "benign_tie"},
               "any": {"match", "benign_tie", "diverged"}}[expectation.tokens]  # a hazard is never expected
    ok = frame["verdict"].isin(allowed)
    if expectation.max_logprob_delta is not None and "max_abs_logprob_delta" in frame:
        frame = frame.assign(max_abs_logprob_delta=frame["max_abs_logprob_delta"].where(~kinds_apart, 0.0))
        delta = frame["max_abs_logprob_delta"]
        # apart with no drift measured (the reference's token not even in the engine's top-k at a first-step
        # divergence): the bound cannot hold, and does not pass unread
        unread = delta.isna() & frame["verdict"].isin(("diverged", "benign_tie"))
        ok &= ~(delta > expectation.max_logprob_delta) & ~unread
    return ok


def effective_note(ref: Result, other: Result, already_given: set[str]) -> str:
    """The effective params (each engine's own code) that differ between the two engines beyond the params they
    were given differently, if both are known: generation_config.json defaults, clamps, greedy rewrites."""
    if not ref.effective.get("decoding") or not other.effective.get("decoding"):
        return ""
    by_engine = {ref.engine: Effective.model_validate(ref.effective),
                 other.engine: Effective.model_validate(other.effective)}
    differences = describe_differences(by_engine, [f for f in differing_fields(by_engine) if f not in already_given])
    return f"the engines' own code applies different effective params ({differences})" if differences else ""


def _token(decode: Decode, token: int) -> str:
    return "(end)" if token < 0 else repr(decode(int(token)))


@dataclass(frozen=True)
class TieReading:
    """What a row's near-tie reading rests on, for its sentence: the evidence and the scenario's own tie margin."""

    evidence: TieEvidence
    scenario_margin: float | None

    def benign(self, row) -> str:
        check = self.evidence.layers.get((row.engine, row.case_id))
        tied = "" if row.engine_token_ref_rank <= 1 else \
            f" ({row.engine}'s token, the reference's #{row.engine_token_ref_rank + 1}, ties with its runner-up)"
        return (f"diverged at step {row.first_divergence} on a near-tie: reference top-2 margin "
                f"{row.ref_top2_margin:.3g} <= tie margin {row.tie_margin:.3g} nats ({self._source(row)}){tied}; "
                + (f"{check.words()}; " if check else "") + "each side's token is in the other's top-k")

    def not_benign(self, row, other_causes: bool = False) -> str:
        """Why a divergence the engine made by taking the reference's runner-up is not a near-tie ('' for any other
        divergence, and for one whose margin is simply beyond the tie margin where other causes are named: the
        sentence would only crowd them)."""
        if not getattr(row, "tie_candidate", False):
            return ""
        if other_causes and not row.ref_top2_margin <= row.tie_margin:
            return ""
        check = self.evidence.layers.get((row.engine, row.case_id))
        if check is not None and not check.clean:
            return check.words()
        if row.max_abs_logprob_delta > row.drift_bound:
            return (f"not a near-tie: the engines' chosen-token logprobs drift apart by {row.max_abs_logprob_delta:.3g}"
                    f" nats on the steps they share, beyond {row.drift_bound:.3g} ({self._source(row, drift=True)}): "
                    "another computation, not rounding")
        return (f"not a near-tie: the margin is beyond the tie margin {row.tie_margin:.3g} nats "
                f"({self._source(row)})")

    def _source(self, row, drift: bool = False) -> str:
        return margin_words(row.case_id, self.evidence, self.scenario_margin, drift)


def _explain(row, ref: Result, other: Result, ref_params, other_params, decode: Decode,
             off: dict[tuple[str, str], list[OffTop1]], ties: TieReading,
             endings: dict[tuple[str, str], Ending]) -> str:
    if row.verdict == "engine_error":
        failed = [r for r in (ref, other) if r.status != "ok"]
        return "; ".join(f"{r.engine}: {r.error}" for r in failed)
    if not row.prompt_ids_equal:
        return prompt_difference(ref, other, decode)
    notes = [f"{r.engine}: {w}" for r in (ref, other) for w in r.warnings if "NOT APPLIED" in w]
    if row.verdict == "match":
        text = f"identical {row.ref_len} tokens"
    elif row.verdict == "benign_tie":
        text = ties.benign(row)
    else:
        head = _divergence(row, other.engine, decode)
        given = param_differences(ref_params, other_params)
        ended = _ending_findings(row, (other, ref), endings)
        if ended:  # one side stopped where the other went on, and the text family says why: that leads, with only
            # the params that decide where an answer ends
            stops = {k: v for k, v in given.items() if k in ENDING_PARAMS}
            return "; ".join([*ended, head, *filter(None, [explain_differences(stops)]), *notes])
        picked = _picked_after_logits(row.first_divergence, [ref, other], off, decode)
        others = [c for c in (explain_differences(given), effective_note(ref, other, set(given)), picked) if c]
        causes = [c for c in (ties.not_benign(row, bool(others)), *others) if c]
        text = "; ".join([head, *_with_prompt_reading(row.first_divergence, other, causes, bool(picked))])
    return "; ".join([text] + notes)


ENDING_PARAMS = ("stop", "stop_token_ids", "ignore_eos", "max_new_tokens", "min_new_tokens",
                 "include_stop_str_in_output")


def _ending_findings(row, results: tuple[Result, Result], endings: dict[tuple[str, str], Ending]) -> list[str]:
    """Where one side ended at the divergence: what the text family found of how each answer ended (tokens past a
    stop string, a finish reason its ids deny), the engine's first."""
    if row.ref_token >= 0 and row.engine_token >= 0:
        return []
    return [f"{r.engine}: {finding}" for r in results
            for finding in endings.get((r.engine, r.case_id), UNKNOWN).findings]


def _divergence(row, engine: str, decode: Decode) -> str:
    """Where the two answers part, in words: the side that ended there, or both tokens with the reference's top-2
    margin where it reported one."""
    at = f"diverged at step {row.first_divergence}"
    if row.ref_token < 0:
        return f"{at}: the reference ended there, {engine} went on with {_token(decode, row.engine_token)}"
    margin = "no top-k there" if np.isnan(row.ref_top2_margin) else f"top-2 margin {row.ref_top2_margin:.3g}"
    if row.engine_token < 0:
        return f"{at}: {engine} ended there, the reference went on with {_token(decode, row.ref_token)} ({margin})"
    return (f"{at}: reference chose {_token(decode, row.ref_token)} ({margin}), {engine} chose "
            f"{_token(decode, row.engine_token)} ({'in' if row.engine_token_in_ref_topk else 'not in'} the "
            "reference's top-k)")


def _with_prompt_reading(step: int, other: Result, causes: list[str], after_logits: bool) -> list[str]:
    """The causes of a divergence, led by the prompt where it is the likely one: at the first step, on a prompt the
    engine tokenised itself without returning the ids, unless the token was chosen after the logits (then the
    prompt comes last, as a possibility). Names only what made the ids (a chat template only for chat messages)."""
    maker = made_by(other.warnings) if step == 0 else None
    if maker is None:
        return causes
    if after_logits:
        return [*causes, f"the prompt may differ too: {other.engine} tokenised it itself ({maker}) without returning "
                         "the ids"]
    reading = (f"most likely a prompt difference, not numerics: {other.engine} tokenised this prompt itself "
               f"({maker}) without returning the ids, and the engines part at its first step")
    return [reading, *(f"also: {c}" for c in causes)]


def prompt_difference(ref: Result, other: Result, decode: Decode) -> str:
    """Where two engines' prompt ids part, in words: the cause is the prompt, not numerics or sampling params."""
    first = next((i for i, (a, b) in enumerate(zip(ref.prompt_ids, other.prompt_ids, strict=False)) if a != b),
                 min(len(ref.prompt_ids), len(other.prompt_ids)))
    at = lambda ids: _token(decode, ids[first]) if first < len(ids) else "the end"  # noqa: E731
    return (f"prompt token ids differ between engines: {ref.engine} {len(ref.prompt_ids)} ids, {other.engine} "
            f"{len(other.prompt_ids)}, first apart at position {first} ({at(ref.prompt_ids)} vs "
            f"{at(other.prompt_ids)}): a tokenisation or chat-template difference (an engine's own template or BOS "
            "rule), not numerics or sampling params")


def _temperature(result: Result, cases, key: tuple[str, str]) -> float | None:
    """The temperature the engine sampled at (None: greedy): its effective params where known, else its
    canonical params."""
    params = next(c.engine_params[key[0]] for c in cases if c.case_id == key[1])
    decoding = result.effective.get("decoding")
    if decoding == "greedy" or (not decoding and params.greedy):
        return None
    return result.effective.get("temperature") or params.temperature or 1.0


def _penalised(result: Result, params: SamplingParams) -> bool:
    """Whether a penalty changes the logits after the reported raw logprobs (canonical or effective params)."""
    return any(value not in (None, NEUTRAL[n]) for n in PENALTIES
               for value in (getattr(params, n), result.effective.get(n)))


def _hazard(ref: Result, other: Result, off: dict[tuple[str, str], list[OffTop1]], case, decode: Decode) -> str:
    """`hazard: silent wrong token` when either engine, sampling without penalties, emitted a token its own
    distribution after temperature all but excluded (harness.compare.own_top1). '' when none did."""
    for result in (other, ref):
        if result.status != "ok" or _penalised(result, case.engine_params[result.engine]):
            continue
        temperature = _temperature(result, [case], (result.engine, case.case_id))
        found = [f for f in off.get((result.engine, case.case_id), []) if f.certain and temperature is not None]
        if found:
            f = found[0]
            return (f"hazard: silent wrong token: at step {f.step} {result.engine}'s own raw logprobs put "
                    f"{decode(f.top1)!r} first, with probability {f.top_probability:.9g} after temperature "
                    f"{temperature:g}, yet it emitted {decode(f.emitted)!r} ({f.margin:.3g} nats below); a sampler "
                    "does not pick such a token unless its logits or its kernel broke (inf/NaN after dividing "
                    "low-precision logits by a small temperature: `parity transplant` shows where); this fails "
                    "the case whatever the scenario expects of its tokens")
    return ""


def _picked_after_logits(step: int, results: list[Result], off: dict[tuple[str, str], list[OffTop1]],
                         decode: Decode) -> str:
    """At the divergent step, an engine that emitted another token than its own raw top-1 chose it after the
    logits: penalties or sampler semantics, not numerics."""
    notes = []
    for result in results:
        found = [f for f in off.get((result.engine, result.case_id), []) if f.step == step]
        if found:
            f = found[0]
            notes.append(f"{result.engine} emitted {decode(f.emitted)!r} although its own raw logits rank "
                         f"{decode(f.top1)!r} first ({f.margin:.3g} nats higher)")
    if not notes:
        return ""
    return ("; ".join(notes) + ": the token was chosen after the logits, so this is sampler or penalty semantics, "
            "not numerics")
