"""Whether two engines' logprobs measure the same thing on a case. An engine returns raw logprobs (the model's
distribution) or processed ones (after its sampler's penalties, temperature and truncation), or even logits
(adapters.contract.LogprobMeaning). Where a case's params change the distribution, a raw logprob and a processed one
differ by what they mean, not by numerics: that difference is said as such and not judged as drift."""

from __future__ import annotations

from adapters.contract import LogprobMeaning
from harness.core.vocabulary import CONSTRAINTS, NEUTRAL, PENALTIES, TRUNCATION, SamplingParams

LOGPROBS = ("raw_logprobs", "processed_logprobs")


def processing(params: SamplingParams) -> list[str]:
    """What of a case's params a sampler applies to the logits before it picks (each as `name=value`): penalties,
    bans and biases, the minimum length, and where it samples, temperature and truncation."""
    applied = [*PENALTIES, *CONSTRAINTS, "min_new_tokens"]
    if not params.greedy:
        applied += ["temperature", *TRUNCATION]
    return [name if name == "constraint" else f"{name}={value}" for name in applied
            if (value := getattr(params, name)) is not None and value != NEUTRAL.get(name) and value not in ({}, [])]


def kinds_apart(reference: str, ref_meaning: LogprobMeaning, engine: str, meaning: LogprobMeaning,
                params: SamplingParams) -> str:
    """Why the two engines' logprobs on this case are not the same quantity ('' where they are, or where either
    engine does not say what it returns)."""
    kinds = {ref_meaning.kind, meaning.kind}
    if "unknown" in kinds or len(kinds) == 1:
        return ""
    said = f"{engine} returns {meaning.kind}, {reference} {ref_meaning.kind} (`parity params` says how each)"
    if not kinds <= set(LOGPROBS):
        return f"logprobs differ in kind, not numerics: {said}; logits are no logprobs, so they are not compared"
    applied = processing(params)
    if not applied:
        return ""  # nothing processes the logits here: raw and processed are the same numbers
    return (f"logprobs differ in kind, not numerics: {said}, and this case's {', '.join(applied)} make raw and "
            "processed differ, so the logprob difference is not judged as drift")
