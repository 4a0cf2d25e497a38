"""Capture inside a tensor-parallel vLLM engine, whose model lives in one worker process per rank.

vLLM's collective RPC (LLM.collective_rpc: a function run in every rank's worker, with the worker as its first
argument) is the control channel. Each rank hooks its own shard of the model with the same Capture and LayerInputs as
a one-rank engine (its fused outputs split by its own widths), and writes what a pass captured to a file of its own;
the adapter then joins the ranks' files into the one trace every other engine writes (harness.core.shards says which
points are split and how), so the comparison, the floor and explain read it as they read a one-rank engine's.
Joined against the reference's trace, each split point's error is also measured per rank, so a difference that lives
in one rank's shard is named with that rank.

ShardedCapture and ShardedForcing stand, in the adapter's process, for the Capture and LayerInputs of
adapters.tracing.capture.run_traces: begin, end and abort reach every rank.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from adapters.tracing.arch_maps import ArchMap
from harness.core.points import layer_point, parse
from harness.core.shards import SHARDED_POINTS, ShardLayout
from harness.rundir.traces import Trace, row_chunks

RANK_STATE = "_parity_capture"  # the worker attribute that holds a rank's capture


# --- run in every rank's worker (collective_rpc passes the worker first) ---

class RankCapture:
    def __init__(self, worker: Any, layout: ShardLayout):
        from vllm.distributed import get_tensor_model_parallel_rank

        from adapters.tracing.arch_maps import arch_map
        from adapters.tracing.capture import Capture, layer_inputs

        model = worker.model_runner.get_model()
        config = worker.vllm_config.model_config.hf_config
        self.rank, self.layout = get_tensor_model_parallel_rank(), layout
        arch = arch_map("vllm", config.model_type)
        self.capture = Capture(model, arch, layout.rank_sizes(), config.num_hidden_layers)
        self.forcing = layer_inputs(model, self.capture, config.num_hidden_layers)
        self.model, self.path, self.wants_logits = model, Path(), True
        self.writer: Any = None  # the pass's TraceWriter (begin() to end())

    def split_points(self) -> list[str]:
        """Every point of the model this rank holds a shard of."""
        return [layer_point(layer, name) for layer in range(self.capture.num_layers)
                for tap in self.capture.arch.per_layer for name in tap.points if name in SHARDED_POINTS]

    def begin(self, folder: str, positions: int, only: list[str] | None, logits_from: int,
              source: str | None) -> None:
        import torch

        from adapters.tracing.writer import TraceWriter

        self.wants_logits = only is None or "logits" in only  # alike in every rank: they compute them together
        if self.rank:  # the other ranks write only their shards of the split points: the rest is rank 0's
            split = self.split_points()
            only = [p for p in split if only is None or p in only]
        self.path = Path(folder) / f"rank{self.rank}.safetensors"
        self.writer = TraceWriter(self.path, torch.float32)
        self.capture.begin(self.writer, positions, only, ("final_norm",), logits_from)
        self.capture.muted = {"logits"}  # the sampler's own logits call (the last position) until logits()
        if source is not None and self.forcing is not None:
            self.forcing.begin(Path(source))

    def logits(self, logits_from: int) -> None:
        """Every position's logits from logits_from on, from the final norm's rows (compute_logits all-gathers the
        vocabulary's shards: every rank calls it)."""
        import torch

        from adapters.tracing.capture import LOGITS_SLICE

        self.capture.muted = set()
        if self.forcing is not None:
            self.forcing.end()
        if not self.wants_logits:
            return
        hidden = torch.cat(self.capture.keep["final_norm"])
        with torch.inference_mode():
            for start in range(logits_from, hidden.shape[0], LOGITS_SLICE):
                self.model.compute_logits(hidden[start:start + LOGITS_SLICE])

    def end(self, trace: str, metadata: dict[str, str]) -> dict[str, Any]:
        routes = self.capture.end(Path(trace), metadata) if self.rank == 0 else None
        writer, self.writer = self.writer, None
        points: list[str] = writer.close({"logits_from": str(self.capture.logits_from)}) if writer else []
        return {"rank": self.rank, "path": str(self.path), "points": points, "routes": str(routes or "")}

    def abort(self) -> None:
        self.capture.abort()
        if self.forcing is not None:
            self.forcing.end()
        if self.writer is not None:
            self.writer.discard()
            self.writer = None

    def close(self) -> None:
        for hooks in (self.capture, self.forcing):
            if hooks is not None:
                hooks.close()


def rank_attach(worker: Any, layout: ShardLayout) -> int:
    setattr(worker, RANK_STATE, RankCapture(worker, layout))
    return getattr(worker, RANK_STATE).rank


def rank_begin(worker: Any, *args: Any) -> None:
    getattr(worker, RANK_STATE).begin(*args)


def rank_logits(worker: Any, logits_from: int) -> None:
    getattr(worker, RANK_STATE).logits(logits_from)


def rank_end(worker: Any, trace: str, metadata: dict[str, str]) -> dict[str, Any]:
    return getattr(worker, RANK_STATE).end(trace, metadata)


def rank_abort(worker: Any) -> None:
    state = getattr(worker, RANK_STATE, None)
    if state is not None:
        state.abort()


def rank_close(worker: Any) -> None:
    state = getattr(worker, RANK_STATE, None)
    if state is not None:
        state.close()
        delattr(worker, RANK_STATE)


# --- in the adapter's process ---

class ShardedCapture:
    """The Capture interface run_traces drives, over every rank of an engine (rpc: LLM.collective_rpc)."""

    def __init__(self, rpc: Any, arch: ArchMap, layout: ShardLayout, num_layers: int):
        self.rpc, self.arch, self.layout, self.num_layers = rpc, arch, layout, num_layers
        self.writer: Any = None
        self.folder = Path()
        self.logits_from = 0
        self.shard_errors: dict[str, dict[int, float]] = {}
        ranks = sorted(rpc(rank_attach, args=(layout,)))
        if ranks != list(range(layout.ranks)):
            raise RuntimeError(f"trace: the engine's workers answered as ranks {ranks}, not 0-{layout.ranks - 1}")

    def begin(self, writer: Any, positions: int, only: list[str] | None = None, keep: tuple[str, ...] = (),
              logits_from: int = 0) -> None:
        self.writer, self.logits_from, self.shard_errors = writer, logits_from, {}
        self.folder = writer.path.with_name(f".{writer.path.stem}.ranks")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pending = (positions, only, logits_from)

    def start(self, source: str | None) -> None:
        """Every rank's capture (and layer forcing, from the reference's trace `source`) begins."""
        positions, only, logits_from = self.pending
        self.rpc(rank_begin, args=(str(self.folder), positions, only, logits_from, source))

    def logits(self) -> None:
        self.rpc(rank_logits, args=(self.logits_from,))

    def end(self, trace: Path, metadata: dict[str, str]) -> Path | None:
        """Every rank's file joined into the pass's writer; the chosen experts' table from rank 0 (the router is
        copied to every rank)."""
        ends = sorted(self.rpc(rank_end, args=(str(trace), metadata)), key=lambda e: e["rank"])
        try:
            files = [Trace(e["path"]) for e in ends]
            for point in ends[0]["points"]:
                self._join(point, files)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
        return Path(ends[0]["routes"]) if ends[0]["routes"] else None

    def _join(self, point: str, files: list[Trace]) -> None:
        name = parse(point)[1]
        holders = self.layout.holders(name) if name in SHARDED_POINTS and point in files[-1].tensors else [0]
        first, end = files[0].span(point)
        widths = [files[rank].shape(point)[1] for rank in holders]
        reference = getattr(self.writer, "reference", None)  # a ComparingWriter holds the reference's trace
        compared = len(holders) > 1 and reference is not None and point in reference.tensors
        sums = np.zeros((len(holders), 2))
        for start, stop in row_chunks(end - first, sum(widths)):
            parts = [files[rank].rows(point, first + start, first + stop) for rank in holders]
            rows = np.concatenate(parts, axis=1)
            if reference is not None and compared:
                sums += _shard_sums(parts, reference.rows(point, first + start, first + stop))
            self.writer.append(point, _tensor(rows))
        if compared:
            self.shard_errors[point] = {rank: float(np.sqrt(d / r)) if r > 0 else float(d > 0)
                                        for rank, (d, r) in zip(holders, sums, strict=True)}

    def metadata(self) -> dict[str, str]:
        """What the trace says of its ranks: the layout, and each split point's error per rank."""
        errors = {point: {str(rank): error for rank, error in by_rank.items()}
                  for point, by_rank in self.shard_errors.items()}
        return {"tensor_parallel": json.dumps(self.layout.as_dict()), "shard_errors": json.dumps(errors)}

    def abort(self) -> None:
        self.rpc(rank_abort)
        shutil.rmtree(self.folder, ignore_errors=True)

    def close(self) -> None:
        self.rpc(rank_close)


class ShardedForcing:
    """The LayerInputs interface run_traces drives: forcing begins with every rank's capture (ShardedCapture.start)
    and ends with its logits, so begin() only names the reference's trace."""

    def __init__(self, capture: ShardedCapture):
        self.capture = capture
        self.source: str | None = None

    def begin(self, source: Path) -> None:
        self.source = str(source)

    def end(self) -> None:
        self.source = None


def _shard_sums(parts: list[np.ndarray], reference: np.ndarray) -> np.ndarray:
    """Per shard: the squared difference from the reference's columns of that shard, and the reference's squares."""
    sums, column = [], 0
    for part in parts:
        ref = reference[:, column:column + part.shape[1]]
        column += part.shape[1]
        sums.append((float(np.square(part - ref).sum()), float(np.square(ref).sum())))
    return np.array(sums)


def _tensor(rows: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(rows))
