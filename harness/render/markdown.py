"""Markdown pieces of summary.md, and the number formats every report shares."""

from __future__ import annotations

import math


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A pipe table, every cell on one line with its pipes escaped."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]]


def num(value, spec: str = ".2g") -> str:
    """A number, or "" where there is none (None, NaN)."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def step(value) -> str:
    """A step index, or "" where there is none (None, NaN, -1)."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) or value < 0 else str(int(value))


def yes_no(expected: bool) -> str:
    return "yes" if expected else "NO"


def some(items: list[str], shown: int = 8) -> str:
    """A list of ids, the first `shown` of them and how many more: a 1,024-case run stays one readable line."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more:,} more" if more > 0 else "")
