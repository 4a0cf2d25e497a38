"""The engine interface every adapter implements, and helpers shared by adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Protocol

from pydantic import BaseModel, ConfigDict

from harness.types import Request, Result, SamplingParams, Translation


class EngineOptions(BaseModel):
    """Base for an adapter's options block; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class Engine(Protocol):
    """Runs inside a worker process. Loads the model once in __init__; generate() yields one Result per request,
    in any order, as soon as each is ready."""

    def __init__(self, name: str, model_path: Path, dtype: str, options: dict[str, Any], workdir: Path) -> None: ...

    def versions(self) -> dict[str, str]: ...

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation: ...

    def generate(self, requests: list[Request]) -> Iterator[Result]: ...

    def close(self) -> None: ...


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
