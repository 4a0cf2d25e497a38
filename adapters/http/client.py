"""HTTP side of OpenAI-compatible engines: request bodies per dialect, retries, and both response shapes.

Completions responses carry `logprobs.tokens / token_logprobs / top_logprobs`; chat responses carry
`logprobs.content[]` with `top_logprobs` lists. Both, streamed or not, are normalised into Steps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from adapters.http.dialects import Dialect
from adapters.http.token_ids import TOKEN_ID_PREFIX
from harness.core.agent_requests import wire_messages
from harness.core.types import Request, Translation
from harness.core.vocabulary import GREEDY_IRRELEVANT, NEUTRAL, OPENAI_FIELDS, PENALTIES, TRUNCATION, SamplingParams


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
    attempts: int = 1
    choices: list[Completion] = field(default_factory=list)  # each choice apart (beam search: one per beam)
    usage: dict[str, int] = field(default_factory=dict)  # the token counts the server reported
    deltas: list[str] = field(default_factory=list)  # a streamed answer's text, chunk by chunk
    reasoning: str | None = None  # a chat answer's reasoning field (streamed: its deltas joined)
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> name, arguments (deltas joined)

    def message(self) -> dict[str, Any]:
        """The answer as the server split it, where it split anything (reasoning or calls)."""
        if self.reasoning is None and not self.tool_calls:
            return {}
        return {"content": self.text, "reasoning": self.reasoning,
                "tool_calls": [self.tool_calls[i] for i in sorted(self.tool_calls)]}


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
    for name, value in params.set_fields().items():
        if name in ("max_new_tokens", "temperature", "do_sample") or (name == "ignore_eos" and not value):
            continue
        how = dialect.handling(name)
        if how == "ignores":
            warnings.append(f"{name}={value} NOT APPLIED: the {dialect.name} server accepts and ignores it")
        elif how == "rejects":
            warnings.append(f"{name}={value} NOT APPLIED: the {dialect.name} server has no such field")
        else:
            body[OPENAI_FIELDS.get(name) or dialect.extra_fields[name]] = json_value(name, value)
    if defaults == "canonical":  # unset truncation means none; a server whose own default is not neutral is told
        for name in (*TRUNCATION, *PENALTIES):
            wanted = name in dialect.nonneutral or (name in TRUNCATION and not params.greedy)
            if getattr(params, name) is not None or not wanted or (params.greedy and name in GREEDY_IRRELEVANT):
                continue
            if dialect.handling(name) == "honours":
                body.setdefault(OPENAI_FIELDS.get(name) or dialect.extra_fields[name],
                                dialect.neutral.get(name, NEUTRAL[name]))
            elif name in dialect.defaults:
                warnings.append(f"{name} unset: the {dialect.name} server's default applies ({dialect.defaults[name]})")
    if endpoint == "generate":  # the server's native endpoint: token ids in and out, its own field set
        body.update(return_logprob=True, top_logprobs_num=top_logprobs)
        body.setdefault("skip_special_tokens", False)  # the text of every id, unless the scenario says
        for field in [f for f in body if f not in dialect.generate_fields]:
            warnings.append(f"{field}={body.pop(field)} NOT APPLIED: the {dialect.name} server's native /generate "
                            "endpoint has no such field")
        return Translation(native_params=body, warnings=warnings)
    if endpoint == "chat":
        body.update(logprobs=True, top_logprobs=top_logprobs)
    else:
        body["logprobs"] = top_logprobs
    body.update(dialect.token_id_fields)
    return Translation(native_params=body, warnings=warnings)


def json_value(name: str, value: Any) -> Any:
    """A param's value as the request's JSON carries it: logit_bias is keyed by token ids written as strings; a
    constraint is vLLM's structured_outputs object (the one server dialect that takes it)."""
    if name == "logit_bias":
        return {str(token): bias for token, bias in value.items()}
    if name == "constraint":
        return structured_outputs(value)
    return value


def structured_outputs(constraint: dict[str, Any]) -> dict[str, Any]:
    """A constraint's set field (json_schema, regex or choice) as vLLM's StructuredOutputsParams fields, offline and
    in the server's structured_outputs request field."""
    return {"json" if kind == "json_schema" else kind: spec for kind, spec in constraint.items()}


