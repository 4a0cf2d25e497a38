"""`vllm-server` engine: the harness starts the real vLLM OpenAI server on 127.0.0.1 (or attaches to one by url)
and talks to it as the `openai` engine does, in the vLLM dialect (token-id prompts, token ids returned)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from adapters import openai_engine
from adapters.dialects import DIALECTS
from adapters.server_process import ServerProcess, free_port
from adapters.vllm_offline import Options as OfflineOptions, prepare_env, remove_socket_dir, socket_dir


class Options(openai_engine.ClientOptions):
    url: str | None = None  # attach to a running server instead of starting one (never stopped by the harness)
    allow_remote: bool = False
    enforce_eager: bool = True
    kv_cache_gib: float = Field(1.0, gt=0)
    max_model_len: int | None = Field(None, ge=16)
    startup_timeout: float = Field(600, gt=0)
    # vllm: no defaults from the model's generation_config.json (what offline vLLM does here); auto: vLLM's own
    # server default, which takes temperature, top_p, repetition_penalty... from that file
    generation_config: Literal["vllm", "auto"] = "vllm"
    extra_args: list[str] = Field(default_factory=list)  # more api_server command-line arguments


def launch(model_path: Path, dtype: str, workdir: Path, options: Options) -> tuple[ServerProcess, str, Path]:
    """Start the vLLM OpenAI server on a free 127.0.0.1 port and wait until /v1/models answers.
    Returns the process, the API base URL and the socket directory to remove after stopping it."""
    port = free_port()
    sockets = socket_dir(workdir)
    env_options = OfflineOptions(kv_cache_gib=options.kv_cache_gib, multiprocessing=True)
    env = {**os.environ, **prepare_env(workdir, env_options, sockets)}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--seed", "0",
           "--max-logprobs", "20", "--generation-config", options.generation_config,
           "--disable-uvicorn-access-log"]
    if options.enforce_eager:
        cmd.append("--enforce-eager")
    if options.max_model_len:
        cmd += ["--max-model-len", str(options.max_model_len)]
    cmd += options.extra_args
    server = ServerProcess(cmd, env, workdir / "server.log", workdir / "server.pid")
    base = f"http://127.0.0.1:{port}/v1"
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/health", options.startup_timeout)
    except BaseException:
        server.stop()
        remove_socket_dir(sockets)
        raise
    return server, base, sockets


class Engine(openai_engine.Engine):
    def __init__(self, name: str, model_path: Path, dtype: str, options: dict[str, Any], workdir: Path):
        self.name, self.options = name, Options(**options)
        self.server: ServerProcess | None = None
        self.sockets: Path | None = None
        self.startup_s = 0.0
        if self.options.url:
            openai_engine.Options(url=self.options.url, allow_remote=self.options.allow_remote)  # loopback check
            base = openai_engine.api_base(self.options.url)
        else:
            started = time.monotonic()
            self.server, base, self.sockets = launch(model_path, dtype, workdir, self.options)
            self.startup_s = time.monotonic() - started
        alive = self.server.gone if self.server else (lambda: None)
        self.connect(model_path, base, DIALECTS["vllm"], self.options, {}, alive)

    def versions(self) -> dict[str, str]:
        import vllm

        info = {**super().versions(), "vllm": vllm.__version__}
        if self.server:
            info["server_startup_s"] = f"{self.startup_s:.1f}"
        return info

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.sockets is not None:
            remove_socket_dir(self.sockets)
