"""Stream captured tensors to one safetensors file per traced case, without holding them in memory.

Each tensor is appended to a data file the moment a hook captures it; close() writes the safetensors header
(whose offsets are only known at the end) and copies the data behind it in chunks, then renames the result into
place, so a reader never sees half a trace. The format is the documented safetensors layout: an 8-byte
little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw bytes.
"""

from __future__ import annotations

import json
import os
import shutil
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
        self.header: dict[str, Any] = {}
        self.offset = 0
        self.nonfinite: dict[str, int] = {}

    def add(self, name: str, tensor: Any) -> None:
        """Append one [positions, width] tensor (any float dtype, any device) under a canonical point name."""
        import torch

        if name in self.header:
            raise ValueError(f"capture point {name} captured twice in one pass")
        stored = tensor.detach().to(device="cpu", dtype=self.store_dtype).contiguous()
        bad = int((~torch.isfinite(stored)).sum())
        if bad:
            self.nonfinite[name] = bad
        array = stored.numpy()
        self.data.write(memoryview(array).cast("B"))
        end = self.offset + array.nbytes
        self.header[name] = {"dtype": SAFETENSORS_DTYPE[str(array.dtype)], "shape": list(array.shape),
                             "data_offsets": [self.offset, end]}
        self.offset = end

    def close(self, metadata: dict[str, str]) -> list[str]:
        """Write the safetensors file; returns the captured point names in capture order."""
        self.data.close()
        header = json.dumps({"__metadata__": metadata, **self.header}, separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)  # the data section starts 8-byte aligned
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "wb") as out, open(self.data_path, "rb") as data:
            out.write(struct.pack("<Q", len(header)))
            out.write(header)
            shutil.copyfileobj(data, out, length=8 << 20)
        os.replace(tmp, self.path)
        self.data_path.unlink()
        return list(self.header)

    def discard(self) -> None:
        """Drop a half-captured trace (the pass failed)."""
        self.data.close()
        self.data_path.unlink(missing_ok=True)
