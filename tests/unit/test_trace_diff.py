"""Trace comparison in bounded row chunks: the same metrics as whole tensors, logits of different vocabulary widths
compared over the shared ids (and said so), any other shape difference refused."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from harness.compare.trace_diff import compare_traces, position_metrics
from harness.rundir import traces
from harness.rundir.traces import Trace, row_chunks


def write_trace(path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Trace:
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, str(path), metadata)
    return Trace(path)


def test_row_chunks_cover_every_row_within_the_budget() -> None:
    assert row_chunks(10, 4, budget=3 * 4 * 8) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert row_chunks(3, 10**6, budget=8) == [(0, 1), (1, 2), (2, 3)]  # at least one row per chunk


def test_chunked_comparison_equals_whole_tensors(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    x = {"layers.0.q": rng.normal(size=(7, 16)), "logits": rng.normal(size=(7, 50))}
    y = {k: v + rng.normal(scale=1e-3, size=v.shape) for k, v in x.items()}
    ref, other = write_trace(tmp_path / "x.safetensors", x), write_trace(tmp_path / "y.safetensors", y)
    monkeypatch.setattr(traces, "CHUNK_BYTES", 2 * 16 * 8)  # two rows of q at a time
    frame = compare_traces(ref, other)
    for point in x:
        whole = position_metrics(ref.rows(point, 0, 7), other.rows(point, 0, 7))
        rows = frame[frame.point == point]
        for metric, values in whole.items():
            np.testing.assert_allclose(rows[metric].to_numpy(), values, rtol=0, atol=0)
    assert frame.attrs["notes"] == []


def test_logits_of_different_widths_are_compared_over_the_shared_ids(tmp_path) -> None:
    logits = np.arange(12.0).reshape(3, 4)
    ref = write_trace(tmp_path / "hf.safetensors", {"logits": logits})
    trimmed = write_trace(tmp_path / "cpp.safetensors", {"logits": logits[:, :3]})
    frame = compare_traces(ref, trimmed)
    assert (frame.max_abs == 0).all()
    assert frame.attrs["notes"] == ["logits: compared over the 3 token ids both engines score (4 in hf.safetensors, "
                                    "3 in cpp.safetensors)"]


def test_other_shape_differences_are_refused(tmp_path) -> None:
    ref = write_trace(tmp_path / "a.safetensors", {"layers.0.v": np.zeros((3, 4))})
    other = write_trace(tmp_path / "b.safetensors", {"layers.0.v": np.zeros((3, 5))})
    with pytest.raises(ValueError, match="layers.0.v: shapes differ"):
        compare_traces(ref, other)


def test_logits_kept_from_the_prompts_last_position_are_read_and_compared_at_their_positions(tmp_path) -> None:
    """A trace keeps the logits from logits_from on (the positions that predict generated tokens): readers address
    rows by position, and a trace with every position's logits (an older one) is compared over the shared ones."""
    rng = np.random.default_rng(1)
    hidden, logits = rng.normal(size=(6, 4)), rng.normal(size=(6, 9))
    whole = write_trace(tmp_path / "whole.safetensors", {"final_norm": hidden, "logits": logits})
    kept = write_trace(tmp_path / "kept.safetensors", {"final_norm": hidden, "logits": logits[4:]},
                       {"logits_from": "4"})
    assert kept.span("logits") == (4, 6) and kept.span("final_norm") == (0, 6)
    np.testing.assert_array_equal(kept.rows("logits", 5, 6), logits[5:6].astype(np.float32).astype(np.float64))
    with pytest.raises(ValueError, match="logits starts at position 4, not 3"):
        kept.rows("logits", 3, 6)
    frame = compare_traces(whole, kept)
    assert frame[frame.point == "logits"].position.tolist() == [4, 5]
    assert frame[frame.point == "final_norm"].position.tolist() == list(range(6))
    assert (frame.max_abs == 0).all()
