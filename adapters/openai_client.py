"""HTTP side of OpenAI-compatible engines: request bodies per dialect, retries, and both response shapes.

Completions responses carry `logprobs.tokens / token_logprobs / top_logprobs`; chat responses carry
`logprobs.content[]` with `top_logprobs` lists. Both, streamed or not, are normalised into Steps.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from adapters.dialects import OPENAI_FIELDS, Dialect
from harness.types import Request, SamplingParams, Translation


class RequestFailed(Exception):
    """A request that will not succeed by retrying (4xx, timeout, server gone, retries exhausted)."""


@dataclass
class Step:
    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class Completion:
    steps: list[Step] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


def translate(params: SamplingParams, dialect: Dialect, top_logprobs: int, endpoint: str,
              defaults: str = "canonical") -> Translation:
    """Canonical params -> request fields this server accepts; a warning for every param it won't honour.
    defaults "engine": params the scenario left unset are not sent, so the server's own defaults apply."""
    warnings: list[str] = []
    body: dict[str, Any] = {"max_tokens": params.max_new_tokens}
    decided = params.temperature is not None or params.do_sample is not None
    if defaults == "canonical" or decided:
        body["temperature"] = 0.0 if params.greedy else (params.temperature or 1.0)
    else:
        warnings.append(f"temperature and do_sample unset: the {dialect.name} server's defaults decide "
                        f"({dialect.defaults.get('temperature', 'its own')})")
    neutral = {"top_p": 1.0, "top_k": 0 if dialect.name != "llamacpp" else -1, "min_p": 0.0,
               "repetition_penalty": 1.0}
    for name, value in params.set_fields().items():
        if name in ("max_new_tokens", "temperature", "do_sample"):
            continue
        if name == "ignore_eos" and not value:
            continue
        how = dialect.handling(name)
        if how == "ignores":
            warnings.append(f"{name}={value} NOT APPLIED: the {dialect.name} server accepts and ignores it")
        elif how == "rejects":
            warnings.append(f"{name}={value} NOT APPLIED: the {dialect.name} server has no such field")
        else:
            body[OPENAI_FIELDS.get(name) or dialect.extra_fields[name]] = value
    if defaults == "canonical" and not params.greedy:  # unset truncation means none, explicitly
        for name, value in neutral.items():
            sent = OPENAI_FIELDS.get(name) or dialect.extra_fields.get(name)
            if getattr(params, name) is None and sent and sent not in body:
                body[sent] = value
            elif getattr(params, name) is None and name in dialect.defaults:
                warnings.append(f"{name} unset: the {dialect.name} server's default applies ({dialect.defaults[name]})")
    if endpoint == "chat":
        body.update(logprobs=True, top_logprobs=top_logprobs)
    else:
        body["logprobs"] = top_logprobs
    body.update(dialect.token_id_fields)
    return Translation(body, warnings)


def _parse_completions_choice(choice: dict[str, Any], out: Completion) -> None:
    out.text += choice.get("text") or ""
    logprobs = choice.get("logprobs") or {}
    tops = logprobs.get("top_logprobs") or [None] * len(logprobs.get("tokens") or [])
    for token, lp, top in zip(logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [], tops):
        out.steps.append(Step(token, lp, sorted((top or {}).items(), key=lambda kv: -kv[1])))


def _parse_chat_choice(choice: dict[str, Any], out: Completion) -> None:
    message = choice.get("message") or choice.get("delta") or {}
    out.text += message.get("content") or ""
    for entry in (choice.get("logprobs") or {}).get("content") or []:
        top = [(t["token"], t["logprob"]) for t in entry.get("top_logprobs") or []]
        out.steps.append(Step(entry["token"], entry["logprob"], top))


def parse_payload(payload: dict[str, Any], endpoint: str, out: Completion) -> None:
    """Fold one response (or one streamed chunk) into `out`."""
    if payload.get("error"):
        raise RequestFailed(f"server error: {payload['error']}")
    for choice in payload.get("choices") or []:
        (_parse_chat_choice if endpoint == "chat" else _parse_completions_choice)(choice, out)
        out.finish_reason = choice.get("finish_reason") or out.finish_reason
        if choice.get("token_ids") is not None:
            out.token_ids = (out.token_ids or []) + list(choice["token_ids"])
        if choice.get("prompt_token_ids") is not None:
            out.prompt_token_ids = list(choice["prompt_token_ids"])
    if payload.get("prompt_token_ids") is not None:
        out.prompt_token_ids = list(payload["prompt_token_ids"])


@dataclass
class Client:
    base_url: str  # ends with /v1
    model: str
    endpoint: str  # "completions" | "chat"
    stream: bool
    timeout: float
    retries: int
    headers: dict[str, str]
    server_alive: Callable[[], str | None] = lambda: None  # None, or why the server is gone

    def body(self, request: Request, sampling: dict[str, Any], prompt: list[int] | str) -> dict[str, Any]:
        """The request body. Chat sends the messages (a text prompt becomes one user message: the server then
        applies its chat template); completions sends `prompt` (token ids, or text for servers that need it)."""
        body = {"model": self.model, **sampling, "stream": self.stream}
        if self.endpoint == "chat":
            body["messages"] = request.messages or [{"role": "user", "content": request.text or ""}]
        else:
            body["prompt"] = prompt
        return body

    def complete(self, body: dict[str, Any]) -> Completion:
        url = f"{self.base_url}/{'chat/completions' if self.endpoint == 'chat' else 'completions'}"
        last = ""
        for attempt in range(self.retries + 1):
            gone = self.server_alive()
            if gone:
                raise RequestFailed(gone)
            try:
                return self._send(url, body)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            except httpx.TimeoutException:
                raise RequestFailed(f"no response within {self.timeout:g}s")
            except _ServerError as exc:
                last = str(exc)
            time.sleep(min(8.0, 0.5 * 2 ** attempt))
        raise RequestFailed(self.server_alive() or f"gave up after {self.retries + 1} attempts: {last}")

    def _send(self, url: str, body: dict[str, Any]) -> Completion:
        out = Completion()
        with httpx.stream("POST", url, json=body, headers=self.headers, timeout=self.timeout) as response:
            if response.status_code >= 400:
                text = response.read().decode(errors="replace")
                message = f"HTTP {response.status_code}: {_server_message(text)}"
                if response.status_code >= 500:
                    raise _ServerError(message)
                raise RequestFailed(f"rejected by the server: {message}")
            if not self.stream:
                parse_payload(json.loads(response.read()), self.endpoint, out)
                return out
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                parse_payload(json.loads(data), self.endpoint, out)
        return out


class _ServerError(Exception):
    """A 5xx answer: retried."""


def _server_message(text: str) -> str:
    try:
        data = json.loads(text)
        error = data.get("error", data)
        message = error.get("message", error) if isinstance(error, dict) else error
        return " ".join(str(message).split())[:400]
    except (ValueError, AttributeError):
        return " ".join(text.split())[:400]
