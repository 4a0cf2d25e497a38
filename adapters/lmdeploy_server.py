"""`lmdeploy-server` engine: lmdeploy's OpenAI-compatible api_server (PyTorch backend) started by the harness on
127.0.0.1 with the engine's interpreter, or attached by url; spoken to as the `openai` engine does, in the lmdeploy
dialect (text prompts, token ids mapped back, frequency/presence penalties ignored by the server). Started with
--logprobs-mode raw_logprobs (without it the server refuses logprobs) and --generation-config lmdeploy (no
defaults from the model's generation_config.json) unless the scenario sets generation_config: auto."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from adapters import openai_engine
from adapters.dialects import DIALECTS
from adapters.server_process import ServerProcess, free_port


class Options(openai_engine.ClientOptions):
    url: str | None = None  # attach to a running server instead of starting one (never stopped by the harness)
    allow_remote: bool = False
    api_key_env: str | None = None  # attached server: name of the env var holding its API key
    session_len: int = Field(4096, ge=64)
    cache_max_entry_count: float = Field(0.2, gt=0, lt=1)
    eager_mode: bool = True
    generation_config: Literal["lmdeploy", "auto"] = "lmdeploy"
    startup_timeout: float = Field(900, gt=0)
    extra_args: list[str] = Field(default_factory=list)


def command(model_path: Path, dtype: str, port: int, options: Options) -> list[str]:
    cmd = [sys.executable, "-m", "lmdeploy", "serve", "api_server", str(model_path), "--backend", "pytorch",
           "--server-name", "127.0.0.1", "--server-port", str(port), "--dtype", dtype,
           "--session-len", str(options.session_len), "--cache-max-entry-count", str(options.cache_max_entry_count),
           "--logprobs-mode", "raw_logprobs", "--generation-config", options.generation_config]
    if options.eager_mode:
        cmd.append("--eager-mode")
    return cmd + options.extra_args


class Engine(openai_engine.Engine):
    def __init__(self, name: str, model_path: Path, dtype: str, options: dict[str, Any], workdir: Path):
        import os

        self.name, self.options = name, Options(**options)
        self.server: ServerProcess | None = None
        self.startup_s = 0.0
        if self.options.url:
            openai_engine.Options(url=self.options.url, allow_remote=self.options.allow_remote)  # loopback check
            base = openai_engine.api_base(self.options.url)
        else:
            port = free_port()
            started = time.monotonic()
            self.server = ServerProcess(command(model_path, dtype, port, self.options), dict(os.environ),
                                        workdir / "server.log", workdir / "server.pid")
            try:
                self.server.wait_ready(f"http://127.0.0.1:{port}/health", self.options.startup_timeout)
            except BaseException:
                self.server.stop()
                raise
            self.startup_s = time.monotonic() - started
            base = f"http://127.0.0.1:{port}/v1"
        alive = self.server.gone if self.server else (lambda: None)
        self.connect(model_path, base, DIALECTS["lmdeploy"], self.options, openai_engine.auth_headers(
            self.options.api_key_env), alive)

    def versions(self) -> dict[str, str]:
        info = super().versions()
        if self.server:
            import lmdeploy

            info.update(lmdeploy=lmdeploy.__version__, server_startup_s=f"{self.startup_s:.1f}")
        return info

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
