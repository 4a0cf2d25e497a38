"""`lmdeploy-server` engine: lmdeploy's OpenAI-compatible api_server (PyTorch backend) started by the harness on
127.0.0.1 with the engine's interpreter, or attached by url; spoken to as the `openai` engine does, in the lmdeploy
dialect (text prompts, token ids mapped back, frequency/presence penalties ignored by the server). Started with
--logprobs-mode raw_logprobs (without it the server refuses logprobs) and --generation-config lmdeploy (no
defaults from the model's generation_config.json) unless the scenario sets generation_config: auto."""

from __future__ import annotations

import os
import sys
from typing import Literal

from pydantic import Field

from adapters.contract import Capabilities, EngineDescription, Knob, LogprobMeaning, Requirement, SamplingCode
from adapters.engines.lmdeploy_pipeline import LMDEPLOY_DTYPES
from adapters.engines.openai import attached_knobs
from adapters.engines.served import Launch, ServedEngine, ServedOptions, endpoint_checked, installed_version
from adapters.http.agent_support import AgentSetup
from adapters.http.dialects import DIALECTS
from harness.core.types import EngineSetup


class Options(ServedOptions):
    _endpoint = endpoint_checked("lmdeploy")
    session_len: int = Field(4096, ge=64)
    cache_max_entry_count: float = Field(0.2, gt=0, lt=1)
    eager_mode: bool = True
    generation_config: Literal["lmdeploy", "auto"] = "lmdeploy"
    startup_timeout: float = Field(900, gt=0)
    tool_parser: str | None = None  # --tool-call-parser NAME (lmdeploy's own parsers: qwen3, internlm2, llama3, ...)
    reasoning_parser: str | None = None  # --reasoning-parser NAME (default, deepseek-v3, ...)


def command(setup: EngineSetup, port: int, options: Options) -> list[str]:
    cmd = [sys.executable, "-m", "lmdeploy", "serve", "api_server", str(setup.model_path), "--backend", "pytorch",
           "--server-name", options.bind, "--server-port", str(port), "--dtype", setup.dtype,
           "--session-len", str(options.session_len), "--cache-max-entry-count", str(options.cache_max_entry_count),
           "--logprobs-mode", "raw_logprobs", "--generation-config", options.generation_config]
    if options.eager_mode:
        cmd.append("--eager-mode")
    if options.tool_parser:
        cmd += ["--tool-call-parser", options.tool_parser]
    if options.reasoning_parser:
        cmd += ["--reasoning-parser", options.reasoning_parser]
    return cmd + options.extra_args


class Engine(ServedEngine):
    options: Options  # for mypy, above `Options = Options`: below it, Options names the class attribute
    Options = Options
    DIALECT = "lmdeploy"

    def launch(self, setup: EngineSetup, port: int) -> Launch:
        return Launch(command(setup, port, self.options), dict(os.environ))

    def agent_setup(self) -> AgentSetup:
        return AgentSetup(self.options.tool_parser, self.options.reasoning_parser, known=not self.options.url)

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "lmdeploy": installed_version("lmdeploy")}


DESCRIPTION = EngineDescription(
    name="lmdeploy-server", engine=Engine, options=Options,
    summary="lmdeploy api_server started on 127.0.0.1 by the harness (CUDA only), or attached by url",
    requirement=Requirement(module="lmdeploy", distribution="lmdeploy", env="lmdeploy", cuda=True),
    capabilities=Capabilities(server=True, dtypes=LMDEPLOY_DTYPES), batch_size=None,
    # started with --generation-config lmdeploy unless the scenario says auto; attached: lmdeploy's default, auto
    sampling=lambda options: SamplingCode("adapters.sampling.lmdeploy", {
        "mode": "server", "defaults": options.defaults,
        "generation_config": options.generation_config if not options.url else "auto"}),
    dialect=lambda options: "lmdeploy", knobs=lambda name, options: knobs(name, options),
    logprobs=lambda options: LogprobMeaning(
        "unknown" if options.url else "raw_logprobs",
        "as the server was started" if options.url else "lmdeploy's --logprobs-mode raw_logprobs, pinned at start"))


def knobs(name: str, options: Options) -> Knob:
    """The knobs that need only requests; the adapter sets none of the server's cache or scheduler switches."""
    if name == "stream" and (options.endpoint or DIALECTS["lmdeploy"].default_endpoint) == "generate":
        return Knob(unsupported="the native /generate endpoint (lmdeploy's default here) answers unstreamed: set "
                                "endpoint: chat to stream")
    if options.url or name not in ("prefix_cache", "chunked_prefill", "speculative", "batch_invariant"):
        return attached_knobs(name, options)
    return Knob(unsupported="the lmdeploy-server adapter does not set this server switch (not checkable without CUDA)")
