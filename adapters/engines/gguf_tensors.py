"""What a GGUF file really holds: its tensors' types, by share of the weights.

A variant's name says what was asked of llama.cpp's quantiser, not what it wrote: the k-quants (Q4_K, Q6_K) need rows
of a multiple of 256 values, so where a model's rows are 576 wide (SmolLM2) or 640 (Gemma 3 270M) the quantiser writes
Q5_0 or Q8_0 instead and says so only in its log. This reads the tensor table of the file itself (the GGUF header:
its metadata values are skipped, its tensors never loaded) and the quantiser's log kept beside a built variant.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from functools import lru_cache
from pathlib import Path

# GGUF metadata value types: fixed sizes; 8 is a string, 9 an array (element type, count, elements)
FIXED_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
FALLBACK = re.compile(r"(\d+) of (\d+) tensor\(s\) required fallback quantization")
REASON = re.compile(r"ncols\s+(\d+) not divisible by (\d+) \(required for type\s+(\w+)\) -> falling back to\s+(\w+)")


class _Header:
    """A cursor over a GGUF file's header."""

    def __init__(self, data: mmap.mmap):
        self.data, self.at = data, 0

    def read(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.read("Q")
        self.at += size
        return bytes(self.data[self.at - size:self.at]).decode(errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind == STRING:
            size = self.read("Q")  # read first: `self.at += self.read(...)` would add to the position before it
            self.at += size
        elif kind == ARRAY:
            element, count = self.read("I"), self.read("Q")
            if element in FIXED_SIZE:
                self.at += FIXED_SIZE[element] * count
            else:
                for _ in range(count):
                    self.skip_value(element)
        elif kind in FIXED_SIZE:
            self.at += FIXED_SIZE[kind]
        else:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.at}")


def tensor_types(path: Path) -> Counter[str]:
    """Tensor type name (F32, Q4_K, ...) -> how many weights of the file are stored in it."""
    from gguf import GGMLQuantizationType

    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        header = _Header(data)
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        header.at = 8  # magic, version
        tensors, values = header.read("Q"), header.read("Q")
        for _ in range(values):
            header.string()
            header.skip_value(header.read("I"))
        weights: Counter[str] = Counter()
        for _ in range(tensors):
            header.string()
            count = 1
            for _ in range(header.read("I")):
                count *= header.read("Q")
            kind = header.read("I")
            header.read("Q")  # offset
            weights[GGMLQuantizationType(kind).name] += count
    return weights


def _share(part: int, total: int) -> str:
    share = 100.0 * part / total
    return "<0.1%" if share < 0.05 else f"{share:.1f}%"


def fallbacks(log: Path) -> str:
    """What llama.cpp's quantiser wrote instead of what was asked, from its log ('' if nothing fell back)."""
    if not log.exists():
        return ""
    text = log.read_text(errors="replace")
    counted = FALLBACK.search(text)
    if not counted:
        return ""
    found = REASON.findall(text)
    swaps = " and ".join(sorted({f"{asked} -> {got}" for _, _, asked, got in found}))
    widths = " or ".join(str(w) for w in sorted({int(cols) for cols, _, _, _ in found}))
    blocks = " or ".join(sorted({block for _, block, _, _ in found}))
    return (f"{counted.group(1)} of {counted.group(2)} tensors fell back ({swaps}): their rows are {widths} wide, "
            f"not a multiple of {blocks}")


@lru_cache(maxsize=32)
def describe(path: Path) -> str:
    """The file's tensor types by share of its weights, largest first, and what fell back (a built variant's
    quantiser log sits beside it as <variant>.quantize.log)."""
    weights = tensor_types(path)
    total = sum(weights.values())
    mix = ", ".join(f"{name} {_share(count, total)}" for name, count in weights.most_common())
    fell = fallbacks(path.with_suffix(".quantize.log"))
    size = f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total:,}"
    return f"{mix} of {size} weights" + (f"; {fell}" if fell else "")
