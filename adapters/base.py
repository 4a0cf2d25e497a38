"""The engine interface every adapter implements, and helpers shared by adapters."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Iterator, Protocol

from pydantic import BaseModel, ConfigDict, Field

from harness.types import Request, Result, SamplingParams, TraceRequest, TraceResult, Translation


class EngineOptions(BaseModel):
    """Base for an adapter's options block; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class InProcessOptions(EngineOptions):
    """Options of engines whose model lives in the worker process (hf, vllm)."""

    patch: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                              description="module:function called with the loaded model, to A/B a kernel or a fusion")


class Engine(Protocol):
    """Runs inside a worker process. Loads the model once in __init__; generate() yields one Result per request,
    in any order, as soon as each is ready."""

    def __init__(self, name: str, model_path: Path, dtype: str, options: dict[str, Any], workdir: Path,
                 trace: bool = False) -> None: ...

    def versions(self) -> dict[str, str]: ...

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation: ...

    def generate(self, requests: list[Request]) -> Iterator[Result]: ...

    def close(self) -> None: ...


class TracingEngine(Engine, Protocol):
    """An engine that can also run teacher-forced passes capturing every canonical point (registry: traceable).
    Constructed with trace=True it prepares for that (hooks attached, caches that would skip positions off)."""

    def trace(self, requests: list[TraceRequest]) -> Iterator[TraceResult]: ...


def apply_patch(spec: str | None, model: Any) -> None:
    """Call the user's `module:function` with the loaded model (the module is found on the worker's sys.path,
    which includes the scenario file's folder)."""
    if not spec:
        return
    module_name, function_name = spec.split(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"patch {spec}: cannot load it ({exc}): check the module is importable from the "
                           "scenario's folder or the project") from exc
    function(model)


def greedy_ignored(params: SamplingParams) -> list[str]:
    """Warnings for truncation/temperature params that greedy decoding makes meaningless."""
    if not params.greedy:
        return []
    ignored = [k for k in ("top_k", "top_p", "min_p", "seed") if getattr(params, k) is not None]
    if params.temperature:
        ignored.append("temperature")
    return [f"{k} has no effect: decoding is greedy (do_sample false)" for k in ignored]


def top_k_of(logprobs, k: int):
    """(values, ids) of the k best entries of a [steps, vocab] torch tensor of log-probabilities."""
    values, ids = logprobs.topk(k, dim=-1)
    return values.tolist(), ids.tolist()
