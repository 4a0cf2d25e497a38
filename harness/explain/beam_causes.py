"""Why two engines' beams differ: rules, numerics, or both.

Each engine's own beam-search loop was run on the same numbers, the reference model's logits (the oracle). Then:
  rules     the other engine's loop fed the reference's numbers reproduces that engine's real beams: its rules
            (scoring, which finished beams it keeps, when it stops) make the difference, not its numbers;
  numerics  both loops fed the same numbers return the same beams, and the engines' logprobs differ: the numbers
            make the difference;
  both      neither alone explains it.
The explanation names the step and the beams involved: where the loops' live beams first part (from the oracle's
query log), each beam one loop returns and the other does not, and whether the other loop had it as a candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from harness.compare.beam_rules import compare_beams, first_difference
from harness.core.types import Beam

Cause = Literal["none", "rules", "numerics", "both", "failed"]
Decode = Callable[[list[int]], str]


@dataclass
class LoopRun:
    """One engine's beam-search loop on the oracle: its beams (best first), the beams it kept alive at each step
    (generated tokens), and the oracle's logprob of each token of that engine's real beams."""

    beams: list[Beam]
    steps: list[list[list[int]]] = field(default_factory=list)
    real_logprobs: list[list[float]] = field(default_factory=list)


class BeamExplanation(BaseModel):
    case_id: str
    engine: str
    reference: str
    cause: Cause
    step: int | None = None
    verdict: str
    loops: dict[str, list[list[int]]] = {}  # engine -> token ids of its loop's beams on the oracle
    reproduces: dict[str, bool] = {}  # engine -> whether its loop on the oracle returned its real beams


def ranked(beams: list[Beam], n: int) -> list[tuple[int, ...]]:
    return [tuple(b.token_ids) for b in beams[:n]]


def first_live_difference(a: list[list[list[int]]], b: list[list[list[int]]]) -> int | None:
    """The first step at which two loops kept different beams alive; None if they never did."""
    for step in range(max(len(a), len(b))):
        left = {tuple(x) for x in (a[step] if step < len(a) else [])}
        right = {tuple(x) for x in (b[step] if step < len(b) else [])}
        if left != right and left and right:
            return step
    return None


def last_alive(prefixes: list[list[list[int]]], tokens: list[int]) -> int:
    """The longest prefix of `tokens` a loop kept alive (its length: the step it was alive at), -1 if none."""
    alive = -1
    for step in range(min(len(tokens), len(prefixes) - 1) + 1):
        if list(tokens[:step]) in prefixes[step]:
            alive = step
    return alive


def numbers_gap(real: list[Beam], oracle_logprobs: list[list[float]]) -> float | None:
    """The largest |delta| between an engine's own logprob of a token of its beams and the reference model's."""
    gaps = [abs(mine - ref) for beam, refs in zip(real, oracle_logprobs) for mine, ref in zip(beam.logprobs, refs)
            if mine is not None]
    return max(gaps) if gaps else None


def _beam(beam: Beam, decode: Decode, rank: int) -> str:
    text = decode(beam.token_ids)
    shown = text if len(text) <= 50 else "..." + text[-50:]
    score = "" if beam.score is None else f", score {beam.score:.4g}"
    end = "EOS" if beam.finish_reason == "stop" else beam.finish_reason or "end"
    return (f"#{rank} {shown!r} ({len(beam.token_ids)} tokens, ends by {end}, cum logprob "
            f"{beam.cum_logprob:.4g}{score})")


def _unique(owner: str, mine: LoopRun, other_name: str, other: LoopRun, n: int, decode: Decode) -> list[str]:
    """Each beam `owner`'s loop returns that the other loop does not, and what the other loop did with it."""
    theirs = set(ranked(other.beams, n))
    notes = []
    for rank, beam in enumerate(mine.beams[:n]):
        if tuple(beam.token_ids) in theirs:
            continue
        alive, length = last_alive(other.steps, beam.token_ids), len(beam.token_ids)
        fate = (f"which {other_name}'s loop kept alive and extended instead" if alive == length else
                f"which {other_name}'s loop had as a candidate (its first {alive} tokens alive at step {alive}) and "
                "did not return" if alive == length - 1 else
                f"whose prefix {other_name}'s loop dropped after step {alive}" if alive >= 0 else
                f"which {other_name}'s loop never had alive")
        notes.append(f"{owner}'s loop returns {_beam(beam, decode, rank)}, {fate}")
    return notes


