"""`vllm-server` engine: the harness starts the real vLLM OpenAI server on 127.0.0.1 (or attaches to one by url)
and talks to it as the `openai` engine does, in the vLLM dialect (token-id prompts, token ids returned)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from adapters.contract import (
    Capabilities,
    EngineDescription,
    Knob,
    LogprobMeaning,
    Requirement,
    SamplingCode,
    request_knobs,
)
from adapters.engines.parser_runs import ParserOptions
from adapters.engines.served import Launch, ServedEngine, ServedOptions, endpoint_checked, installed_version
from adapters.engines.vllm_lora import RULES as LORA_RULES
from adapters.engines.vllm_lora import server_args
from adapters.engines.vllm_offline import (
    LogprobsMode,
    context_length,
    fp8_cache_problem,
    logprob_meaning,
    parallel_kwargs,
    prepare_env,
    speculative_not_applied,
)
from adapters.engines.vllm_offline import Options as OfflineOptions
from adapters.engines.vllm_offline import knobs as offline_knobs
from adapters.engines.vllm_parallel import split_problem
from adapters.engines.vllm_parsers import server_args as parser_args
from adapters.engines.vllm_sockets import remove_socket_dir, socket_dir
from adapters.http.agent_support import AgentSetup
from harness.core.types import EngineSetup, Result, TraceRequest, Translation
from harness.core.vocabulary import SamplingParams


class Options(ServedOptions, ParserOptions):
    _endpoint = endpoint_checked("vllm")
    chat_template: str | None = None  # --chat-template FILE: another template than the model folder's
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"  # --kv-cache-dtype, as offline
    enforce_eager: bool = True
    kv_cache_gib: float = Field(1.0, gt=0)
    max_model_len: int | None = Field(None, ge=16)  # None: what the run needs (its longest prompt + new tokens)
    # vllm: no defaults from the model's generation_config.json (what offline vLLM does here); auto: vLLM's own
    # server default, which takes temperature, top_p, repetition_penalty... from that file
    generation_config: Literal["vllm", "auto"] = "vllm"
    prefix_caching: bool | None = None  # None: vLLM's default
    chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = Field(None, ge=8)
    speculative: dict[str, Any] | None = None  # vLLM's --speculative-config
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT=1
    tensor_parallel_size: int = Field(1, ge=1)  # --tensor-parallel-size, each rank bound to cores of its own
    logprobs_mode: LogprobsMode = "raw_logprobs"  # --logprobs-mode, as offline


def knobs(name: str, options: Options) -> Knob:
    """A server batches what arrives together: batching is turned through concurrency. Its configuration knobs
    are the offline engine's, as server flags, when the harness starts it; an attached server's are not ours."""
    if name == "batch":
        return Knob(unsupported="a server batches the requests that arrive together: see concurrency")
    configured = offline_knobs(name, options)
    if configured.baseline or configured.variant:
        if options.url:
            return Knob(unsupported="attached to a server the harness did not start: its configuration is not the "
                                    "harness's to change")
        return configured
    return request_knobs(name, options, server=True)


def _flag(cmd: list[str], value: bool | None, name: str) -> None:
    if value is not None:
        cmd.append(f"--{'' if value else 'no-'}{name}")


def command(setup: EngineSetup, port: int, options: Options) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(setup.model_path),
           "--host", options.bind, "--port", str(port), "--dtype", setup.dtype, "--seed", "0",
           "--max-logprobs", "20", "--generation-config", options.generation_config,
           "--disable-uvicorn-access-log"]
    if options.enforce_eager:
        cmd.append("--enforce-eager")
    max_model_len = options.max_model_len or context_length(setup.max_context)
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    _flag(cmd, options.prefix_caching, "enable-prefix-caching")
    _flag(cmd, options.chunked_prefill, "enable-chunked-prefill")
    if options.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(options.max_num_batched_tokens)]
    if options.speculative:
        cmd += ["--speculative-config", json.dumps(options.speculative)]
    if options.kv_cache_gib < 1:  # VLLM_CPU_KVCACHE_SPACE takes whole GiB only
        cmd += ["--kv-cache-memory-bytes", str(int(options.kv_cache_gib * 2**30))]
    if options.logprobs_mode != "raw_logprobs":
        cmd += ["--logprobs-mode", options.logprobs_mode]
    if options.kv_cache_dtype != "auto":
        cmd += ["--kv-cache-dtype", options.kv_cache_dtype]
    for key, value in parallel_kwargs(options.tensor_parallel_size).items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    if options.chat_template:
        cmd += ["--chat-template", str(Path(options.chat_template).resolve())]
    return cmd + server_args(setup.lora) + parser_args(options) + options.extra_args


UNSAID = LogprobMeaning("unknown", "as the server was started (--logprobs-mode; raw_logprobs unless it says)")


def logged_compilation(log: Path) -> str:
    """The graph mode the server's engine settled on, as its start-up log prints its configuration
    ("compilation_config={'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, ..., 'backend': 'inductor', ...")."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "unknown (no server log)"
    mode = re.search(r"'mode': <CompilationMode\.(\w+)", text)
    backend = re.search(r"compilation_config=\{.*?'backend': '(\w*)'", text)
    if mode is None:
        return "unknown (the server's log does not say)"
    return mode[1] if mode[1] == "NONE" else f"{mode[1]} ({backend[1] if backend else 'unknown'})"


