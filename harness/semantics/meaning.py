"""Plain-words knowledge about sampling params whose meaning differs between engines or between each other."""

from __future__ import annotations

from harness.core.vocabulary import PENALTIES, SamplingParams, meaning


def param_differences(reference: SamplingParams, other: SamplingParams) -> dict[str, tuple]:
    """Canonical params that differ between two engines' requests: name -> (reference value, other value)."""
    ref, oth = reference.model_dump(), other.model_dump()
    differ = {k: (ref[k], oth[k]) for k in ref if ref[k] != oth[k]}
    if "constraint" in differ:  # in words, not its model dump
        differ["constraint"] = tuple(p.constraint.described() if p.constraint else None for p in (reference, other))
    return differ


def explain_differences(differences: dict[str, tuple]) -> str:
    """One sentence naming the differing params and, for penalties, why they are not interchangeable."""
    if not differences:
        return ""
    shown = "; ".join(f"{k}: {_fmt(a)} vs {_fmt(b)}" for k, (a, b) in differences.items())
    text = f"the engines were given different sampling params ({shown})"
    penalties = [k for k in PENALTIES if k in differences]
    if len(penalties) >= 2:
        text += (". These penalties have different semantics, so the same number does not mean the same thing: "
                 + "; ".join(meaning(k) for k in penalties))
    elif penalties:
        text += f". {meaning(penalties[0])}"
    return text


def _fmt(value) -> str:
    return "unset" if value is None else str(value)