def loops_differ(ref: str, engine: str, loop_ref: LoopRun, loop: LoopRun, n: int, decode: Decode) -> tuple[str, int]:
    """How two loops fed the same numbers part, and the step it starts."""
    live = first_live_difference(loop_ref.steps, loop.steps)
    notes = _unique(engine, loop, ref, loop_ref, n, decode) + _unique(ref, loop_ref, engine, loop, n, decode)
    if live is not None:
        head = f"the loops keep different beams alive from step {live}"
        step = live
    else:
        head = "the loops keep the same beams alive at every step and part over which finished beams they keep"
        ends = [len(b.token_ids) - 1 for b in loop.beams[:n] + loop_ref.beams[:n]
                if tuple(b.token_ids) not in set(ranked(loop_ref.beams, n)) & set(ranked(loop.beams, n))]
        step = min(ends, default=0)
    if not notes:  # the same beams, ranked differently
        scores = ", ".join(f"{decode(b.token_ids)[-30:]!r}: {ref} {b.score:.4g}, {engine} {o.score:.4g}"
                           for b in loop_ref.beams[:n] for o in loop.beams[:n]
                           if b.token_ids == o.token_ids and b.score is not None and o.score is not None)
        notes = [f"they return the same beams ranked differently by their scores ({scores})"]
    return f"{head}: " + "; ".join(notes), step


def implied_length(beam: Beam, length_penalty: float) -> float | None:
    """The length an engine divided a beam's cumulative logprob by, read back from its score:
    score = cum_logprob / length ** length_penalty."""
    if not length_penalty or beam.score is None or not beam.score or beam.cum_logprob / beam.score <= 0:
        return None
    return (beam.cum_logprob / beam.score) ** (1 / length_penalty)


def _same(n: int) -> str:
    return "the same best beam" if n == 1 else f"the same {n} beams in the same order"


def same_beams_scored_apart(ref: str, engine: str, real_ref: list[Beam], real: list[Beam], n: int, tolerance: float,
                            length_penalty: float, decode: Decode, settings: str) -> tuple[Cause, str]:
    """The engines return the same beams in the same order, and the run still judged them apart: their scores.
    Equal cumulative logprobs with different final scores are the scoring rule (the length each divides by)."""
    c = compare_beams(real_ref, real, n)
    if c.max_cum_delta > tolerance:
        a, b = max(c.shared, key=lambda pair: abs(pair[0].cum_logprob - pair[1].cum_logprob))
        return "numerics", (
            f"the engines return {_same(c.compared)}, and their cumulative logprobs differ "
            f"by up to {c.max_cum_delta:.4g} (beyond {tolerance:g}; e.g. {_beam(a, decode, real_ref.index(a))}: "
            f"{ref} {a.cum_logprob:.6g}, {engine} {b.cum_logprob:.6g}): the numbers make the difference")
    a, b = max(c.shared, key=lambda pair: abs((pair[0].score or 0) - (pair[1].score or 0)))
    lengths = [implied_length(x, length_penalty) for x in (a, b)]
    rule = (f": {ref} divides its cumulative logprob by {lengths[0]:.4g} ** {length_penalty:g}, {engine} by "
            f"{lengths[1]:.4g} ** {length_penalty:g} (for {len(a.token_ids)} generated tokens)"
            if None not in lengths else "")
    return "rules", (
        f"the engines return {_same(c.compared)} with the same cumulative logprobs (max "
        f"|delta| {c.max_cum_delta:.3g}) and score them apart by up to {c.max_score_delta:.4g} (beyond {tolerance:g}): "
        f"{decode(a.token_ids)[-40:]!r} scores {a.score:.6g} in {ref} and {b.score:.6g} in {engine}, both from "
        f"cumulative logprob {a.cum_logprob:.6g}{rule}: the length normalisation of the score makes the difference"
        f"{settings}")


