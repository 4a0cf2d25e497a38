"""One check shared by every engine: did the engine emit a token other than its own top-1?

Engines report the raw (pre-temperature, pre-penalty) logprobs of the top-k tokens at each step next to the token
they emitted. Emitting another token than the raw top-1 means the token was chosen after the logits:
  - at a greedy step, by penalties or sampler semantics, not by numerics (a verdict must say so);
  - at a step where the engine's own distribution after temperature puts the top token at probability
    >= 1 - 1e-6 and no penalty applies, by a sampler that misbehaved: `hazard: silent wrong token` (fp16 logits
    divided by a tiny temperature overflow, and lmdeploy's CUDA sampling kernel then returns its first candidate
    instead of raising). Such a case fails whatever the scenario expects of its tokens.
Exact ties (within TIE) are not counted: engines break them differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.core.types import Result

TIE = 1e-5  # nats: a chosen token this close to the top logprob was picked by the logits alone
CERTAIN = 1.0 - 1e-6  # the top token's probability above which emitting another one is a hazard
VOCAB_BOUND = 1e6  # tokens outside the reported top-k, counted at the k-th logprob each (an upper bound)


@dataclass(frozen=True)
class OffTop1:
    step: int
    emitted: int
    top1: int
    margin: float  # raw top-1 logprob minus the emitted token's
    top_probability: float  # the top token's probability after temperature (a lower bound from the top-k)
    certain: bool  # top_probability >= CERTAIN


def top_probability(top_logprobs: np.ndarray, temperature: float) -> np.ndarray:
    """Lower bound of the top token's probability after temperature, per step, from [steps, k] raw top-k logprobs
    (the tokens outside the top-k are counted as if each had the k-th logprob)."""
    gaps = (top_logprobs - top_logprobs[:, :1]) / max(temperature, 1e-12)  # <= 0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        rest = np.exp(gaps[:, 1:]).sum(axis=1) + VOCAB_BOUND * np.exp(gaps[:, -1])
    return 1.0 / (1.0 + np.nan_to_num(rest, nan=np.inf))


def off_top1(result: Result, temperature: float | None) -> list[OffTop1]:
    """Steps where the emitted token is not the engine's own raw top-1 (ties excluded). temperature None means
    greedy decoding (any such step is certain)."""
    n = min(len(result.token_ids), len(result.chosen_logprobs), len(result.top_logprobs))
    steps = [i for i in range(n) if len(result.top_logprobs[i]) >= 1 and len(result.top_ids[i]) >= 1]
    if not steps:
        return []
    k = min(len(result.top_logprobs[i]) for i in steps)
    top = np.array([result.top_logprobs[i][:k] for i in steps], dtype=float)
    chosen = np.array([result.chosen_logprobs[i] for i in steps], dtype=float)
    off = chosen < top[:, 0] - TIE
    if not off.any():
        return []
    probability = np.ones(len(steps)) if temperature is None else top_probability(top, temperature)
    found = []
    for j in np.flatnonzero(off):
        i = steps[j]
        found.append(OffTop1(i, result.token_ids[i], result.top_ids[i][0], float(top[j, 0] - chosen[j]),
                             float(probability[j]), bool(probability[j] >= CERTAIN)))
    return found
