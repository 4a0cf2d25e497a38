"""Beam search through an OpenAI-compatible server: the request (the dialect's beam fields; vLLM's server takes
`use_beam_search` with `n` as the beam width) and its answer, one choice per beam in rank order, into a Result whose
beams carry each token's logprob as the server reported it."""

from __future__ import annotations

import time
from typing import Any

from adapters.http.answers import to_result
from adapters.http.client import Completion, RequestFailed, parse_payload
from adapters.http.dialects import Dialect
from harness.core.types import Beam, Request, Result, Translation
from harness.core.vocabulary import GREEDY_IRRELEVANT, SamplingParams

NO_SCORE = ("no final beam scores: the {dialect} server returns none and this client does not compute them (the "
            "vllm-server engine, attached by url, computes vLLM's own): its beams are compared by tokens, rank and "
            "cumulative logprob")


def refusal(dialect: Dialect) -> str | None:
    """Why a server of this dialect cannot be asked for beam search (None: it can)."""
    if dialect.beam_fields:
        return None
    return (f"cannot search beams through the {dialect.name} dialect: the only server with a beam-search request is "
            "vLLM's (dialect: vllm)")


def translate(params: SamplingParams, dialect: Dialect, top_logprobs: int) -> Translation:
    """The beam-search request fields, and a NOT APPLIED warning for every param the server's search ignores."""
    body: dict[str, Any] = {field: getattr(params, name) for name, field in dialect.beam_fields.items()
                            if getattr(params, name) is not None}
    body.update(dialect.beam_request, logprobs=top_logprobs, **dialect.token_id_fields)
    warnings = []
    for name, value in params.set_fields().items():
        if name in dialect.beam_fields or name in GREEDY_IRRELEVANT or name == "do_sample" or \
                (name == "num_return_sequences" and value == params.num_beams):
            continue  # greedy-irrelevant params are warned about already (the search is greedy)
        note = dialect.beam_notes.get(name, "not used by it")
        if name == "num_return_sequences":
            note += f"; the comparison uses the best {value}"
        warnings.append(f"{name}={value} NOT APPLIED by the {dialect.name} server's beam search: {note}")
    return Translation(native_params=body, warnings=warnings)


def parse_choices(payload: dict[str, Any], endpoint: str, out: Completion) -> None:
    """Each choice into its own completion, in the order of its index (a beam search's rank)."""
    parse_payload({k: v for k, v in payload.items() if k != "choices"}, endpoint, out)
    for choice in sorted(payload.get("choices") or [], key=lambda c: c.get("index", 0)):
        one = Completion(prompt_token_ids=out.prompt_token_ids)
        parse_payload({"choices": [choice]}, endpoint, one)
        out.choices.append(one)


def complete(engine: Any, request: Request) -> Result:
    """One beam-search request; engine is an openai-style engine (client, dialect, token table, translate)."""
    if engine.endpoint != "completions":
        return Result.engine_error(request.case_id, engine.name, f"engine error: beam search is compared on the "
                                   f"completions endpoint, not {engine.endpoint}: set endpoint: completions")
    translation = engine.translate(request.params, request.top_logprobs)
    body = {**engine.client.body(request, translation.native_params, engine._prompt(request)), "stream": False}
    started = time.perf_counter()
    try:
        answer = engine.client.complete(body, parse_choices)
    except RequestFailed as exc:
        return Result.engine_error(request.case_id, engine.name, f"engine error: {exc}")
    ranked = [to_result(engine.name, request, translation, body, choice, engine.token_table, engine.client.url)
              for choice in answer.choices]
    failed = next((r for r in ranked if r.status != "ok"), None)
    if failed or not ranked:
        return failed or Result.engine_error(request.case_id, engine.name, "engine error: the server returned no "
                                             "beams")
    beams = [Beam(token_ids=r.token_ids, logprobs=list(r.chosen_logprobs), cum_logprob=sum(r.chosen_logprobs),
                  score=engine.beam_score(r.prompt_ids, r.token_ids, sum(r.chosen_logprobs), body),
                  finish_reason=r.finish_reason, text=r.text) for r in ranked]
    warnings = list(dict.fromkeys(w for r in ranked for w in r.warnings))
    if all(b.score is None for b in beams):
        warnings.append(NO_SCORE.format(dialect=engine.dialect.name))
    if engine.client.stream:
        warnings.append("stream: true not used: beam-search answers come whole (vLLM refuses to stream them)")
    return ranked[0].model_copy(update={  # per-step logprobs live in the beams (beams.parquet), as for every engine
        "beams": beams, "warnings": warnings, "chosen_logprobs": [], "top_ids": [], "top_logprobs": [],
        "timings": {"generate_s": time.perf_counter() - started, "attempts": float(answer.attempts)}})
