"""Server engines the harness can start: one attach-or-launch path for all of them.

With `url:` the engine attaches to a running server (loopback unless allow_remote, API key from the env var named by
api_key_env) and never stops it. Without it, the engine starts the server on a free port of 127.0.0.1 (another
address only with `bind:` and allow_remote: true; the run's versions record where it listened, and the reports say
when that was not loopback) with the command its subclass builds, waits for its health endpoint, and stops it (with
its whole process group) when the engine closes, also when the worker dies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field, model_validator

from adapters.engines.openai import AttachOptions, api_base, auth_headers, check_endpoint, is_loopback
from adapters.engines.openai import Engine as OpenAIEngine
from adapters.http.dialects import DIALECTS
from adapters.http.server_process import ServerProcess, free_port
from harness.core.types import EngineSetup


def installed_version(*distributions: str) -> str:
    """The version of the first of these distributions installed here, read from its metadata: a server engine's
    worker never imports the server's package (seconds of CPU it would take from the server starting up)."""
    from importlib import metadata

    for distribution in distributions:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "not installed here"


class ServedOptions(AttachOptions):
    startup_timeout: float = Field(600, gt=0)
    extra_args: list[str] = Field(default_factory=list)  # more server command-line arguments
    bind: str = "127.0.0.1"  # the address a server the harness starts listens on

    @model_validator(mode="after")
    def _loopback_bind_unless_allowed(self) -> ServedOptions:
        if not is_loopback(f"http://{self.bind}") and not self.allow_remote:
            raise ValueError(f"bind {self.bind} is not a loopback address: the server would be reachable from other "
                             "machines; set allow_remote: true to allow it")
        return self


def endpoint_checked(dialect: str):
    """A model validator for a server engine's Options: its endpoint must give per-token logprobs."""

    def check(options: ServedOptions) -> ServedOptions:
        check_endpoint(DIALECTS[dialect], options.endpoint, options.stream)
        return options

    return model_validator(mode="after")(check)


# A server started outside a harness worker (a test fixture, a script) has no thread setting of the worker's to
# inherit: torch's default, one spinning OpenMP thread per core, ran 9-50x slower beside any other process on a
# 2-core machine (ENGINE_NOTES). Such a server gets the scenario default, 1 thread that waits passively.
THREADS_UNSET = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}


@dataclass
class Launch:
    """How to start one server: its command and environment, the path that answers 200 once it is ready, and what
    to clean up after it stopped."""

    command: list[str]
    env: dict[str, str]
    health_path: str = "/health"
    cleanup: Callable[[], None] = field(default=lambda: None)


class ServedEngine(OpenAIEngine):
    """Subclasses set Options and DIALECT and implement launch()."""

    Options: ClassVar[type[ServedOptions]] = ServedOptions
    DIALECT: ClassVar[str]
    # a LoRA adapter is chosen per request by its served name (vLLM); False: the server applies it to every request
    ADAPTER_BY_NAME: ClassVar[bool] = True
    options: ServedOptions  # an instance of the subclass's Options

    def __init__(self, setup: EngineSetup):
        self.name, self.options = setup.name, self.Options(**setup.options)
        self.server: ServerProcess | None = None
        self.launched: Launch | None = None
        self.startup_s = 0.0
        headers = auth_headers(self.options.api_key_env)
        if self.options.url:
            base = api_base(self.options.url)
        else:
            base = self._start(setup, headers)
        alive = self.server.gone if self.server else (lambda: None)
        self.connect(setup.model_path, base, DIALECTS[self.DIALECT], self.options, headers, alive,
                     adapter=setup.lora.name if setup.lora and self.ADAPTER_BY_NAME else None)

    def launch(self, setup: EngineSetup, port: int) -> Launch:
        raise NotImplementedError

    def _start(self, setup: EngineSetup, headers: dict[str, str]) -> str:
        port = free_port()
        started = time.monotonic()
        try:  # no close() follows a constructor that raised: what launch() made (a socket folder) is released here
            self.launched = self.launch(setup, port)
            self.server = ServerProcess(self.launched.command, {**THREADS_UNSET, **self.launched.env},
                                        setup.workdir / "server.log", setup.workdir / "server.pid")
            self.server.wait_ready(f"http://127.0.0.1:{port}{self.launched.health_path}", self.options.startup_timeout,
                                   headers)
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - started
        self.listening = f"{self.options.bind}:{port}"
        return f"http://127.0.0.1:{port}/v1"

    def versions(self) -> dict[str, str]:
        info = super().versions()
        if self.server:
            info["server_startup_s"] = f"{self.startup_s:.1f}"
            info["server_listening"] = self.listening
        return info

    def close(self) -> None:
        super().close()
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.launched is not None:
            self.launched.cleanup()
            self.launched = None
