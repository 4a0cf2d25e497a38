"""vLLM's tensor parallelism on CPU: one worker process per rank (vLLM's mp executor), each rank's OpenMP threads
bound to cores of its own (VLLM_CPU_OMP_THREADS_BIND, "0|1" for two ranks on cores 0 and 1), taken from the cores
this process may use."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from adapters.tracing.arch_maps import sizes
from harness.core.shards import ShardLayout


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity; every core where the platform has none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def too_few_cores(ranks: int, cores: list[int] | None = None) -> str:
    """Why `ranks` ranks cannot each have a core of their own here ('' where they can)."""
    cores = usable_cores() if cores is None else cores
    if ranks <= len(cores):
        return ""
    return (f"tensor_parallel_size {ranks}: vLLM's CPU backend binds each rank to cores of its own, and this process "
            f"may use {len(cores)} core{'s' if len(cores) != 1 else ''} ({_spans(cores)}): use at most "
            f"{len(cores)}, or run on a machine with more cores")


def rank_binding(ranks: int, cores: list[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` ranks: the usable cores split into equal runs, one per rank, in order
    ("0|1"; "0-3|4-7"); the cores left over by an uneven split go unused."""
    cores = usable_cores() if cores is None else cores
    problem = too_few_cores(ranks, cores)
    if problem:
        raise RuntimeError(problem)
    each = len(cores) // ranks
    return "|".join(_spans(cores[rank * each:(rank + 1) * each]) for rank in range(ranks))


def _spans(cores: list[int]) -> str:
    """Cores as vLLM's binding writes them: runs of consecutive ids as a-b, joined by commas."""
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def split_problem(model_path: Path, ranks: int) -> str:
    """Why the model in this folder cannot be split over `ranks` tensor-parallel ranks ('' where it can, or where
    its config.json does not say), in the words of harness.core.shards, before vLLM loads anything."""
    if ranks == 1:
        return ""
    try:
        config = json.loads((model_path / "config.json").read_text())
        layout = ShardLayout.of(ranks, sizes(SimpleNamespace(**config.get("text_config", config))))
    except (OSError, ValueError, AttributeError, KeyError, ZeroDivisionError):
        return ""  # vLLM says for itself
    problem = layout.problem()
    return f"tensor_parallel_size {ranks}: {model_path.name}: {problem}" if problem else ""