def explain_case(case_id: str, ref: str, engine: str, real_ref: list[Beam], real: list[Beam], loop_ref: LoopRun,
                 loop: LoopRun, n: int, decode: Decode, *, tolerance: float, length_penalty: float,
                 rules: str = "") -> BeamExplanation:
    """The cause of a beam difference between the reference and one engine on one case, judged by the run's own rule
    (harness.compare.beam_rules: same beams, scores within `tolerance`). rules: how the engines' search settings
    differ, as their own code states them (effective params), cited when the rules part them."""
    loops = {ref: [list(t) for t in ranked(loop_ref.beams, n)], engine: [list(t) for t in ranked(loop.beams, n)]}
    reproduces = ranked(loop.beams, n) == ranked(real, n)
    ref_reproduces = ranked(loop_ref.beams, n) == ranked(real_ref, n)
    base = {"case_id": case_id, "engine": engine, "reference": ref, "loops": loops,
            "reproduces": {ref: ref_reproduces, engine: reproduces}}
    settings = f"; their search settings differ ({rules})" if rules else ""
    if compare_beams(real_ref, real, n).matches(tolerance):
        return BeamExplanation(**base, cause="none", verdict="the engines return the same beams, their scores within "
                               f"{tolerance:g}")
    if ranked(real_ref, n) == ranked(real, n):
        cause, verdict = same_beams_scored_apart(ref, engine, real_ref, real, n, tolerance, length_penalty, decode,
                                                 settings)
        return BeamExplanation(**base, cause=cause, verdict=verdict)
    loops_agree = ranked(loop_ref.beams, n) == ranked(loop.beams, n)
    gap = numbers_gap(real[:n], loop.real_logprobs)
    numbers = (f"{engine}'s own logprobs of its beams' tokens differ from the reference model's by up to "
               f"{gap:.3g}" if gap is not None else f"{engine} reports no per-token logprobs to compare")
    leaves = first_difference(list(real[0].token_ids), list(loop.beams[0].token_ids)) if loop.beams else -1
    drift = (f"its real best beam leaves the one its loop finds on the reference model's numbers at step {leaves} "
             f"({_beam(real[0], decode, 0)} vs {_beam(loop.beams[0], decode, 0)})" if leaves >= 0 else
             "its real best beam is the one its loop finds on the reference model's numbers")
    if loops_agree and not reproduces:
        return BeamExplanation(**base, cause="numerics", step=max(leaves, 0), verdict=(
            f"fed the same numbers (the reference model's), {ref}'s and {engine}'s own beam-search loops return the "
            f"same beams, so their rules do not part them here; {numbers}, and {drift}"))
    if reproduces:
        how, step = loops_differ(ref, engine, loop_ref, loop, n, decode)
        also = "" if ref_reproduces else (f"; {ref}'s own loop on those numbers does not reproduce {ref}'s real "
                                           "beams: its numbers differ from the reference model's too")
        return BeamExplanation(**base, cause="rules", step=step, verdict=(
            f"fed the same numbers (the reference model's), {engine}'s own beam-search loop reproduces {engine}'s "
            f"real beams and {ref}'s loop returns other beams: the search rules make the difference; {how}{also}"
            f"{settings}"))
    how, step = loops_differ(ref, engine, loop_ref, loop, n, decode)
    return BeamExplanation(**base, cause="both", step=min(step, max(leaves, 0)), verdict=(
        f"neither alone: fed the reference model's numbers, {engine}'s own loop does not reproduce its real beams "
        f"({numbers}; {drift}), and {ref}'s and {engine}'s loops on the same numbers disagree too: {how}{settings}"))