class Engine(ServedEngine):
    options: Options  # for mypy, above `Options = Options`: below it, Options names the class attribute
    Options = Options
    DIALECT = "vllm"

    def launch(self, setup: EngineSetup, port: int) -> Launch:
        problem = fp8_cache_problem(self.options.kv_cache_dtype) or split_problem(setup.model_path,
                                                                                 self.options.tensor_parallel_size)
        if problem:
            raise RuntimeError(problem)
        key = os.environ.get(self.options.api_key_env) if self.options.api_key_env else None
        if self.options.api_key_env and key is None:
            raise RuntimeError(f"api_key_env: ${self.options.api_key_env} is not set: export it, or drop the option")
        # multiprocessing False: the API server still runs the engine core in a process of its own, but the CPU
        # platform then keeps vLLM's model runner in that process (uni executor) instead of a third process that
        # imports vLLM again: ready in 21 s instead of 32 s on a 2-core machine, the same tokens
        env_options = OfflineOptions(kv_cache_gib=self.options.kv_cache_gib, multiprocessing=False,
                                     batch_invariant=self.options.batch_invariant,
                                     tensor_parallel_size=self.options.tensor_parallel_size)
        sockets = socket_dir(setup.workdir)  # the last thing made here: nothing below raises before Launch owns it
        env = {**os.environ, **prepare_env(setup.workdir, env_options, sockets)}
        if self.options.kv_cache_gib < 1:  # the exact bytes of --kv-cache-memory-bytes apply, not whole GiB
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        self.threads_bind = env["VLLM_CPU_OMP_THREADS_BIND"]
        env.pop("VLLM_API_KEY", None)  # a shell's own key would make the server demand one the harness never sends
        if key is not None:  # the key goes in the environment, never on the command line (ps shows that)
            env["VLLM_API_KEY"] = key
        return Launch(command(setup, port, self.options), env, cleanup=lambda: remove_socket_dir(sockets))

    def versions(self) -> dict[str, str]:
        started = {} if self.options.url else {"tensor_parallel_size": str(self.options.tensor_parallel_size),
                                               "kv_cache": self.options.kv_cache_dtype}
        if self.server is not None:
            started["compilation"] = logged_compilation(self.server.log_path)
        if self.options.tensor_parallel_size > 1 and not self.options.url:
            started["threads_bind"] = self.threads_bind
        return {**super().versions(), "vllm": installed_version("vllm", "vllm-cpu"), **started}

    def agent_setup(self) -> AgentSetup:
        return AgentSetup(self.options.tool_parser, self.options.reasoning_parser, known=not self.options.url)

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        translation = super().translate(params, top_logprobs)
        translation.warnings.extend(speculative_not_applied(params, self.options.speculative))
        return translation

    def score(self, requests: list[TraceRequest]) -> Iterator[Result]:
        """Teacher forcing through the server's prompt logprobs (adapters.engines.vllm_scoring)."""
        from adapters.engines.vllm_scoring import score

        mode = self.options.logprobs_mode if not self.options.url else "raw_logprobs"
        for request in requests:
            yield score(self.client, self.model, self.name, request, mode)

    def beam_score(self, prompt_ids: list[int], beam_ids: list[int], cum_logprob: float,
                   body: dict[str, Any]) -> float | None:
        """The server returns no score: vLLM's own scoring function (the key its loop ranks by), with the request's
        length_penalty or the server's default for it."""
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        from adapters.engines.vllm_beams import score

        penalty = body.get("length_penalty", CompletionRequest.model_fields["length_penalty"].default)
        return score(prompt_ids, beam_ids, cum_logprob, self.tokenizer.eos_token_id, penalty)


DESCRIPTION = EngineDescription(
    name="vllm-server", summary="vLLM OpenAI server started on 127.0.0.1 by the harness (or attached by url)",
    engine=Engine, options=Options, requirement=Requirement(module="vllm", distribution="vllm-cpu", extra="vllm"),
    capabilities=Capabilities(server=True, beam_search=True, scores=True), batch_size=None,
    # started with --generation-config vllm unless the scenario says auto
    sampling=lambda options: SamplingCode("adapters.sampling.vllm", {
        "mode": "server", "defaults": options.defaults,
        "generation_config": options.generation_config if not options.url else "auto"}),
    dialect=lambda options: "vllm", knobs=knobs, lora=LORA_RULES,
    # a server the harness did not start returns what it was started with
    logprobs=lambda options: logprob_meaning(options) if not options.url else UNSAID)
