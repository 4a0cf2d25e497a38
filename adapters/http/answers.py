"""A server's parsed answer -> a Result: token ids (the server's own, or mapped back from token text), top lists
with the chosen token merged in (some servers list it apart) and entries without an id dropped, and the checks that
make an answer unusable for token-level comparison an engine error, never a silent empty result."""

from __future__ import annotations

from typing import Any

from adapters.http.client import Completion
from adapters.http.token_ids import TokenResolver, TokenTable
from harness.core.prompt_notes import CHAT_TEMPLATE, TOKENIZER, prompt_ids_unknown
from harness.core.types import Request, Result, Translation

UNSHOWN = ("prompt", "messages", "input_ids", "tools")  # request fields not kept as the engine's native params


def to_result(name: str, request: Request, translation: Translation, body: dict[str, Any], completion: Completion,
              table: TokenTable, url: str, empty_token_id: int | None = None) -> Result:
    resolver = TokenResolver(table, empty_token_id)
    steps = completion.steps
    if not steps and (completion.text or completion.token_ids):
        return Result.engine_error(request.case_id, name, (
            f"engine error: {url} answered {len(completion.text)} characters of text but no per-token logprobs, "
            "so it cannot be compared token by token: use the server's endpoint that returns them (for lmdeploy "
            "its native /generate: endpoint: generate)"))
    chosen = [resolver.resolve(s.token) for s in steps]
    token_ids = completion.token_ids or chosen
    if len(steps) != len(token_ids):
        return Result.engine_error(request.case_id, name, (
            f"engine error: {url} returned {len(token_ids)} tokens but logprobs for {len(steps)} steps, so it cannot "
            "be compared token by token (not retried: the server answered)"))
    known = [t for t in token_ids if t is not None]
    if len(known) != len(token_ids):
        return Result.engine_error(request.case_id, name, (
            f"engine error: token text {sorted(resolver.unmapped)[:5]} maps to no id of the model's tokenizer: "
            "the server's tokenizer is not the model folder's"))
    top_ids: list[list[int]] = []
    top_logprobs: list[list[float]] = []
    for step in steps:
        ranked = dict(step.top)
        ranked.setdefault(step.token, step.logprob)  # servers that list the chosen token apart (lmdeploy chat)
        resolved = [(resolver.resolve(t), lp) for t, lp in sorted(ranked.items(), key=lambda kv: -kv[1])]
        pairs = [(t, lp) for t, lp in resolved if t is not None][: request.top_logprobs]  # no id: dropped, warned
        top_ids.append([t for t, _ in pairs])
        top_logprobs.append([lp for _, lp in pairs])
    warnings = list(translation.warnings) + resolver.warnings()
    if completion.prompt_token_ids is not None:
        prompt_ids = completion.prompt_token_ids
    else:
        prompt_ids = request.prompt_ids
        if "input_ids" not in body and ("prompt" not in body or isinstance(body["prompt"], str)):
            warnings.append(prompt_ids_unknown(CHAT_TEMPLATE if "messages" in body else TOKENIZER))
    return Result(case_id=request.case_id, engine=name, status="ok", prompt_ids=list(prompt_ids),
                  token_ids=known, text=completion.text, finish_reason=completion.finish_reason,
                  chosen_logprobs=[s.logprob for s in steps], top_ids=top_ids, top_logprobs=top_logprobs,
                  native_params={k: v for k, v in body.items() if k not in UNSHOWN},
                  warnings=warnings, usage=completion.usage, deltas=completion.deltas, message=completion.message())
