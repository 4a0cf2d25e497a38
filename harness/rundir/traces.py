"""Reading the trace files engines write into a run directory (engines/<name>/traces/*.safetensors, written by
adapters.tracing.writer): one [positions, width] tensor per canonical capture point, read a chunk of rows at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core.points import ordered

CHUNK_BYTES = 64 << 20  # float64 bytes of one side's rows compared at once: a 262k-vocabulary logits tensor of
# 1,500 positions is 3.1 GB in float64, so points are read and compared in row chunks of at most this size


NUMPY_DTYPE = {"F32": np.float32, "F64": np.float64, "F16": np.float16}
METRICS = ("max_abs", "rel_l2", "cosine", "rel_diff")


def position_metrics(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row metrics of two [positions, width] arrays. Row sums by einsum, which makes no [positions, width]
    temporaries (half the time of x * x, y * y ... on Gemma 3's 690 x 2048 rows); rel_diff as sum((x-y)^2) /
    sum(x^2 + y^2), which is 1 - 2 sum(xy) / sum(x^2 + y^2) without its cancellation (that form loses all digits
    below the rounding unit, where traces of one dtype differ)."""
    tiny = np.finfo(np.float64).tiny
    diff = y - x
    xx, yy, xy, dd = (np.einsum("ij,ij->i", a, b) for a, b in ((x, x), (y, y), (x, y), (diff, diff)))
    with np.errstate(all="ignore"):
        return {"max_abs": np.maximum(diff.max(axis=1), -diff.min(axis=1)),
                "rel_l2": np.sqrt(dd) / np.sqrt(np.maximum(xx, tiny)),
                "cosine": xy / np.sqrt(np.maximum(xx * yy, tiny)),
                "rel_diff": dd / np.maximum(xx + yy, tiny)}



class Trace:
    """Lazy reader of a trace file (the safetensors layout: an 8-byte header length, a JSON header, raw row-major
    data). Rows are read with positioned reads into fresh buffers, a point and a chunk of rows at a time, never
    memory-mapped: comparing 400 points, or one logits tensor of a huge vocabulary, holds one chunk, not the file.

    Positions are those of the token sequence. Every point has a row per position except the logits, which start
    at the metadata's logits_from (the prompt's last position, whose logits choose the first generated token): the
    logits of the prompt's other positions predict tokens nobody sampled, and at a 262k vocabulary they would be
    most of a trace's cost (1 MB a row)."""

    def __init__(self, path: str | Path):
        import json
        import struct

        self.path = Path(path)
        with open(self.path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        self.data_start = 8 + length
        self.metadata = header.pop("__metadata__", None) or {}
        self.tensors = header
        self.points = ordered(list(header))

    def shape(self, point: str) -> tuple[int, int]:
        rows, width = self.tensors[point]["shape"]
        return int(rows), int(width)

    def first(self, point: str) -> int:
        """The position of a point's first row."""
        return int(self.metadata.get("logits_from", 0)) if point == "logits" else 0

    def span(self, point: str) -> tuple[int, int]:
        """(first, end) positions a point has rows for."""
        return self.first(point), self.first(point) + self.shape(point)[0]

    def rows(self, point: str, start: int, stop: int, width: int | None = None) -> np.ndarray:
        """The rows of positions start..stop of a point (its first `width` columns when given), in float64."""
        entry = self.tensors[point]
        dtype = np.dtype(NUMPY_DTYPE[entry["dtype"]])
        full_width = int(entry["shape"][1])
        first = self.first(point)
        if start < first:
            raise ValueError(f"{self.path.name}: {point} starts at position {first}, not {start}")
        start, stop = start - first, min(stop - first, int(entry["shape"][0]))
        buffer = np.empty((max(0, stop - start), full_width), dtype=dtype)
        with open(self.path, "rb") as file:
            file.seek(self.data_start + entry["data_offsets"][0] + start * full_width * dtype.itemsize)
            file.readinto(memoryview(buffer).cast("B"))
        block = buffer if width is None else buffer[:, :width]
        return block.astype(np.float64, copy=False)

    @property
    def fused(self) -> set[str]:
        return set(filter(None, self.metadata.get("fused", "").split(",")))


def row_chunks(rows: int, width: int, budget: int | None = None) -> list[tuple[int, int]]:
    """(start, stop) row ranges covering `rows`, each holding at most `budget` float64 bytes (CHUNK_BYTES unless
    given; at least one row)."""
    step = max(1, (budget or CHUNK_BYTES) // max(1, width * 8))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def trace_file_name(case_id: str) -> str:
    """The file a case's trace is written to, in an engine's traces folder."""
    import re

    return f"{re.sub(r'[^A-Za-z0-9_.=,-]+', '_', case_id)}.safetensors"


def write_arrays(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """A trace-layout file (safetensors) of [rows, width] float32/float64 arrays, written whole and renamed into
    place: the per-position metrics of a compared pass, the rows a pruned trace keeps."""
    import json
    import os
    import struct

    names = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, array in arrays.items():
        header[name] = {"dtype": names[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        for array in arrays.values():
            file.write(np.ascontiguousarray(array).tobytes())
    os.replace(tmp, path)
