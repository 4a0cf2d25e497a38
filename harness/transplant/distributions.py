"""Compare what engines' samplers made of identical logits, step by step, and say why they disagree.

Each step's processed scores become the distribution the engine draws from: softmax of the scores when it samples,
a point mass on the argmax when it decodes greedily. Per step: total variation, KL(reference || engine), the number
of tokens each keeps (finite scores) and both argmaxes. Knows nothing about engines.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

AGREE_TV = 1e-3  # total variation below this is float noise, not a different sampler


def distributions(scores: np.ndarray, sampling: list[bool]) -> np.ndarray:
    """[steps, vocab] processed scores -> [steps, vocab] probabilities (one-hot argmax on greedy steps)."""
    scores = scores.astype(np.float64)
    with np.errstate(all="ignore"):
        shifted = scores - np.nanmax(np.where(np.isfinite(scores), scores, -np.inf), axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
    greedy = ~np.asarray(sampling, dtype=bool)
    if greedy.any():
        one_hot = np.zeros_like(probs[greedy])
        one_hot[np.arange(one_hot.shape[0]), np.nanargmax(scores[greedy], axis=1)] = 1.0
        probs[greedy] = one_hot
    return probs


def step_metrics(ref: np.ndarray, other: np.ndarray, ref_scores: np.ndarray, other_scores: np.ndarray) -> pd.DataFrame:
    steps = min(len(ref), len(other))
    p, q = ref[:steps], other[:steps]
    with np.errstate(all="ignore"):
        kl = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0).sum(axis=1)
    return pd.DataFrame({
        "step": np.arange(steps), "tv": 0.5 * np.abs(p - q).sum(axis=1), "kl": kl,
        "kept_ref": np.isfinite(ref_scores[:steps]).sum(axis=1),
        "kept_engine": np.isfinite(other_scores[:steps]).sum(axis=1),
        "argmax_ref": np.nanargmax(np.where(np.isfinite(ref_scores[:steps]), ref_scores[:steps], -np.inf), axis=1),
        "argmax_engine": np.nanargmax(np.where(np.isfinite(other_scores[:steps]), other_scores[:steps], -np.inf),
                                      axis=1),
    })


def first_disagreement(metrics: pd.DataFrame) -> int | None:
    bad = metrics.index[~(metrics["tv"] <= AGREE_TV)]  # NaN (a poisoned distribution) counts as disagreement
    return int(metrics.loc[bad[0], "step"]) if len(bad) else None


class TransplantVerdict(BaseModel):
    case_id: str
    engine: str
    reference: str
    cause: str  # agree | sampler | hazard | error | rejected | unavailable
    verdict: str
    first_step: int | None = None
    max_tv: float | None = None
    params: list[str] = Field(default_factory=list)  # the params whose neutralising makes the samplers agree
    hazards: list[dict[str, Any]] = Field(default_factory=list)
