"""How a generation ended, read once per answer (harness.run.finish) and used by every verdict that needs it: the
token verdicts (an EOS an engine did not return), the text verdicts (finish reasons, stop strings) and results.parquet.

Engines report the end differently: HF and vLLM return the EOS token as the last generated id; lmdeploy's pipeline
and llama.cpp's server stop on EOS without returning it and only say finish_reason "stop"; a stop string also ends
with "stop". Without one reading of this, an engine that drops its EOS shows a false divergence at the last step.
Under ignore_eos an EOS is a token like any other: it ends nothing, wherever it falls.

Ending.how is one of:
  eos               the last token is an EOS id (and the request does not ignore EOS)
  eos_not_returned  finish_reason "stop", no stop string in the text, no EOS returned: the engine stopped on an EOS
                    it did not return (the comparison appends it, marked, so the step counts as equal)
  stop_token        the last token is one of the request's stop_token_ids
  stop_string       finish_reason "stop" and a requested stop string is in the text, or in the decoding of the ids
                    (an engine that cuts the stop string from its text, as vLLM does, still generated its tokens)
  length            max_new_tokens reached (or finish_reason "length")
  ""                unknown (an error, samples, or an engine that says nothing)
Ending.ids_end is what the ids alone say, "stop" or "length", whatever the engine said; a finish reason that says
otherwise, and tokens generated past a stop string the engine applied, are its findings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from harness.core.types import Result
from harness.core.vocabulary import SamplingParams

EOS, EOS_NOT_RETURNED, STOP_TOKEN, STOP_STRING, LENGTH = (
    "eos", "eos_not_returned", "stop_token", "stop_string", "length")
STOP_REASONS = ("stop", "eos", "end", "stop_token", "eos_token")
IMPLIED_EOS_WARNING = "EOS implied: the engine stopped on EOS without returning it (finish reason {reason!r})"

DecodeIds = Callable[[list[int], bool], str]  # ids, skip special tokens -> text in the reference's tokenizer


@dataclass(frozen=True)
class StopMatch:
    """Where a stop string first appears in the decoding of the generated ids."""

    stop: str
    char: int  # its first character in the decoded text
    step: int  # the generated token that completes it
    spans: bool  # it is split across more than one token


@dataclass(frozen=True)
class Ending:
    """How one answer ended."""

    how: str  # one of the module's readings
    ids_end: str  # "stop" or "length" ("" with `how`): what the ids alone say
    ids_why: str  # why the ids say so, in words
    stop: StopMatch | None  # the first requested stop string in the decoding of the ids
    skip_special: bool  # the text the answer is read in leaves special tokens out (the case's or engine's setting)
    findings: tuple[str, ...] = ()  # each a sentence: tokens past an applied stop string, a finish reason the ids deny

    @property
    def last_id_ends(self) -> bool:
        """The last generated id is what ended the generation (an EOS or a stop token id)."""
        return self.how in (EOS, STOP_TOKEN)


UNKNOWN = Ending("", "", "", None, True)


def skips_special(result: Result, params: SamplingParams) -> bool:
    """Whether the answer's text leaves special tokens out: the case's skip_special_tokens, else the engine's own
    (effective) setting, else yes (every engine's default)."""
    if params.skip_special_tokens is not None:
        return params.skip_special_tokens
    return (result.effective or {}).get("skip_special_tokens", True) is not False


def read_ending(result: Result, params: SamplingParams, eos_ids: set[int], decode_ids: DecodeIds | None) -> Ending:
    """How the generation ended; `decode_ids` (None: no tokenizer) finds a stop string an engine cut from its text,
    in the text as the answer is written (with or without special tokens)."""
    if result.status != "ok" or result.samples:
        return UNKNOWN
    ids, skip = result.token_ids, skips_special(result, params)
    stop = first_stop(ids, params.stop or [], lambda part: decode_ids(part, skip)) if decode_ids else None
    ids_end, ids_why = _ids_end(ids, params, eos_ids, stop)
    findings = []
    if stop is not None and result.applied("stop") and stop.step < len(ids) - 1:
        findings.append(f"generated {len(ids) - 1 - stop.step} tokens past the stop string {stop.stop!r} "
                        f"(complete at token {stop.step})")
    reason = (result.finish_reason or "").lower()
    said = "stop" if reason in STOP_REASONS else reason
    if said and said != ids_end:
        findings.append(f"finish reason {result.finish_reason!r} but the ids say {ids_end!r} ({ids_why})")
    how = _how(result, params, eos_ids, stop is not None or any(s in result.text for s in params.stop or []))
    return Ending(how, ids_end, ids_why, stop, skip, tuple(findings))


def _how(result: Result, params: SamplingParams, eos_ids: set[int], holds_stop: bool) -> str:
    ids = result.token_ids
    if ids and ids[-1] in eos_ids and not params.ignore_eos:
        return EOS
    if ids and ids[-1] in (params.stop_token_ids or []):
        return STOP_TOKEN
    reason = (result.finish_reason or "").lower()
    if reason in STOP_REASONS:
        if params.stop and holds_stop:
            return STOP_STRING
        if len(ids) < params.max_new_tokens and not params.ignore_eos:
            return EOS_NOT_RETURNED
    if reason == "length" or len(ids) >= params.max_new_tokens:
        return LENGTH
    return ""


def _ids_end(ids: list[int], params: SamplingParams, eos_ids: set[int], stop: StopMatch | None) -> tuple[str, str]:
    """"stop" when the last id ends this request's generation (an EOS only without ignore_eos, a stop token id), when
    it completes a requested stop string, or when fewer than max_new_tokens were generated; "length" otherwise."""
    ends = set(params.stop_token_ids or []) | (set() if params.ignore_eos else set(eos_ids))
    if ids and ids[-1] in ends:
        return "stop", f"the last token {ids[-1]} is a stop token"
    if stop is not None and stop.step == len(ids) - 1:
        return "stop", f"the last token completes the stop string {stop.stop!r}"
    if len(ids) < params.max_new_tokens:
        return "stop", f"{len(ids)} of {params.max_new_tokens} tokens, no stop token or stop string at the end"
    eos = " (ignore_eos: an EOS ends nothing)" if params.ignore_eos else ""
    return "length", f"{len(ids)} tokens, max_new_tokens reached{eos}"


def first_stop(ids: list[int], stops: list[str], decode: Callable[[list[int]], str]) -> StopMatch | None:
    """The earliest stop string in the decoded ids, the token that completes it and whether it spans tokens."""
    if not stops or not ids:
        return None
    text = decode(ids)
    found = [(text.find(s), s) for s in stops if s and s in text]
    if not found:
        return None
    char, stop = min(found)
    step = _first_prefix(ids, lambda text: text.startswith(stop, char), decode)
    started = _first_prefix(ids, lambda text: text.startswith(stop[0], char), decode)
    return StopMatch(stop, char, step, spans=started != step)


def _first_prefix(ids: list[int], holds: Callable[[str], bool], decode: Callable[[list[int]], str]) -> int:
    """The first token whose prefix's text holds (a bisection: once the text there holds, the longer ones do)."""
    low, high = 0, len(ids) - 1
    while low < high:
        middle = (low + high) // 2
        if holds(decode(ids[: middle + 1])):
            high = middle
        else:
            low = middle + 1
    return low


def as_compared(result: Result, how: str, eos_id: int | None) -> Result:
    """The result as the diff should see it: with the EOS an engine did not return appended (no logprob, no top-k),
    so that it compares equal to an engine that returned it; unchanged otherwise."""
    if how != EOS_NOT_RETURNED or eos_id is None:
        return result
    steps = len(result.token_ids) + 1
    return result.model_copy(update={
        "token_ids": [*result.token_ids, eos_id],
        "chosen_logprobs": _padded(result.chosen_logprobs, steps, math.nan),
        "top_ids": _padded(result.top_ids, steps, []), "top_logprobs": _padded(result.top_logprobs, steps, []),
        "warnings": [*result.warnings, IMPLIED_EOS_WARNING.format(reason=result.finish_reason)]})


def _padded(values: list, length: int, fill) -> list:
    return [*values[:length], *[fill] * (length - len(values))]