def _parse_completions_choice(choice: dict[str, Any], out: Completion) -> None:
    out.text += choice.get("text") or ""
    logprobs = choice.get("logprobs") or {}
    tops = logprobs.get("top_logprobs") or [None] * len(logprobs.get("tokens") or [])
    for token, lp, top in zip(logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [], tops, strict=False):
        out.steps.append(Step(token, lp, sorted((top or {}).items(), key=lambda kv: -kv[1])))


def _parse_chat_choice(choice: dict[str, Any], out: Completion) -> None:
    message = choice.get("message") or choice.get("delta") or {}
    out.text += message.get("content") or ""
    reasoning = message.get("reasoning", message.get("reasoning_content"))  # vLLM's field, then others' older one
    if reasoning is not None:
        out.reasoning = (out.reasoning or "") + reasoning
    for position, call in enumerate(message.get("tool_calls") or []):
        joined = out.tool_calls.setdefault(call.get("index", position), {"name": "", "arguments": ""})
        function = call.get("function") or {}
        joined["name"] += function.get("name") or ""
        joined["arguments"] += function.get("arguments") or ""
    for entry in (choice.get("logprobs") or {}).get("content") or []:
        top = [(t["token"], t["logprob"]) for t in entry.get("top_logprobs") or []]
        out.steps.append(Step(entry["token"], entry["logprob"], top))


def _parse_generate(payload: dict[str, Any], out: Completion) -> None:
    """lmdeploy's native /generate: output ids, and (logprob, id) pairs for the chosen and the top tokens."""
    out.text += payload.get("text") or ""
    out.token_ids = (out.token_ids or []) + [int(t) for t in payload.get("output_ids") or []]
    meta = payload.get("meta_info") or {}
    reason = meta.get("finish_reason") or {}
    out.finish_reason = (reason.get("type") if isinstance(reason, dict) else str(reason)) or out.finish_reason
    chosen = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or [None] * len(chosen)
    for (logprob, token), top in zip(chosen, tops, strict=False):
        listed = [(f"{TOKEN_ID_PREFIX}{int(t)}", lp) for lp, t in top or []]
        out.steps.append(Step(f"{TOKEN_ID_PREFIX}{int(token)}", logprob, sorted(listed, key=lambda kv: -kv[1])))


def parse_payload(payload: dict[str, Any], endpoint: str, out: Completion) -> None:
    """Fold one response (or one streamed chunk) into `out`."""
    if payload.get("error"):
        raise RequestFailed(f"server error: {payload['error']}")
    if endpoint == "generate":
        _parse_generate(payload, out)
        return
    for choice in payload.get("choices") or []:
        (_parse_chat_choice if endpoint == "chat" else _parse_completions_choice)(choice, out)
        out.finish_reason = choice.get("finish_reason") or out.finish_reason
        if choice.get("token_ids") is not None:
            out.token_ids = (out.token_ids or []) + list(choice["token_ids"])
        if choice.get("prompt_token_ids") is not None:
            out.prompt_token_ids = list(choice["prompt_token_ids"])
    if payload.get("prompt_token_ids") is not None:
        out.prompt_token_ids = list(payload["prompt_token_ids"])
    if isinstance(payload.get("usage"), dict):
        out.usage = {k: v for k, v in payload["usage"].items() if isinstance(v, int)}


def agent_fields(request: Request) -> dict[str, Any]:
    """What an agent sends beside its messages, where the scenario gives it."""
    fields: dict[str, Any] = {}
    if request.tools:
        fields["tools"] = request.tools
    if request.tool_choice is not None:
        fields["tool_choice"] = request.tool_choice
    if request.chat_template_kwargs:
        fields["chat_template_kwargs"] = request.chat_template_kwargs
    return fields


def connection_pool() -> httpx.Client:
    """One pool for every request of an engine (thread-safe). A client per request cost 23 ms of CPU each (its SSL
    context), which the request threads took in turn under the interpreter lock: a wave of requests reached the
    server up to 0.2 s apart."""
    return httpx.Client(limits=httpx.Limits(max_connections=None))


Parse = Callable[[dict[str, Any], str, Completion], None]  # (payload, endpoint, completion to fill)


