"""`llama.cpp-server` engine: llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, from the same
build as the `llama.cpp` engine) started by the harness on 127.0.0.1 on a GGUF variant of the scenario's model, or
attached by url; spoken to in the llama-cpp-python dialect (text prompts, token text mapped back to ids, special
tokens written as '', its repeat_penalty 1.1 default neutralised), checked against the live server's request schema
when the engine connects."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from adapters.contract import Capabilities, EngineDescription, LogprobMeaning, Requirement, SamplingCode
from adapters.engines import llamacpp_gguf
from adapters.engines.gguf_tensors import describe
from adapters.engines.llamacpp import (
    GGML_TYPES,
    CacheOptions,
    asked_context,
    context_size,
    extra_buffers,
    gguf_file,
    user_gguf_bos,
    yarn_betas,
)
from adapters.engines.llamacpp import Options as LibraryOptions
from adapters.engines.llamacpp_lora import RULES as LORA_RULES
from adapters.engines.llamacpp_lora import adapter_gguf
from adapters.engines.served import Launch, ServedEngine, ServedOptions, endpoint_checked, installed_version
from adapters.http.agent_support import AgentSetup
from adapters.http.client import RequestFailed
from adapters.http.token_ids import TokenResolver
from harness.core.types import EngineSetup, Result, TraceRequest

DIALECT = "llama-cpp-python"
SCORE_TOP_K = 5
# llama_cpp.server (0.3.36) takes every setting from the environment too, by its lower-case name in any case
# (pydantic-settings): llama_cpp.server.settings.Settings' fields, held to the installed version in
# tests/engines/test_exposure.py. Its __main__ also reads CONFIG_FILE (which replaces every other setting), and HOST
# and PORT, which override the command line. The server the harness starts gets none of them from a user's shell.
SERVER_SETTINGS = frozenset((
    "api_key", "cache", "cache_size", "cache_type", "chat_format", "chat_template_kwargs", "clip_model_path",
    "config_file", "disable_ping_events", "draft_model", "draft_model_num_pred_tokens", "embedding", "flash_attn",
    "hf_model_repo_id", "hf_pretrained_model_name_or_path", "hf_tokenizer_config_path", "host", "interrupt_requests",
    "kv_overrides", "last_n_tokens_size", "logits_all", "lora_base", "lora_path", "main_gpu", "model", "model_alias",
    "mul_mat_q", "n_batch", "n_ctx", "n_gpu_layers", "n_threads", "n_threads_batch", "n_ubatch", "numa",
    "offload_kqv", "port", "root_path", "rope_freq_base", "rope_freq_scale", "rope_scaling_type", "rpc_servers", "seed",
    "split_mode", "ssl_certfile", "ssl_keyfile", "tensor_split", "type_k", "type_v", "use_mlock", "use_mmap",
    "verbose", "vocab_only", "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_ext_factor",
    "yarn_orig_ctx"))


class Options(ServedOptions, CacheOptions):
    _endpoint = endpoint_checked(DIALECT)
    gguf: str = "f32"  # as for the llama.cpp engine: f32, f16, q8_0, q4_k_m, bundled or a path to a .gguf file
    # the chat template's switches, which llama_cpp.server takes only when it starts (--chat_template_kwargs): a
    # request asking for others is answered without them, warned NOT APPLIED
    chat_template_kwargs: dict[str, Any] | None = None
    last_n_tokens: int = Field(64, ge=0)  # the penalties' window (--last_n_tokens_size)
    extra_buffers: Literal["auto", "on", "off"] = "auto"  # as for the llama.cpp engine (auto: off where AMX is used)
    n_ctx: int | None = Field(None, ge=1)  # as for the llama.cpp engine (--n_ctx; unset: the run's, rounded up)
    startup_timeout: float = Field(300, gt=0)

    @field_validator("gguf")
    @classmethod
    def _known_variant(cls, value: str) -> str:
        return LibraryOptions._known_variant(value)  # the llama.cpp engine's check


def echo_positions(token_ids: list[int], bos: int | None) -> list[tuple[int, bool]]:
    """Which position's distribution each entry of llama-cpp-python's echoed logprobs holds, and whether the leading
    BOS was stripped (0.3.36, Llama._create_completion): it drops a leading BOS, skips every other BOS token, and
    gives the entry of the i-th remaining token the logits of row i. With the BOS stripped, row i is the position
    before that token (entries are aligned); without it, row i is the token's own position, so each entry carries
    the distribution of the next token. Either way entry -> position i; returns (position, stripped) per entry."""
    stripped = bool(token_ids) and token_ids[0] == bos
    rest = token_ids[1:] if stripped else token_ids
    return [(i, stripped) for i, token in enumerate(rest) if token != bos]


def command(setup: EngineSetup, port: int, options: Options, gguf: str, threads: int, buffers: bool,
            n_ctx: int) -> list[str]:
    """The server's command line: llama_cpp.server through adapters.engines.llamacpp_serve, which sets the extra
    buffers (buffers: on or off) that llama_cpp.server has no setting for; its context is n_ctx (context_size: the
    n_ctx option's, or the run's rounded up) and a YaRN file's betas are passed as settings (the server would give
    llama.cpp its own)."""
    k, v = (str(GGML_TYPES[kind]) for kind in options.cache_types())
    betas = [arg for name, value in yarn_betas(gguf).items() for arg in (f"--{name}", str(value))]
    return [sys.executable, "-m", "adapters.engines.llamacpp_serve", "on" if buffers else "off",
            "--model", gguf, "--host", options.bind, "--port", str(port),
            "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
            "--n_batch", str(n_ctx), "--logits_all", "true", "--type_k", k, "--type_v", v,
            "--flash_attn", "true" if options.flash_attn else "false",
            "--last_n_tokens_size", str(options.last_n_tokens), *betas,
            "--interrupt_requests", "false",  # a request arriving would cut a streamed answer short (its default)
            *(["--chat_template_kwargs", json.dumps(options.chat_template_kwargs)]
              if options.chat_template_kwargs else []),
            *(["--lora_path", str(adapter_gguf(setup.model_path, Path(setup.lora.path)))] if setup.lora else []),
            *options.extra_args]


class Engine(ServedEngine):
    options: Options  # for mypy, above `Options = Options`: below it, Options names the class attribute
    Options = Options
    DIALECT = DIALECT
    ADAPTER_BY_NAME = False  # started with --lora_path, it applies the adapter to every request

    def score(self, requests: list[TraceRequest]) -> Iterator[Result]:
        """Teacher forcing through the server's echo: the sequence's text sent as the prompt with echo and logprobs
        (one token generated, then dropped); its top-k logprobs at the positions that predict the continuation."""
        for request in requests:
            yield self._score_one(request)

    def _score_one(self, request: TraceRequest) -> Result:
        body = {"model": self.model, "prompt": self.tokenizer.decode(request.token_ids), "max_tokens": 1,
                "echo": True, "logprobs": SCORE_TOP_K, "temperature": 0.0, "repeat_penalty": 1.0}
        try:
            completion = self.client.complete(body)
        except RequestFailed as exc:
            return Result.engine_error(request.case_id, self.name, f"engine error: {exc}")
        resolver = TokenResolver(self.token_table, self.empty_token_id)
        echoed = echo_positions(request.token_ids, self.tokenizer.bos_token_id)
        got = [resolver.resolve(step.token) for step in completion.steps[: len(echoed)]]
        wanted = [request.token_ids[p + 1] if stripped else request.token_ids[p] for p, stripped in echoed]
        if got != wanted:
            first = next((i for i, (a, b) in enumerate(zip(got, wanted)) if a != b), min(len(got), len(wanted)))
            return Result.engine_error(request.case_id, self.name, (
                f"engine error: the server tokenised the sequence's text differently from the harness (echoed token "
                f"{first} is {got[first] if first < len(got) else 'missing'}, expected {wanted[first]}): no "
                "teacher-forced logprobs"))
        tops = {p: dict((resolver.resolve(t), lp) for t, lp in step.top) for (p, _), step in zip(echoed,
                                                                                              completion.steps)}
        tokens = request.token_ids
        positions = range(request.prompt_len - 1, len(tokens) - 1)
        ranked = [sorted(((t, lp) for t, lp in tops.get(p, {}).items() if t is not None), key=lambda kv: -kv[1])
                  [:SCORE_TOP_K] for p in positions]
        warnings = ["teacher-forced top-k logprobs from the server's echo (prompt logprobs)"]
        if not echoed or not echoed[0][1]:
            warnings.append("llama-cpp-python pairs echoed tokens with the next position's logprobs when the prompt "
                            "does not start with BOS; the top-k lists are realigned by position")
        return Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=tokens[: request.prompt_len],
                      token_ids=tokens[request.prompt_len:], finish_reason="forced",
                      chosen_logprobs=[tops.get(p, {}).get(tokens[p + 1], float("nan")) for p in positions],
                      top_ids=[[t for t, _ in r] for r in ranked], top_logprobs=[[lp for _, lp in r] for r in ranked],
                      native_params={k: v for k, v in body.items() if k != "prompt"},
                      warnings=warnings + resolver.warnings())

    def launch(self, setup: EngineSetup, port: int) -> Launch:
        import llama_cpp  # the server's own build: what it reports decides `auto`

        self.gguf = gguf_file(setup, self.options.gguf)
        self.n_ctx = context_size(setup, self.options.n_ctx)  # refused here, before a server starts, if too small
        self.extra_buffers = extra_buffers(llama_cpp, self.options.extra_buffers)
        threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        # a shell's settings for llama_cpp.server (PORT, HOST, SEED, an unrelated API_KEY...) must not change the
        # server the scenario describes; the key goes in as API_KEY (never on the command line: ps shows that)
        env = {k: v for k, v in os.environ.items() if k.lower() not in SERVER_SETTINGS}
        if self.options.api_key_env:
            env["API_KEY"] = os.environ[self.options.api_key_env]
        return Launch(command(setup, port, self.options, self.gguf, threads, self.extra_buffers, self.n_ctx), env,
                      health_path="/v1/models")

    def agent_setup(self) -> AgentSetup:
        return AgentSetup(template_kwargs=self.options.chat_template_kwargs, known=not self.options.url)

    def versions(self) -> dict[str, str]:
        info = {**super().versions(), "llama-cpp-python": installed_version("llama-cpp-python")}
        if not self.options.url:
            info["gguf"] = os.path.basename(self.gguf)
            info["kv_cache"] = self.options.cache_words()
            info["flash_attn"] = "on" if self.options.flash_attn else "off"
            info["tensor_types"] = describe(Path(self.gguf))
            info["extra_buffers"] = "on" if self.extra_buffers else "off"
            info["n_ctx"] = asked_context(self.n_ctx, self.options.n_ctx)
        return info


DESCRIPTION = EngineDescription(
    name="llama.cpp-server", engine=Engine, options=Options,
    summary="llama-cpp-python's OpenAI server (python -m llama_cpp.server) started on 127.0.0.1, or attached by url",
    requirement=Requirement(module="llama_cpp", distribution="llama-cpp-python", extra="llamacpp"),
    capabilities=Capabilities(server=True, scores=True, dtypes=("float32",)), batch_size=None,
    sampling=lambda options: SamplingCode("adapters.sampling.llamacpp", {
        "mode": "server", "defaults": options.defaults, "last_n_tokens": options.last_n_tokens,
        "gguf": None if options.url else options.gguf}),
    dialect=lambda options: DIALECT,
    weights=lambda model_path, options: None if options.url else llamacpp_gguf.weights(model_path, options.gguf),
    own_bos=lambda options: None if options.url else user_gguf_bos(options.gguf), lora=LORA_RULES,
    logprobs=lambda options: LogprobMeaning("raw_logprobs", "llama-cpp-python's server: the log-softmax of the "
                                            "logits, before its sampler"))
