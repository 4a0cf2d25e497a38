"""Stream captured tensors to one safetensors file per traced case, without holding them in memory.

Each tensor, or each chunk of rows of one (an engine that computes a point a chunk of positions at a time: chunked
prefill, logits computed in slices), is appended to a data file the moment a hook captures it; close() writes the
safetensors header (whose offsets are only known at the end) and copies each point's chunks behind it in order,
then renames the result into place, so a reader never sees half a trace. The format is the documented safetensors
layout: an 8-byte little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw
bytes.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

SAFETENSORS_DTYPE = {"float32": "F32", "float64": "F64"}


class TraceWriter:
    def __init__(self, path: Path, store_dtype: Any):
        """store_dtype: the torch dtype tensors are stored in (float32, or float64 for a float64 model)."""
        self.path, self.store_dtype = path, store_dtype
        self.data_path = path.with_name(f".{path.name}.data")
        self.data = open(self.data_path, "wb")
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
        stored = rows.detach().to(device="cpu", dtype=self.store_dtype).contiguous()
        bad = int((~torch.isfinite(stored)).sum())
        if bad:
            self.nonfinite[name] = self.nonfinite.get(name, 0) + bad
        array = stored.numpy()
        shape = self.shapes.setdefault(name, [0, *array.shape[1:]])
        if list(array.shape[1:]) != shape[1:]:
            raise ValueError(f"capture point {name}: a chunk of width {list(array.shape[1:])} after {shape[1:]}")
        self.data.write(memoryview(array).cast("B"))
        self.chunks.setdefault(name, []).append((self.offset, array.nbytes))
        self.dtypes[name] = SAFETENSORS_DTYPE[str(array.dtype)]
        shape[0] += array.shape[0]
        self.offset += array.nbytes

    def rows(self, name: str) -> int:
        """Rows captured so far for a point (0 if none)."""
        return self.shapes[name][0] if name in self.shapes else 0

    def close(self, metadata: dict[str, str]) -> list[str]:
        """Write the safetensors file; returns the captured point names in capture order."""
        self.data.close()
        header, start = {}, 0
        for name, chunks in self.chunks.items():
            end = start + sum(size for _, size in chunks)
            header[name] = {"dtype": self.dtypes[name], "shape": self.shapes[name], "data_offsets": [start, end]}
            start = end
        encoded = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "wb") as out, open(self.data_path, "rb") as data:
            out.write(struct.pack("<Q", len(encoded)))
            out.write(encoded)
            for chunks in self.chunks.values():
                for offset, size in chunks:
                    data.seek(offset)
                    _copy(data, out, size)
        os.replace(tmp, self.path)
        self.data_path.unlink()
        return list(self.chunks)

    def discard(self) -> None:
        """Drop a half-captured trace (the pass failed)."""
        self.data.close()
        self.data_path.unlink(missing_ok=True)


def _copy(source, target, size: int, block: int = 8 << 20) -> None:
    """Copy `size` bytes from source's position to target, a block at a time."""
    while size > 0:
        chunk = source.read(min(block, size))
        if not chunk:
            raise OSError("trace data file ended early")
        target.write(chunk)
        size -= len(chunk)
