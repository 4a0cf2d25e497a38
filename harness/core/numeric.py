"""Numerics shared by the engines' adapters and the verdict rules."""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of [positions, vocab] logits, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top_k_ids(values: np.ndarray, k: int) -> np.ndarray:
    """Each row's k largest entries' ids, largest first, equal values in id order: what a stable argsort of -values
    gives, without sorting the whole vocabulary (that sort took 110 ms for 32 steps of a 49,152-token vocabulary,
    6% of a llama.cpp case). Only the entries at or above each row's k-th largest value are sorted."""
    k = min(k, values.shape[-1])
    kth = -np.partition(-values, k - 1, axis=-1)[:, k - 1] if k else np.full(len(values), np.inf)
    rows = []
    for row, threshold in zip(values, kth):
        candidates = np.flatnonzero(row >= threshold)  # ascending ids, every tie at the threshold included
        if len(candidates) < k:  # NaN entries compare false: sort the row whole, as argsort would
            candidates = np.arange(len(row))
        rows.append(candidates[np.argsort(-row[candidates], kind="stable")[:k]])
    return np.array(rows, dtype=np.intp).reshape(len(values), k)