@dataclass
class Client:
    base_url: str  # ends with /v1
    model: str
    endpoint: str  # "completions" | "chat" | "generate" (a server's native endpoint, at its root)
    stream: bool
    timeout: float
    retries: int
    headers: dict[str, str]
    server_alive: Callable[[], str | None] = lambda: None  # None, or why the server is gone
    http: httpx.Client = field(default_factory=lambda: connection_pool(), repr=False)
    stream_usage: bool = False  # the server takes stream_options.include_usage (a streamed answer's token counts)

    def body(self, request: Request, sampling: dict[str, Any], prompt: list[int] | str) -> dict[str, Any]:
        """The request body. Chat sends the messages (a text prompt becomes one user message: the server then
        applies its chat template); completions sends `prompt` (token ids, or text for servers that need it)."""
        if self.endpoint == "generate":
            return {**sampling, "input_ids": list(request.prompt_ids), "stream": False}
        stream = self.stream if request.stream is None else request.stream
        body = {"model": self.model, **sampling, "stream": stream}
        if stream and self.stream_usage:  # the token counts come in a last chunk of their own
            body["stream_options"] = {"include_usage": True}
        if self.endpoint == "chat":
            body["messages"] = wire_messages(request.messages) if request.messages else \
                [{"role": "user", "content": request.text or ""}]
            body.update(agent_fields(request))
        else:
            body["prompt"] = prompt
        return body

    def close(self) -> None:
        self.http.close()

    @property
    def url(self) -> str:
        if self.endpoint == "generate":
            return f"{self.base_url.removesuffix('/v1')}/generate"
        return f"{self.base_url}/{'chat/completions' if self.endpoint == 'chat' else 'completions'}"

    def complete(self, body: dict[str, Any], parse: Parse | None = None) -> Completion:
        """Send one request; its answer is parsed by `parse` (default: every choice folded into one completion).
        A request changes nothing on the server, so what may be transient is retried, at most `retries` times with
        backoff (0.5 s, 1 s, 2 s ... capped at 8 s): a dropped connection, a body cut short, a 5xx answer, an answer
        that does not parse, a stream that ends without a finish reason. Not retried: a 4xx (the server refuses this
        request), no answer within the timeout (the server may still be working on it: a retry would pile up on a
        stuck server), an answer that parses but cannot be compared (logprobs missing for some tokens: a server that
        does that does it again)."""
        url = self.url
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
            gone = self.server_alive()
            if gone:
                raise RequestFailed(gone)
            try:
                completion = self._send(url, body, parse or parse_payload)
                completion.attempts = attempt + 1
                return completion
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                last = f"connection failed ({type(exc).__name__}: {exc})"
            except httpx.TimeoutException:
                raise RequestFailed(f"no response within {self.timeout:g}s (not retried)") from None
            except (_ServerError, _Unreadable) as exc:
                last = str(exc)
        raise RequestFailed(self.server_alive() or f"gave up after {self.retries + 1} attempts: {last}")

    def _send(self, url: str, body: dict[str, Any], parse: Parse) -> Completion:
        out = Completion()
        with self.http.stream("POST", url, json=body, headers=self.headers, timeout=self.timeout) as response:
            if response.status_code >= 400:
                text = response.read().decode(errors="replace")
                message = f"HTTP {response.status_code}: {_server_message(text)}"
                if response.status_code >= 500:
                    raise _ServerError(message)
                raise RequestFailed(f"rejected by the server: {message}")
            if not body.get("stream"):
                _parse(response.read(), self.endpoint, out, parse)
                return out
            read_stream(response.iter_lines(), self.endpoint, out, parse)
        return out


def read_stream(lines: Iterable[str], endpoint: str, out: Completion, parse: Parse) -> None:
    """Fold a streamed answer's server-sent events into `out`, each chunk's new text kept as a delta. A stream that
    ends without a finish reason was cut short (every whole one ends with a chunk naming why): _Unreadable."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        before = len(out.text)
        _parse(data, endpoint, out, parse)
        if len(out.text) > before:
            out.deltas.append(out.text[before:])
    if not out.finish_reason:
        raise _Unreadable(f"the stream ended after {len(out.deltas)} chunk(s) without a finish reason: cut short "
                          "(llama-cpp-python's server cuts a stream when another request arrives, unless started "
                          "with --interrupt_requests false)")


def _parse(data: str | bytes, endpoint: str, out: Completion, parse: Parse) -> None:
    """Fold one answer (or streamed chunk) into `out` with `parse`; an answer that is not the JSON this endpoint
    gives is _Unreadable."""
    try:
        parse(json.loads(data), endpoint, out)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _Unreadable(f"unreadable answer ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None


class _Unreadable(Exception):
    """An answer that does not parse as this endpoint's JSON: retried (a body cut short reads the same)."""


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
