"""The top-k of a [steps, vocab] array of log-probabilities is what a stable argsort gives, ties and NaNs included."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.numeric import top_k_ids


def argsorted(values: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-values, axis=-1, kind="stable")[:, :k]


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_top_k_ids_equal_a_stable_argsort_on_rows_full_of_ties(k: int) -> None:
    rng = np.random.default_rng(k)
    values = rng.integers(-6, 0, size=(40, 300)).astype(np.float64)  # six distinct values: ties everywhere
    assert np.array_equal(top_k_ids(values, k), argsorted(values, k))


def test_top_k_ids_equal_a_stable_argsort_with_nans_and_infinities() -> None:
    values = np.array([[np.nan, -1.0, np.inf, -1.0, np.nan, -np.inf],
                       [np.nan, np.nan, np.nan, np.nan, -2.0, np.nan],
                       [-np.inf] * 6])
    for k in range(7):
        assert np.array_equal(top_k_ids(values, k), argsorted(values, k)), k


def test_top_k_ids_of_real_sized_logprobs() -> None:
    logits = np.random.default_rng(1).normal(size=(32, 49_152)).astype(np.float32)
    logprobs = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    assert np.array_equal(top_k_ids(logprobs, 5), argsorted(logprobs, 5))
