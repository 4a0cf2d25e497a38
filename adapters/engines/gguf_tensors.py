"""What a GGUF file really holds: its tensors' types, by share of the weights.

A variant's name says what was asked of llama.cpp's quantiser, not what it wrote: the k-quants (Q4_K, Q6_K) need rows
of a multiple of 256 values, so where a model's rows are 576 wide (SmolLM2) or 640 (Gemma 3 270M) the quantiser writes
Q5_0 or Q8_0 instead and says so only in its log. This reads the tensor table of the file itself (the GGUF header:
its metadata values are skipped, its tensors never loaded) and the quantiser's log kept beside a built variant.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

from harness.models.gguf_header import read

FALLBACK = re.compile(r"(\d+) of (\d+) tensor\(s\) required fallback quantization")
REASON = re.compile(r"ncols\s+(\d+) not divisible by (\d+) \(required for type\s+(\w+)\) -> falling back to\s+(\w+)")


def tensor_types(path: Path) -> Counter[str]:
    """Tensor type name (F32, Q4_K, ...) -> how many weights of the file are stored in it."""
    from gguf import GGMLQuantizationType

    weights: Counter[str] = Counter()
    for tensor in read(path, keys=())[1]:
        weights[GGMLQuantizationType(tensor.kind).name] += math.prod(tensor.shape)
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
