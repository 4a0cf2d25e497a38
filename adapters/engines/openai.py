"""`openai` engine: any OpenAI-compatible server by base URL, /v1/completions or /v1/chat/completions,
streamed or not, with bounded concurrency, timeouts and retries. Server engines the harness starts (vllm-server,
lmdeploy-server) build on it through adapters.engines.served."""

from __future__ import annotations

import ipaddress
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

import httpx
from pydantic import Field, model_validator

from adapters.contract import (
    Capabilities,
    EngineDescription,
    EngineOptions,
    Knob,
    LogprobMeaning,
    LoraRules,
    Requirement,
    greedy_ignored,
    request_knobs,
)
from adapters.http import beam_requests, dialect_check
from adapters.http.agent_support import AgentSetup, agent_warnings
from adapters.http.answers import to_result
from adapters.http.client import Client, Completion, RequestFailed, connection_pool, translate
from adapters.http.dialects import DIALECTS, Dialect
from adapters.http.token_ids import TokenTable
from harness.core.types import EngineSetup, Request, Result, Translation
from harness.core.vocabulary import SamplingParams
from harness.models.catalog import eos_token_ids

if TYPE_CHECKING:
    DialectName = str
else:  # pydantic checks the name against the dialects
    DialectName = Literal[tuple(DIALECTS)]


# Requests run in threads, and attached clients of several engines share the harness's process (worker threads):
# transformers' first import is not safe from two threads at once ("cannot import name 'AutoTokenizer'", seen with
# 9 engines), so every import and tokenizer load of the process goes through one lock.
TOKENIZER_LOCK = threading.Lock()

class ClientOptions(EngineOptions):
    # completions | chat | generate (the server's native endpoint, lmdeploy's); unset: the dialect's choice for
    # token-level comparison (lmdeploy: generate; the others: completions)
    endpoint: Literal["completions", "chat", "generate"] | None = None
    stream: bool = False
    prompt: Literal["auto", "token_ids", "text"] = "auto"  # auto: token ids where the server accepts them
    model: str | None = None  # served model name; default: the first one /v1/models lists
    concurrency: int | None = Field(None, ge=1)  # unset: as many as the server runs at once (the dialect's in_flight)
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


def check_url(url: str | None, allow_remote: bool) -> None:
    """An http(s) URL, and a loopback one unless the scenario allows remote servers."""
    if url is None:
        return
    if not urlparse(url).scheme.startswith("http"):
        raise ValueError(f"url {url!r} is not an http(s) URL")
    if not is_loopback(url) and not allow_remote:
        raise ValueError(f"url {url} is not a loopback address: set allow_remote: true to use it")


def check_endpoint(dialect: Dialect, endpoint: str | None, stream: bool) -> None:
    """An endpoint that cannot give per-token logprobs, or that this server does not have, is refused up front."""
    chosen = endpoint or dialect.default_endpoint
    if chosen in dialect.no_logprobs:
        raise ValueError(f"endpoint {chosen}: {dialect.no_logprobs[chosen]}, so it cannot be compared token by token: "
                         f"use endpoint: {dialect.default_endpoint} (or chat)")
    if chosen == "generate" and not dialect.generate_fields:
        raise ValueError(f"endpoint generate is lmdeploy's native endpoint; the {dialect.name} server has none: use "
                         "completions or chat")
    if chosen == "generate" and stream:
        raise ValueError("stream: the native generate endpoint is compared unstreamed: drop stream: true")


class AttachOptions(ClientOptions):
    """Where the server is and how to reach it. api_key_env names the env var holding the key (never the key)."""

    url: str | None = None
    api_key_env: str | None = None
    allow_remote: bool = False

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> AttachOptions:
        check_url(self.url, self.allow_remote)
        return self


