"""The trace writer takes a point whole or in row chunks interleaved with other points' chunks, and writes a
safetensors file that both safetensors and the harness's chunked reader read back row for row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from adapters.tracing.writer import TraceWriter
from harness.rundir.traces import Trace


def test_interleaved_chunks_are_written_as_whole_points(tmp_path) -> None:
    path = tmp_path / "case.safetensors"
    writer = TraceWriter(path, torch.float32)
    q, logits = torch.randn(5, 4), torch.randn(5, 7)
    writer.add("embeddings", torch.ones(5, 3, dtype=torch.float64))
    for start, stop in ((0, 2), (2, 5)):  # chunked prefill: every point of one chunk, then the next chunk
        writer.append("layers.0.q", q[start:stop])
        writer.append("logits", logits[start:stop])
    assert writer.rows("logits") == 5 and writer.rows("final_norm") == 0
    assert writer.close({"engine": "test"}) == ["embeddings", "layers.0.q", "logits"]
    tensors = load_file(str(path))
    np.testing.assert_array_equal(tensors["layers.0.q"], q.numpy())
    np.testing.assert_array_equal(tensors["logits"], logits.numpy())
    trace = Trace(path)
    assert trace.shape("logits") == (5, 7) and trace.metadata == {"engine": "test"}
    np.testing.assert_array_equal(trace.rows("logits", 1, 4), logits.numpy()[1:4].astype(np.float64))
    assert not path.with_name(f".{path.name}.data").exists()


def test_a_whole_point_cannot_be_extended_and_widths_must_agree(tmp_path) -> None:
    writer = TraceWriter(tmp_path / "case.safetensors", torch.float32)
    writer.add("logits", torch.zeros(2, 3))
    with pytest.raises(ValueError, match="captured twice"):
        writer.append("logits", torch.zeros(1, 3))
    writer.append("layers.0.k", torch.zeros(1, 4))
    with pytest.raises(ValueError, match="width"):
        writer.append("layers.0.k", torch.zeros(1, 5))
    writer.discard()


def test_nonfinite_values_are_counted_across_chunks(tmp_path) -> None:
    writer = TraceWriter(tmp_path / "case.safetensors", torch.float32)
    writer.append("logits", torch.tensor([[float("inf"), 0.0]]))
    writer.append("logits", torch.tensor([[float("nan"), float("nan")]]))
    assert writer.nonfinite == {"logits": 3}
    writer.discard()


def test_points_written_one_after_another_get_their_header_in_place(tmp_path) -> None:
    """Without chunked prefill each point's chunks are consecutive (logits in slices included): the data file becomes
    the trace with the header written into the room kept for it, and safetensors reads it."""
    path = tmp_path / "case.safetensors"
    writer = TraceWriter(path, torch.float32)
    logits = torch.randn(5, 7)
    writer.add("final_norm", torch.randn(5, 3))
    writer.append("logits", logits[:2])
    writer.append("logits", logits[2:])
    data_file = writer.data_path
    inode = data_file.stat().st_ino
    writer.close({"engine": "test"})
    assert path.stat().st_ino == inode and not data_file.exists()  # renamed, not copied
    np.testing.assert_array_equal(load_file(str(path))["logits"], logits.numpy())
    np.testing.assert_array_equal(Trace(path).rows("logits", 0, 5), logits.numpy().astype(np.float64))


def test_huge_finite_values_are_not_counted_as_nonfinite(tmp_path) -> None:
    writer = TraceWriter(tmp_path / "case.safetensors", torch.float32)
    writer.append("layers.0.mlp", torch.full((4, 2), 3e38))  # their float32 sum overflows; each value is finite
    assert writer.nonfinite == {}
    writer.discard()


def test_the_writer_copies_rows_the_engine_goes_on_to_change(tmp_path) -> None:
    """Chunks are written by a thread after append returns: what is written is the rows as they were then."""
    path = tmp_path / "case.safetensors"
    writer = TraceWriter(path, torch.float32)
    buffer = torch.zeros(4, 2)
    for step in range(3):  # an engine reusing one output buffer for every chunk
        buffer.fill_(step)
        writer.append("logits", buffer)
    writer.close({})
    np.testing.assert_array_equal(load_file(str(path))["logits"][:, 0], np.repeat([0.0, 1.0, 2.0], 4))


def test_a_failed_write_is_raised_to_the_capture_and_the_trace_discarded(tmp_path) -> None:
    path = tmp_path / "case.safetensors"
    writer = TraceWriter(path, torch.float32)
    writer.data.file.close()  # every later write fails, as on a full disk
    writer.append("logits", torch.zeros(2, 2))
    with pytest.raises(ValueError, match="closed file"):
        writer.close({})
    writer.discard()
    assert not path.exists() and not writer.data_path.exists()


def test_a_pass_compared_as_it_is_captured_writes_the_metrics_a_full_comparison_finds(tmp_path) -> None:
    """The comparing writer (a pass held against the reference's trace while captured) gives, per point and position,
    the metrics compare_traces computes from both whole traces, keeps only the rows asked for, and compares the
    logits over the columns both have."""
    from adapters.tracing.comparing_writer import ComparingWriter
    from harness.compare.trace_diff import compare_traces, metrics_frame

    generator = torch.Generator().manual_seed(0)
    rows = {"embeddings": torch.randn(6, 4, generator=generator), "layers.0.q": torch.randn(6, 8, generator=generator),
            "logits": torch.randn(6, 10, generator=generator)}
    reference = TraceWriter(tmp_path / "ref.safetensors", torch.float32)
    whole = TraceWriter(tmp_path / "other-whole.safetensors", torch.float32)
    noisy = {name: tensor + 1e-3 * torch.randn(tensor.shape, generator=generator) for name, tensor in rows.items()}
    noisy["logits"] = noisy["logits"][:, :9]  # an engine that trims its vocabulary
    for name, tensor in rows.items():
        reference.add(name, tensor)
    reference.close({"engine": "ref"})
    compared = ComparingWriter(tmp_path / "other.safetensors", torch.float32, tmp_path / "ref.safetensors",
                               keep={"logits"})
    for name, tensor in noisy.items():
        whole.add(name, tensor)
        for start in range(0, 6, 4):  # in chunks, as chunked prefill delivers them
            compared.append(name, tensor[start:start + 4])
    whole.close({"engine": "other"})
    assert compared.close({"engine": "other"}) == ["embeddings", "layers.0.q", "logits"]
    expected = compare_traces(Trace(tmp_path / "ref.safetensors"), Trace(tmp_path / "other-whole.safetensors"))
    got = metrics_frame(Trace(tmp_path / "other.errors.safetensors"), Trace(tmp_path / "other.safetensors"))
    key = ["point", "position"]
    pd_testing = pytest.importorskip("pandas.testing")
    pd_testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                  expected.sort_values(key).reset_index(drop=True))
    assert Trace(tmp_path / "other.safetensors").points == ["logits"]  # only the kept point's rows
    assert "compared over the 9 token ids" in " ".join(got.attrs["notes"])
