"""How a generation ended, read the same way for every engine.

Engines report the end differently: HF and vLLM return the EOS token as the last generated id; lmdeploy's pipeline
and llama.cpp's server stop on EOS without returning it and only say finish_reason "stop"; a stop string also ends
with "stop". Without one reading of this, an engine that drops its EOS shows a false divergence at the last step.

ended_by is one of:
  eos               the last token is an EOS id
  eos_not_returned  finish_reason "stop", no stop string in the text, no EOS returned: the engine stopped on an EOS
                    it did not return (the comparison appends it, marked, so the step counts as equal)
  stop_token        the last token is one of the request's stop_token_ids
  stop_string       finish_reason "stop" and a requested stop string is in the text, or in the decoding of the ids
                    (an engine that cuts the stop string from its text, as vLLM does, still generated its tokens)
  length            max_new_tokens reached (or finish_reason "length")
  ""                unknown (an error, or an engine that says nothing)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from harness.core.types import Result
from harness.core.vocabulary import SamplingParams

STOP_REASONS = ("stop", "eos", "end", "stop_token", "eos_token")
IMPLIED_EOS_WARNING = "EOS implied: the engine stopped on EOS without returning it (finish reason {reason!r})"


def ended_by(result: Result, params: SamplingParams, eos_ids: set[int],
             decode: Callable[[list[int]], str] | None = None) -> str:
    """How the generation ended; `decode` (ids -> text in the reference's tokenizer) finds a stop string an engine
    cut from its text."""
    if result.status != "ok" or result.samples:
        return ""
    ids = result.token_ids
    if ids and ids[-1] in eos_ids and not params.ignore_eos:
        return "eos"
    if ids and ids[-1] in (params.stop_token_ids or []):
        return "stop_token"
    reason = (result.finish_reason or "").lower()
    if reason in STOP_REASONS:
        if params.stop and _holds_stop(result, params.stop, decode):
            return "stop_string"
        if len(ids) < params.max_new_tokens and not params.ignore_eos:
            return "eos_not_returned"
    if reason == "length" or len(ids) >= params.max_new_tokens:
        return "length"
    return ""


def _holds_stop(result: Result, stops: list[str], decode: Callable[[list[int]], str] | None) -> bool:
    if any(stop in result.text for stop in stops):
        return True
    return decode is not None and any(stop in decode(result.token_ids) for stop in stops)


def as_compared(result: Result, how: str, eos_id: int | None) -> Result:
    """The result as the diff should see it: with the EOS an engine did not return appended (no logprob, no top-k),
    so that it compares equal to an engine that returned it; unchanged otherwise."""
    if how != "eos_not_returned" or eos_id is None:
        return result
    steps = len(result.token_ids) + 1
    return result.model_copy(update={
        "token_ids": [*result.token_ids, eos_id],
        "chosen_logprobs": _padded(result.chosen_logprobs, steps, math.nan),
        "top_ids": _padded(result.top_ids, steps, []), "top_logprobs": _padded(result.top_logprobs, steps, []),
        "warnings": [*result.warnings, IMPLIED_EOS_WARNING.format(reason=result.finish_reason)]})


def _padded(values: list, length: int, fill) -> list:
    return [*values[:length], *[fill] * (length - len(values))]
