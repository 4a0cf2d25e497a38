"""`openai` engine: any OpenAI-compatible server by base URL, /v1/completions or /v1/chat/completions,
streamed or not, with bounded concurrency, timeouts and retries."""

from __future__ import annotations

import ipaddress
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Iterator, Literal
from urllib.parse import urlparse

import httpx
from pydantic import Field, model_validator

from adapters.base import EngineOptions, greedy_ignored
from adapters.dialects import DIALECTS, Dialect
from adapters.openai_client import Client, Completion, RequestFailed, translate
from adapters.token_ids import TokenResolver, TokenTable
from harness.types import Request, Result, SamplingParams, Translation

DialectName = Literal[tuple(DIALECTS)]  # type: ignore[valid-type]


class ClientOptions(EngineOptions):
    endpoint: Literal["completions", "chat"] = "completions"
    stream: bool = False
    prompt: Literal["auto", "token_ids", "text"] = "auto"  # auto: token ids where the server accepts them
    model: str | None = None  # served model name; default: the first one /v1/models lists
    concurrency: int = Field(4, ge=1)
    request_timeout: float = Field(300, gt=0)
    retries: int = Field(3, ge=0)
    defaults: Literal["canonical", "engine"] = "canonical"  # engine: params left unset are not sent


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Options(ClientOptions):
    url: str
    dialect: DialectName = "generic"
    api_key_env: str | None = None  # name of the env var holding the API key
    allow_remote: bool = False

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> "Options":
        if not urlparse(self.url).scheme.startswith("http"):
            raise ValueError(f"url {self.url!r} is not an http(s) URL")
        if not is_loopback(self.url) and not self.allow_remote:
            raise ValueError(f"url {self.url} is not a loopback address: set allow_remote: true to use it")
        return self


def api_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """The Authorization header for a server that wants an API key, read from the env var the scenario names."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise RuntimeError(f"env var {api_key_env} (api_key_env) is not set")
    return {"Authorization": f"Bearer {key}"}


class Engine:
    """Talks to a running server. Subclasses (vllm-server) start the server first, then call connect()."""

    def __init__(self, name: str, model_path: Path, dtype: str, options: dict[str, Any], workdir: Path):
        self.name, self.options = name, Options(**options)
        self.connect(model_path, api_base(self.options.url), DIALECTS[self.options.dialect], self.options,
                     auth_headers(self.options.api_key_env))

    def connect(self, model_path: Path, base_url: str, dialect: Dialect, options: ClientOptions,
                headers: dict[str, str], server_alive: Callable[[], str | None] = lambda: None) -> None:
        self.client_options, self.dialect, self.base_url = options, dialect, base_url
        self.model_path = model_path
        self._tokenizer = None
        self._tokenizer_lock = threading.Lock()  # requests run in threads; import and load once
        self.token_table = TokenTable(lambda: self.tokenizer)
        models = httpx.get(f"{base_url}/models", headers=headers, timeout=30).json()
        served = [m["id"] for m in models.get("data", [])]
        self.model = options.model or (served[0] if served else "")
        self.server_version = models.get("version", "")
        self.client = Client(base_url, self.model, options.endpoint, options.stream, options.request_timeout,
                             options.retries, headers, server_alive)

    @property
    def tokenizer(self):
        """Loaded on first need (text prompts for servers without token-id prompts, or mapping token text)."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def versions(self) -> dict[str, str]:
        return {"server": self.base_url, "dialect": self.dialect.name, "served_model": self.model,
                "httpx": httpx.__version__}

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        translation = translate(params, self.dialect, top_logprobs, self.client_options.endpoint,
                                self.client_options.defaults)
        translation.warnings[:0] = greedy_ignored(params)
        return translation

    def _prompt(self, request: Request) -> list[int] | str:
        """Token ids where the server takes them, else the text (chat messages: the harness-templated text)."""
        mode = self.client_options.prompt
        if mode == "token_ids" or (mode == "auto" and self.dialect.token_id_prompts):
            return request.prompt_ids
        return request.text if request.text is not None else self.tokenizer.decode(request.prompt_ids)

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        with ThreadPoolExecutor(max_workers=self.client_options.concurrency) as pool:
            futures = {pool.submit(self._one, request): request for request in requests}
            for future in as_completed(futures):
                yield future.result()

    def _one(self, request: Request) -> Result:
        translation = self.translate(request.params, request.top_logprobs)
        body = self.client.body(request, translation.native_params, self._prompt(request))
        try:
            completion = self.client.complete(body)
        except RequestFailed as exc:
            return Result.engine_error(request.case_id, self.name, f"engine error: {exc}")
        return self._result(request, translation, body, completion)

    def _result(self, request: Request, translation: Translation, body: dict[str, Any],
                completion: Completion) -> Result:
        resolver = TokenResolver(self.token_table)
        steps = completion.steps
        token_ids = completion.token_ids or [resolver.resolve(s.token) for s in steps]
        top_ids = [[resolver.resolve(t) for t, _ in s.top[: request.top_logprobs]] for s in steps]
        warnings = list(translation.warnings) + resolver.warnings()
        if completion.prompt_token_ids is not None:
            prompt_ids = completion.prompt_token_ids
        else:
            prompt_ids = request.prompt_ids
            if "prompt" not in body or isinstance(body["prompt"], str):
                warnings.append("the server does not return prompt token ids: assumed equal to the harness's")
        if len(steps) != len(token_ids):
            warnings.append(f"server returned {len(token_ids)} token ids but logprobs for {len(steps)} steps")
        return Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=list(prompt_ids),
                      token_ids=list(token_ids), text=completion.text, finish_reason=completion.finish_reason,
                      chosen_logprobs=[s.logprob for s in steps], top_ids=top_ids,
                      top_logprobs=[[lp for _, lp in s.top[: request.top_logprobs]] for s in steps],
                      native_params={k: v for k, v in body.items() if k not in ("prompt", "messages")},
                      warnings=warnings)

    def close(self) -> None:
        pass
