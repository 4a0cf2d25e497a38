"""Compare a traced pass with the reference's trace of the same sequence while it is captured, instead of writing it
whole and reading it back: each point's rows are held against the reference's rows of the same positions (read from
its trace file) as they arrive, and only the per-position metrics (harness.rundir.traces.position_metrics) and the
rows of the points asked to be kept are written. A Gemma 3 pass of 1,500 positions writes 1.45 GB of rows; compared
here it writes about a megabyte of metrics and whatever rows are kept.

The comparison runs in a thread of its own, so the engine computes the next point meanwhile; chunks in flight are
bounded. The metrics file has the trace layout (harness.rundir.traces.Trace reads it): per point a [positions, 4]
float64 tensor of METRICS, from the point's first position.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np

from adapters.tracing.writer import TraceWriter
from harness.rundir.traces import METRICS, Trace, position_metrics, write_arrays

IN_FLIGHT = 4  # chunks queued for comparison at most (the engine waits beyond that)
_DONE = object()


class ComparingWriter:
    """The TraceWriter interface (add, append, rows, nonfinite, close, discard), comparing instead of storing."""

    def __init__(self, path: Path, store_dtype: Any, against: Path, keep: set[str] | None):
        """path: where the kept rows go (a trace file holding only the kept points); its metrics go beside it as
        <name>.errors.safetensors. against: the reference's trace. keep: the points whose rows are written too
        (None: every point, a full trace)."""
        self.path, self.errors_path = path, path.with_name(path.name.replace(".safetensors", ".errors.safetensors"))
        self.reference = Trace(against)
        self.keep = keep
        self.kept = TraceWriter(path, store_dtype)
        self.metrics: dict[str, list[np.ndarray]] = {}
        self.done: dict[str, int] = {}  # rows received per point
        self.widths: dict[str, int] = {}
        self.notes: list[str] = []
        self.error: BaseException | None = None
        self.chunks: queue.Queue = queue.Queue(maxsize=IN_FLIGHT)
        self.thread = threading.Thread(target=self._compare_all, name="trace-compare", daemon=True)
        self.thread.start()

    @property
    def nonfinite(self) -> dict[str, int]:
        return self.kept.nonfinite

    def add(self, name: str, tensor: Any) -> None:
        if name in self.done:
            raise ValueError(f"capture point {name} captured twice in one pass")
        self.append(name, tensor)

    def append(self, name: str, rows: Any) -> None:
        import torch

        if self.error is not None:
            raise self.error
        copy = torch.empty(rows.shape, dtype=torch.float64)  # a copy: the engine may reuse its buffer
        copy.copy_(rows.detach())
        if self.keep is None or name in self.keep:
            self.kept.append(name, rows)
        else:
            self.kept.count_nonfinite(name, copy)
        start = self.done.get(name, 0)
        self.done[name] = start + rows.shape[0]
        self.chunks.put((name, start, copy.reshape(rows.shape[0], -1).numpy()))

    def rows(self, name: str) -> int:
        return self.done.get(name, 0)

    def _compare_all(self) -> None:
        while True:
            item = self.chunks.get()
            if item is _DONE:
                return
            if self.error is not None:
                continue  # drain: the engine raises the error at its next append or at close
            try:
                self._compare(*item)
            except BaseException as exc:  # raised on the engine's side
                self.error = exc

    def _compare(self, name: str, start: int, other: np.ndarray) -> None:
        reference = self.reference
        if name not in reference.tensors:
            if name not in self.metrics:
                self.notes.append(f"{name}: not in the reference's trace, not compared")
                self.metrics[name] = []
            return
        ref_width = reference.shape(name)[1]
        if name not in self.widths:
            if other.shape[1] != ref_width and name != "logits":
                raise ValueError(f"{name}: shapes differ ({reference.shape(name)} in the reference's trace, width "
                                 f"{other.shape[1]} here)")
            self.widths[name] = min(ref_width, other.shape[1])
            if self.widths[name] < max(ref_width, other.shape[1]):
                self.notes.append(f"{name}: compared over the {self.widths[name]} token ids both engines score "
                                  f"({ref_width} in the reference's trace, {other.shape[1]} here)")
        width = self.widths[name]
        first = reference.first(name)
        x = reference.rows(name, first + start, first + start + other.shape[0], width)
        if x.shape[0] != other.shape[0]:
            raise ValueError(f"{name}: rows past the reference's trace ({reference.span(name)})")
        metrics = position_metrics(x, other[:, :width])
        self.metrics.setdefault(name, []).append(np.stack([metrics[m] for m in METRICS], axis=1))

    def close(self, metadata: dict[str, str]) -> list[str]:
        """Write the metrics file and the kept rows' trace; returns every captured point name in capture order."""
        self._finish()
        arrays = {name: np.concatenate(chunks) for name, chunks in self.metrics.items() if chunks}
        notes = "; ".join(self.notes)
        write_arrays(self.errors_path, arrays, {**metadata, "metrics": ",".join(METRICS), "compare_notes": notes})
        self.kept.close({**metadata, "compare_notes": notes})
        return list(self.done)

    def _finish(self) -> None:
        self.chunks.put(_DONE)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def discard(self) -> None:
        self.error = self.error or RuntimeError("discarded")
        self.chunks.put(_DONE)
        self.thread.join()
        self.kept.discard()
        self.errors_path.unlink(missing_ok=True)
