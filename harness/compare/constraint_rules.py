"""Constrained output, judged metamorphically against the unconstrained reference (a scenario's constraint: block).

Per case and constrained engine:
  unchanged    the reference's own answer already satisfies the constraint, and the constrained engine gave the same
               tokens over its whole answer (a near-tie flip within the measured noise counts as the same)
  changed      the reference's answer satisfies the constraint, yet the constrained engine answered otherwise anywhere
               in its answer: the constraint masked a token it had no reason to (a constrained-decoding defect)
  steered      the reference's answer does not satisfy it; the constrained answer does, and the first step where the
               constraint masked the reference's choice is named
  invalid      the constrained answer does not satisfy the constraint
  not_applied  the engine cannot apply this constraint (its warning says why): nothing to judge
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from harness.compare.diff import apply_ties, compare
from harness.core.types import Result
from harness.core.vocabulary import Constraint

PASSING = {"unchanged", "steered", "not_applied"}
Ties = tuple[float, float, bool]  # a case's tie margin and drift bound (harness.compare.tie_noise.tie_bounds), and
# whether its layer check (if any) found no component out of its floor


def satisfies(constraint: Constraint, text: str) -> tuple[bool, str]:
    """Whether the text satisfies the constraint, and if not, why (one clause)."""
    if constraint.regex is not None:
        return (True, "") if re.fullmatch(constraint.regex, text) else (False, f"does not match the regex "
                                                                                f"{constraint.regex!r}")
    if constraint.choice is not None:
        return (True, "") if text in constraint.choice else (False, f"is none of the choices ({text!r})")
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as exc:
        return False, f"is not JSON ({exc.msg} at character {exc.pos})"
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(constraint.json_schema)(constraint.json_schema).iter_errors(value))
    if error is None:
        return True, ""
    where = "/".join(map(str, error.absolute_path)) or "the top level"
    return False, f"fails the schema at {where}: {error.message}"


def answer_length(constraint: Constraint, ids: list[int], decode: Callable[[list[int]], str]) -> int | None:
    """The fewest of the reference's tokens whose text satisfies the constraint (its answer, without what follows it:
    a stop string's token, an EOS, more records); None: no prefix does."""
    return next((n for n in range(1, len(ids) + 1) if satisfies(constraint, decode(ids[:n]))[0]), None)


def judge(constraint: Constraint, reference: Result, engine: Result, applied: bool,
          decode: Callable[[int], str], decode_ids: Callable[[list[int]], str], stopped_by: str = "",
          ties: Ties | None = None, ended: tuple[bool, bool] = (False, False)) -> dict:
    """The verdict fields of one constrained engine's answer to one case: the reference's answer is at least its
    shortest prefix that satisfies the constraint; the engine must give the reference's tokens over the whole of its
    own answer, as far as the reference's answer goes (a defect after the first satisfying tokens is a change too),
    the tokens that end each answer aside (ended: whether the reference's and the engine's last token is what ended
    it: an EOS, a stop token, a stop string's). stopped_by: the stop string that ended the engine's answer, if one
    did; ties: the tie margin and drift bound of the case (measured noise: harness.compare.tie_noise; None: only
    exact ties)."""
    length = answer_length(constraint, reference.token_ids, decode_ids)
    ref_ok, ref_why = (True, "") if length is not None else satisfies(constraint, reference.text)
    own_ok, own_why = satisfies(constraint, engine.text)
    fields = {"reference_satisfies": ref_ok, "engine_satisfies": own_ok, "masked_step": None}
    if not applied:
        return {**fields, "verdict": "not_applied",
                "explanation": "the engine does not apply this constraint (see its warning); nothing to judge"}
    if length is not None:
        answers = [len(r.token_ids) - int(bool(r.token_ids) and end) for r, end in zip((reference, engine), ended,
                                                                                       strict=True)]
        whole = max(length, min(answers))
        reference, engine = _first(reference, whole), _first(engine, whole)
    frame = compare([reference], [engine])
    margin, bound, checked = ties if ties is not None else (0.0, float("inf"), True)
    frame = apply_ties(frame, margin, bound, checked)
    row = frame.iloc[0]
    step = int(row["first_divergence"]) if row["verdict"] != "match" else None
    moved = "" if step is None else (f" from step {step}: the reference chose {_token(decode, row['ref_token'])}, "
                                     f"the engine {_token(decode, row['engine_token'])}")
    if ref_ok:
        if row["verdict"] in ("match", "benign_tie"):
            tie = (f" (a near-tie flip: the reference's top-2 margin {row['ref_top2_margin']:.3g} within the tie "
                   f"margin {margin:.3g} nats of the measured noise)") if row["verdict"] == "benign_tie" else ""
            return {**fields, "verdict": "unchanged",
                    "explanation": f"the reference's own answer satisfies the constraint and the constrained answer "
                                   f"is the same{tie}"}
        return {**fields, "verdict": "changed", "masked_step": step,
                "explanation": f"the reference's own answer satisfies the constraint, yet the constrained answer "
                               f"differs{moved}: the constraint masked a token it allows"
                               + ("" if own_ok else f"; and the constrained answer {own_why}")}
    if not own_ok:
        cut = " (cut by max_new_tokens: raise it)" if engine.finish_reason == "length" else \
            f" (cut by the stop string {stopped_by!r}, which the constraint allows inside the answer)" if stopped_by \
            else ""
        return {**fields, "verdict": "invalid", "masked_step": step,
                "explanation": f"the constrained answer {own_why}{cut}"}
    return {**fields, "verdict": "steered", "masked_step": step,
            "explanation": f"the reference's answer {ref_why}; the constrained answer satisfies it, the constraint "
                           f"first masked the reference's choice{moved}"}


def _first(result: Result, n: int) -> Result:
    """The result's first n generated tokens and their logprobs."""
    return result.model_copy(update={"token_ids": result.token_ids[:n], "chosen_logprobs": result.chosen_logprobs[:n],
                                     "top_ids": result.top_ids[:n], "top_logprobs": result.top_logprobs[:n]})


def _token(decode: Callable[[int], str], token) -> str:
    return repr(decode(int(token))) if token is not None and int(token) >= 0 else "(end)"
