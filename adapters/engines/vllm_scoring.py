"""Teacher forcing through vLLM's prompt logprobs: the whole sequence sent as the prompt (token ids, one token
generated and dropped) with prompt_logprobs, whose entry at position p+1 is the distribution position p predicted the
next token from. The scoring path of the vLLM server, as echo is llama.cpp's server's.

Prompt logprobs follow the server's logprobs_mode as generated ones do (vLLM 0.32, measured: raw_logits returns
logits for prompt tokens too), except that no sampler touches a prompt token, so raw and processed are the same
numbers. A server started in a *_logits mode returns no logprobs to score with: refused with the reason."""

from __future__ import annotations

import dataclasses
from typing import Any

from adapters.http.client import Client, Completion, RequestFailed
from harness.core.types import Result, TraceRequest

SCORE_TOP_K = 5


def logits_refusal(mode: str) -> str:
    """Why a server in this logprobs_mode cannot score ('' where it can)."""
    if not mode.endswith("_logits"):
        return ""
    return (f"engine error: the server runs logprobs_mode {mode}, so its prompt logprobs are logits too (vLLM 0.32 "
            "applies the mode to prompt tokens): no teacher-forced logprobs to compare")


def score(client: Client, model: str, engine: str, request: TraceRequest, mode: str) -> Result:
    refusal = logits_refusal(mode)
    if refusal:
        return Result.engine_error(request.case_id, engine, refusal)
    tokens = request.token_ids
    body = {"model": model, "prompt": list(tokens), "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": SCORE_TOP_K, "stream": False}
    rows: list[Any] = []

    def keep(payload: dict[str, Any], _endpoint: str, _out: Completion) -> None:
        rows.extend(payload["choices"][0].get("prompt_logprobs") or [])

    try:
        dataclasses.replace(client, endpoint="completions").complete(body, keep)
    except RequestFailed as exc:
        return Result.engine_error(request.case_id, engine, f"engine error: {exc}")
    if len(rows) != len(tokens):
        return Result.engine_error(request.case_id, engine, (
            f"engine error: the server returned prompt logprobs for {len(rows)} of the sequence's {len(tokens)} "
            "positions"))
    positions = range(request.prompt_len - 1, len(tokens) - 1)
    entries = [{int(t): v for t, v in (rows[p + 1] or {}).items()} for p in positions]
    ranked = [sorted(((t, v["logprob"]) for t, v in entry.items() if v.get("rank") and v["rank"] <= SCORE_TOP_K),
                     key=lambda kv: -kv[1]) for entry in entries]
    return Result(case_id=request.case_id, engine=engine, status="ok", prompt_ids=tokens[: request.prompt_len],
                  token_ids=tokens[request.prompt_len:], finish_reason="forced",
                  chosen_logprobs=[entry.get(tokens[p + 1], {}).get("logprob", float("nan"))
                                   for p, entry in zip(positions, entries, strict=True)],
                  top_ids=[[t for t, _ in r] for r in ranked], top_logprobs=[[lp for _, lp in r] for r in ranked],
                  native_params={k: v for k, v in body.items() if k != "prompt"},
                  warnings=[f"teacher-forced top-k logprobs from the server's prompt logprobs (logprobs_mode {mode})"])
