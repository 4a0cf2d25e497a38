"""Stream captured tensors to one safetensors file per traced case, without holding them in memory.

Each tensor, or each chunk of rows of one (an engine that computes a point a chunk of positions at a time: chunked
prefill, logits computed in slices), is copied the moment a hook captures it and appended to a data file by a thread
(adapters.tracing.background_file) while the engine computes on, behind room kept for
the safetensors header (whose offsets are only known at the end). close() writes the header into that room, padded
with spaces, when every point's chunks lie one after another in the file (a pass without chunked prefill: no byte is
copied); otherwise it copies each point's chunks behind a new header in order. The result is renamed into place, so
a reader never sees half a trace. The format is the documented safetensors layout: an 8-byte little-endian header
length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from adapters.tracing.background_file import BackgroundFile

SAFETENSORS_DTYPE = {"float32": "F32", "float64": "F64"}
HEADER_ROOM = 1 << 20  # bytes kept for the header before the data (about 100 bytes a point: ~10,000 points)


class TraceWriter:
    def __init__(self, path: Path, store_dtype: Any):
        """store_dtype: the torch dtype tensors are stored in (float32, or float64 for a float64 model)."""
        self.path, self.store_dtype = path, store_dtype
        self.data_path = path.with_name(f".{path.name}.data")
        self.data = BackgroundFile(self.data_path, 8 + HEADER_ROOM)
        self.chunks: dict[str, list[tuple[int, int]]] = {}  # point -> (offset, bytes) of its chunks in the data file
        self.shapes: dict[str, list[int]] = {}
        self.dtypes: dict[str, str] = {}
        self.complete: set[str] = set()
        self.offset = 0
        self.nonfinite: dict[str, int] = {}

    def add(self, name: str, tensor: Any) -> None:
        """Append one whole [positions, width] tensor (any float dtype, any device) under a canonical point name."""
        if name in self.chunks:
            raise ValueError(f"capture point {name} captured twice in one pass")
        self.append(name, tensor)
        self.complete.add(name)

    def append(self, name: str, rows: Any) -> None:
        """Append rows [n, width] to a point, after the rows appended to it before (chunks of one point may come
        between other points' chunks)."""
        import torch

        if name in self.complete:
            raise ValueError(f"capture point {name} captured twice in one pass")
        stored = torch.empty(rows.shape, dtype=self.store_dtype)  # a copy: the engine may reuse its buffer
        stored.copy_(rows.detach())
        self.count_nonfinite(name, stored)
        array = stored.numpy()
        shape = self.shapes.setdefault(name, [0, *array.shape[1:]])
        if list(array.shape[1:]) != shape[1:]:
            raise ValueError(f"capture point {name}: a chunk of width {list(array.shape[1:])} after {shape[1:]}")
        self.data.write(array)
        self.chunks.setdefault(name, []).append((self.offset, array.nbytes))
        self.dtypes[name] = SAFETENSORS_DTYPE[str(array.dtype)]
        shape[0] += array.shape[0]
        self.offset += array.nbytes

    def count_nonfinite(self, name: str, rows: Any) -> None:
        """Count a point's inf and NaN values (rows: a torch tensor), whether or not its rows are stored."""
        import torch

        if not torch.isfinite(rows.sum()):  # a cheap pass: an inf or NaN (or a sum past float32's range) shows
            bad = int((~torch.isfinite(rows)).sum())
            if bad:
                self.nonfinite[name] = self.nonfinite.get(name, 0) + bad

    def rows(self, name: str) -> int:
        """Rows captured so far for a point (0 if none)."""
        return self.shapes[name][0] if name in self.shapes else 0

    def close(self, metadata: dict[str, str]) -> list[str]:
        """Write the safetensors file; returns the captured point names in capture order."""
        spans = {name: _span(chunks) for name, chunks in self.chunks.items()}
        in_place = _header(metadata, {name: self._entry(name, span) for name, span in spans.items()
                                      if span is not None})
        data = self.data.finish()
        if None not in spans.values() and len(in_place) <= HEADER_ROOM:
            data.seek(0)
            data.write(struct.pack("<Q", HEADER_ROOM) + in_place.ljust(HEADER_ROOM))
            data.close()
            os.replace(self.data_path, self.path)
            return list(self.chunks)
        data.close()
        self._copy_behind_header(metadata)
        return list(self.chunks)

    def _entry(self, name: str, span: tuple[int, int]) -> dict[str, Any]:
        return {"dtype": self.dtypes[name], "shape": self.shapes[name], "data_offsets": list(span)}

    def _copy_behind_header(self, metadata: dict[str, str]) -> None:
        """Points whose chunks are interleaved in the data file: copied in order behind a header of their own."""
        entries, start = {}, 0
        for name, chunks in self.chunks.items():
            end = start + sum(size for _, size in chunks)
            entries[name] = self._entry(name, (start, end))
            start = end
        encoded = _header(metadata, entries)
        encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "wb") as out, open(self.data_path, "rb") as data:
            out.write(struct.pack("<Q", len(encoded)))
            out.write(encoded)
            for chunks in self.chunks.values():
                for offset, size in chunks:
                    data.seek(8 + HEADER_ROOM + offset)
                    _copy(data, out, size)
        os.replace(tmp, self.path)
        self.data_path.unlink()

    def discard(self) -> None:
        """Drop a half-captured trace (the pass failed)."""
        with contextlib.suppress(Exception):  # a failed write was raised already: it is why the trace is dropped
            self.data.finish().close()
        self.data_path.unlink(missing_ok=True)


def _span(chunks: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(start, end) of a point's bytes in the data section, or None where other points' chunks lie between them."""
    end = chunks[0][0]
    for offset, size in chunks:
        if offset != end:
            return None
        end += size
    return chunks[0][0], end


def _header(metadata: dict[str, str], entries: dict[str, dict[str, Any]]) -> bytes:
    return json.dumps({"__metadata__": metadata, **entries}, separators=(",", ":")).encode()


def _copy(source, target, size: int, block: int = 8 << 20) -> None:
    """Copy `size` bytes from source's position to target, a block at a time."""
    while size > 0:
        chunk = source.read(min(block, size))
        if not chunk:
            raise OSError("trace data file ended early")
        target.write(chunk)
        size -= len(chunk)
