"""The diff on hand-built results: divergence step, deltas, top-k rule, ties (no engines)."""

from __future__ import annotations

import numpy as np

from harness.compare.diff import apply_ties, compare
from harness.core.types import Result


def result(engine: str, ids: list[int], chosen: list[float], tops: list[list[int]], top_lps: list[list[float]],
           prompt: tuple[int, ...] = (1, 2)) -> Result:
    return Result(case_id="c", engine=engine, status="ok", prompt_ids=list(prompt), token_ids=ids,
                  chosen_logprobs=chosen, top_ids=tops, top_logprobs=top_lps)


REF = result("ref", [5, 6, 7], [-0.1, -0.7, -0.2], [[5, 9], [6, 8], [7, 3]], [[-0.1, -2], [-0.7, -0.72], [-0.2, -3]])


def test_identical_is_match_with_deltas() -> None:
    other = result("x", [5, 6, 7], [-0.1, -0.75, -0.2], REF.top_ids, REF.top_logprobs)
    row = compare([REF], [other]).iloc[0]
    assert row.verdict == "match" and row.first_divergence == -1
    assert np.isclose(row.max_abs_logprob_delta, 0.05)


def test_runner_up_within_margin_is_benign_tie_else_diverged() -> None:
    other = result("x", [5, 8, 1], [-0.1, -0.69, -0.2], [[5, 9], [8, 6], [1, 2]],
                   [[-0.1, -2], [-0.69, -0.7], [-0.2, -1]])
    frame = compare([REF], [other])
    row = frame.iloc[0]
    assert row.verdict == "diverged" and row.first_divergence == 1 and row.tie_candidate
    assert np.isclose(row.ref_top2_margin, 0.02)
    assert row.ref_token == 6 and row.engine_token == 8
    assert apply_ties(frame.copy(), 0.05).iloc[0].verdict == "benign_tie"
    assert apply_ties(frame.copy(), 0.01).iloc[0].verdict == "diverged"


def test_a_token_tied_with_the_runner_up_is_one_whatever_its_place_in_the_list() -> None:
    """Three tokens tied at the top (bfloat16 logits come in steps of 1/8): the engine took the one the reference
    lists third. A third token below the runner-up stays a divergence, however wide the margin."""
    ref = result("ref", [5, 6], [-0.1, -1.0], [[5, 9, 2], [6, 8, 4]], [[-0.1, -2, -3], [-1.0, -1.0, -1.0]])
    tied = result("x", [5, 4], [-0.1, -0.9], [[5, 9, 2], [4, 6, 8]], [[-0.1, -2, -3], [-0.9, -1.0, -1.1]])
    frame = compare([ref], [tied])
    row = frame.iloc[0]
    assert row.tie_candidate and row.engine_token_ref_rank == 2 and row.ref_top2_margin == 0
    assert apply_ties(frame, 0.05).iloc[0].verdict == "benign_tie"
    below = result("ref", [5, 6], [-0.1, -1.0], [[5, 9, 2], [6, 8, 4]], [[-0.1, -2, -3], [-1.0, -1.0, -1.3]])
    frame = compare([below], [tied])
    assert not frame.iloc[0].tie_candidate and apply_ties(frame, 10.0).iloc[0].verdict == "diverged"


def test_token_outside_the_references_top_k_is_never_a_tie() -> None:
    other = result("x", [5, 4, 7], [-0.1, -0.7, -0.2], [[5, 9], [4, 6], [7, 3]], [[-0.1, -2], [-0.6, -0.7], [-0.2, -3]])
    frame = apply_ties(compare([REF], [other]), 10.0)
    assert frame.iloc[0].verdict == "diverged" and not frame.iloc[0].engine_token_in_ref_topk


def test_length_difference_diverges_at_the_shorter_end() -> None:
    other = result("x", [5, 6], [-0.1, -0.7], REF.top_ids[:2], REF.top_logprobs[:2])
    row = compare([REF], [other]).iloc[0]
    assert row.verdict == "diverged" and row.first_divergence == 2 and row.engine_token == -1


def test_prompt_ids_mismatch_is_diverged() -> None:
    other = result("x", [5, 6, 7], [-0.1, -0.7, -0.2], REF.top_ids, REF.top_logprobs, prompt=(1, 3))
    assert compare([REF], [other]).iloc[0].verdict == "diverged"


def test_a_runner_up_within_the_margin_is_no_tie_when_the_pair_drifts_beyond_the_bound_or_a_layer_left_its_floor(
        ) -> None:
    """The tie margin and the drift bound come from noise measured apart from the pair (harness.compare.tie_noise):
    a pair that drifts on its shared steps beyond the bound is another computation, and a layer check that found a
    component out of its floor makes the divergence real, whatever the margin."""
    other = result("x", [5, 8, 1], [-0.1, -0.69, -0.2], [[5, 9], [8, 6], [1, 2]],
                   [[-0.1, -2], [-0.69, -0.7], [-0.2, -1]])
    frame = compare([REF], [other])  # shared step 0 drifts by 0.0
    assert apply_ties(frame.copy(), 0.05, drift_bound=0.01).iloc[0].verdict == "benign_tie"
    drifting = result("x", [5, 8, 1], [-0.4, -0.69, -0.2], [[5, 9], [8, 6], [1, 2]],
                      [[-0.4, -2], [-0.69, -0.7], [-0.2, -1]])
    frame = compare([REF], [drifting])  # shared step 0 drifts by 0.3
    assert apply_ties(frame.copy(), 0.05, drift_bound=0.01).iloc[0].verdict == "diverged"
    assert apply_ties(frame.copy(), 0.05, drift_bound=0.5).iloc[0].verdict == "benign_tie"
    assert apply_ties(frame.copy(), 0.05, drift_bound=0.5, checked=np.array([False])).iloc[0].verdict == "diverged"


def test_a_first_step_divergence_reads_its_drift_at_that_step() -> None:
    """No step is shared before a step-0 divergence: the drift is the reference's token's logprob there, the
    reference's against the engine's (where the engine's top-k holds it), never a NaN that passes every bound."""
    flipped = result("x", [9, 6, 7], [-1.9, -0.7, -0.2], [[9, 5], [6, 8], [7, 3]], [[-1.9, -2.3], [-0.7, -0.72],
                                                                                    [-0.2, -3]])
    row = compare([REF], [flipped]).iloc[0]
    assert row.first_divergence == 0 and np.isclose(row.max_abs_logprob_delta, 2.2)  # -0.1 against -2.3
    elsewhere = result("x", [4, 6, 7], [-0.1, -0.7, -0.2], [[4, 3], [6, 8], [7, 3]], [[-0.1, -2], [-0.7, -0.72],
                                                                                   [-0.2, -3]])
    assert np.isnan(compare([REF], [elsewhere]).iloc[0].max_abs_logprob_delta)
