"""A GGUF file's header read in place (mmap): its metadata values and its tensor table, never its tensors' data.

gguf's own GGUFReader builds a numpy view for every element of every array it meets: on Gemma 3's file, with its
262,144-token vocabulary, that is 12 s of CPU before the first key can be read (and minutes under a profiler). Here a
value nobody asked for is skipped by its size.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Collection
from pathlib import Path
from typing import NamedTuple

# GGUF metadata value types: fixed sizes with their struct formats; 8 is a string, 9 an array (type, count, elements)
FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
FIXED_SIZE = {kind: struct.calcsize("<" + fmt) for kind, fmt in FORMATS.items()}
STRING, ARRAY = 8, 9


class Header:
    """A cursor over a GGUF file's header."""

    def __init__(self, data: mmap.mmap):
        self.data, self.at = data, 0

    def read(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        size = self.read("Q")
        self.at += size
        return bytes(self.data[self.at - size:self.at]).decode(errors="replace")

    def value(self, kind: int) -> object:
        """A metadata value: a number or bool, a string, or a list of them."""
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            element, count = self.read("I"), self.read("Q")
            if element in FORMATS:
                values = struct.unpack_from(f"<{count}{FORMATS[element]}", self.data, self.at)
                self.at += FIXED_SIZE[element] * count
                return list(values)
            return [self.value(element) for _ in range(count)]
        if kind in FORMATS:
            return self.read(FORMATS[kind])
        raise ValueError(f"unknown GGUF value type {kind} at byte {self.at}")

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


class Value(NamedTuple):
    types: tuple[int, ...]  # the value's type, and for an array its elements' type
    value: object


class TensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dimension first
    kind: int  # a GGMLQuantizationType value
    offset: int  # where its data starts in the file, in bytes


def read(path: Path, keys: Collection[str] | None = None) -> tuple[dict[str, Value], list[TensorInfo]]:
    """The named metadata values (every one when keys is None; absent keys left out; the others are skipped, not
    read) and the tensor table."""
    found: dict[str, Value] = {}
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        cursor = Header(data)
        cursor.at = 8  # magic, version
        tensors, values = cursor.read("Q"), cursor.read("Q")
        alignment = 32  # the data section's, unless general.alignment says otherwise
        for _ in range(values):
            key, kind = cursor.string(), cursor.read("I")
            if keys is not None and key not in keys and key != "general.alignment":
                cursor.skip_value(kind)
                continue
            types = (kind, struct.unpack_from("<I", data, cursor.at)[0]) if kind == ARRAY else (kind,)
            value = cursor.value(kind)
            if key == "general.alignment":
                alignment = int(value)
            if keys is None or key in keys:
                found[key] = Value(types, value)
        table = []
        for _ in range(tensors):
            name = cursor.string()
            shape = tuple(cursor.read("Q") for _ in range(cursor.read("I")))
            table.append((name, shape, cursor.read("I"), cursor.read("Q")))
        start = -(-cursor.at // alignment) * alignment
    return found, [TensorInfo(name, shape, kind, start + offset) for name, shape, kind, offset in table]


def metadata(path: Path, keys: Collection[str]) -> dict[str, object]:
    """The named metadata values of a GGUF file (absent keys left out)."""
    return {key: found.value for key, found in read(path, keys)[0].items()}