class Options(AttachOptions):
    url: str
    dialect: DialectName = "generic"

    @model_validator(mode="after")
    def _endpoint_gives_logprobs(self) -> Options:
        check_endpoint(DIALECTS[self.dialect], self.endpoint, self.stream)
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
    """Talks to a running server. Server engines (adapters.engines.served) start or attach first, then connect()."""

    options: AttachOptions  # each server engine's own Options

    def __init__(self, setup: EngineSetup):
        options = Options(**setup.options)
        self.name, self.options = setup.name, options
        self.connect(setup.model_path, api_base(options.url), DIALECTS[options.dialect], options,
                     auth_headers(options.api_key_env), adapter=setup.lora.name if setup.lora else None)

    def connect(self, model_path: Path, base_url: str, dialect: Dialect, options: ClientOptions,
                headers: dict[str, str], server_alive: Callable[[], str | None] = lambda: None,
                adapter: str | None = None) -> None:
        """adapter: the served name of a LoRA adapter the requests name (the options' model: still wins)."""
        self.client_options, self.dialect, self.base_url = options, dialect, base_url
        self.endpoint = options.endpoint or dialect.default_endpoint
        self.model_path = model_path
        self._tokenizer = None
        self.token_table = TokenTable(lambda: self.tokenizer)
        http = connection_pool()
        models = http.get(f"{base_url}/models", headers=headers, timeout=30).json()
        served = [m["id"] for m in models.get("data", [])]
        self.model = options.model or adapter or (served[0] if served else "")
        self.server_version = models.get("version", "")
        self.dialect_warnings = dialect_check.check(dialect, base_url, headers, http)
        self.empty_token_id = min(eos_token_ids(model_path), default=None) if dialect.empty_token == "eos" else None
        self.client = Client(base_url, self.model, self.endpoint, options.stream, options.request_timeout,
                             options.retries, headers, server_alive, http, dialect.stream_usage)

    @property
    def tokenizer(self):
        """Loaded on first need (text prompts for servers without token-id prompts, or mapping token text)."""
        with TOKENIZER_LOCK:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def versions(self) -> dict[str, str]:
        return {"server": self.base_url, "dialect": self.dialect.name, "served_model": self.model,
                "httpx": httpx.__version__}

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        if params.num_beams:
            translation = beam_requests.translate(params, self.dialect, top_logprobs)
        else:
            translation = translate(params, self.dialect, top_logprobs, self.endpoint, self.client_options.defaults)
        translation.warnings[:0] = greedy_ignored(params)
        translation.warnings += self.dialect_warnings
        return translation

    def beam_score(self, prompt_ids: list[int], beam_ids: list[int], cum_logprob: float,
                   body: dict[str, Any]) -> float | None:
        """A beam's final score as the server would rank it; None: the server reports none and its rule is not
        known here (server engines that know it override this)."""
        return None

    def agent_setup(self) -> AgentSetup:
        """How the server was started for agent requests: not known for one reached by url (engines that start
        their server say)."""
        return AgentSetup(known=False)

    def _prompt(self, request: Request) -> list[int] | str:
        """Token ids where the server takes them, else the text (chat messages: the harness-templated text)."""
        mode = self.client_options.prompt
        if mode == "token_ids" or (mode == "auto" and self.dialect.token_id_prompts):
            return request.prompt_ids
        return request.text if request.text is not None else self.tokenizer.decode(request.prompt_ids)

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        """Results as they complete, `concurrency` requests in flight (unset: as many as the server runs at once).
        The request threads are daemons: a harness interrupted while they wait on a server exits without them
        (concurrent.futures' threads are joined at exit, which kept a Ctrl-C'd run alive until its last queued request
        was answered)."""
        todo: queue.SimpleQueue = queue.SimpleQueue()
        answers: queue.SimpleQueue = queue.SimpleQueue()
        for request in requests:
            todo.put(request)

        def send_requests() -> None:
            while True:
                try:
                    request = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    answers.put((self._one(request), None))
                except BaseException as exc:  # raised again below, in the worker loop's thread
                    answers.put((None, exc))

        for _ in range(min(self.client_options.concurrency or self.dialect.in_flight, len(requests))):
            threading.Thread(target=send_requests, daemon=True, name=f"{self.name} requests").start()
        for _ in requests:
            result, error = answers.get()
            if error is not None:
                raise error
            yield result

    def _one(self, request: Request) -> Result:
        if request.params.num_beams:
            return beam_requests.complete(self, request)
        translation = self.translate(request.params, request.top_logprobs)
        if self.endpoint == "chat":
            translation.warnings += agent_warnings(self.dialect.name, self.dialect.agent, self.agent_setup(), request)
        body = self.client.body(request, translation.native_params, self._prompt(request))
        started = time.perf_counter()
        try:
            completion = self.client.complete(body)
            result = self._result(request, translation, body, completion)
        except RequestFailed as exc:
            return Result.engine_error(request.case_id, self.name, f"engine error: {exc}")
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # an answer of the wrong shape: this case only
            return Result.engine_error(request.case_id, self.name, "engine error: the server's answer could not be "
                                       f"read ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
        result.timings = {"generate_s": time.perf_counter() - started, "attempts": float(completion.attempts)}
        return result

    def _result(self, request: Request, translation: Translation, body: dict[str, Any],
                completion: Completion) -> Result:
        return to_result(self.name, request, translation, body, completion, self.token_table, self.client.url,
                         self.empty_token_id)

    def reuse(self, setup: EngineSetup) -> bool:
        """Another plan of this configuration (a scoring pass after the run) through the same connection, and for a
        server the harness started, the same running server."""
        self.name = setup.name
        return True

    def close(self) -> None:
        if getattr(self, "client", None) is not None:  # not connected when the server did not start
            self.client.close()


DESCRIPTION = EngineDescription(
    name="openai", summary="any OpenAI-compatible server by base URL (dialects: " + ", ".join(DIALECTS) + ")",
    engine=Engine, options=Options, requirement=Requirement(module="httpx", distribution="httpx"),
    capabilities=Capabilities(server=True, http_only_client=True, beam_search=True), batch_size=None,
    beam_refusal=lambda options: beam_requests.refusal(DIALECTS[options.dialect]),
    sampling=lambda options: DIALECTS[options.dialect].sampling_code(options.defaults),
    dialect=lambda options: options.dialect, knobs=lambda name, options: attached_knobs(name, options),
    # the server applies it: requests name its served name, the rank and modules are the server's business
    lora=LoraRules(source="the server's own LoRA support (requests name the adapter's served name)"),
    logprobs=lambda options: LogprobMeaning("unknown", "as the server computes them: an OpenAI-compatible server does "
                                            "not say whether before or after its sampler"))


def attached_knobs(name: str, options: ClientOptions) -> Knob:
    """A server reached by url: the knobs that only need requests; its configuration is not the harness's."""
    if name == "batch":
        return Knob(unsupported="a server batches the requests that arrive together: see concurrency")
    if name in ("prefix_cache", "chunked_prefill", "speculative", "batch_invariant"):
        return Knob(unsupported="a server reached by url: its configuration is not the harness's to change")
    return request_knobs(name, options, server=True)
