"""How a tensor-parallel engine's points are split over its ranks, where a difference lives among them, and the cores
each rank is bound to."""

from __future__ import annotations

import pytest

from adapters.engines.vllm_parallel import rank_binding, split_problem, too_few_cores
from harness.core.shards import ShardLayout, shard_reading, shard_readings

TINY = ShardLayout(ranks=2, heads=2, kv_heads=1, head_dim=32, ffn=128)  # tiny-llama over two ranks
WIDE = ShardLayout(ranks=2, heads=8, kv_heads=4, head_dim=64, ffn=1024)


def test_each_rank_splits_its_fused_outputs_by_its_own_widths() -> None:
    assert TINY.rank_sizes() == {"q": 32, "kv": 32, "ffn": 64, "head_dim": 32}  # the KV head copied, not halved
    assert WIDE.rank_sizes() == {"q": 256, "kv": 128, "ffn": 512, "head_dim": 64}


def test_copied_kv_heads_are_joined_once_and_split_points_from_every_rank() -> None:
    assert TINY.holders("k") == [0] and TINY.holders("v") == [0]
    assert TINY.holders("q") == [0, 1] and TINY.holders("gate") == [0, 1]
    assert WIDE.holders("k") == [0, 1]
    assert ShardLayout(ranks=4, heads=8, kv_heads=2, head_dim=8, ffn=64).holders("v") == [0, 2]


def test_a_layout_vllm_would_refuse_says_why() -> None:
    assert not TINY.problem() and not WIDE.problem()
    assert "9 attention heads" in ShardLayout(2, 9, 3, 64, 1536).problem()  # SmolLM2
    assert "3 KV heads" in ShardLayout(2, 4, 3, 64, 1536).problem()


def test_one_ranks_shard_is_named_with_its_heads() -> None:
    reading = shard_reading("q", {0: 1e-8, 1: 0.03}, WIDE)
    assert reading is not None and reading.ranks == [1]
    assert "rank 1's shard (query heads 4-7 of 8) only" in reading.words
    assert "1e-08 in rank 0's, 0.03 in rank 1's" in reading.words
    assert "intermediate units 0-511 of 1024" in shard_reading("up", {0: 0.5, 1: 0.0}, WIDE).words


def test_a_difference_alike_in_every_shard_names_no_rank() -> None:
    """A kernel or fusion difference every rank computes alike is no shard's fault: no rank is named, even with one
    rank's error a few times another's."""
    reading = shard_reading("q", {0: 2e-7, 1: 9e-7}, TINY)
    assert reading is not None and reading.ranks == [] and reading.words.startswith("alike in every rank's shard")
    assert shard_reading("q", {0: 0.1}, TINY) is None


def test_readings_come_from_a_joined_traces_metadata() -> None:
    metadata = {"tensor_parallel": '{"ranks": 2, "heads": 2, "kv_heads": 1, "head_dim": 32, "ffn": 128}',
                "shard_errors": '{"layers.1.q": {"0": 0.0, "1": 0.034}, "layers.0.gate": {"0": 1e-7, "1": 1e-7}}'}
    readings = shard_readings(metadata)
    assert readings["layers.1.q"].ranks == [1] and "query head 1 of 2" in readings["layers.1.q"].words
    assert readings["layers.0.gate"].ranks == []
    assert shard_readings({"engine": "vllm"}) == {}


def test_each_rank_is_bound_to_cores_of_its_own() -> None:
    assert rank_binding(2, [0, 1]) == "0|1"
    assert rank_binding(2, [0, 1, 2, 3, 4]) == "0-1|2-3"  # the odd core left unused
    assert rank_binding(2, [0, 2, 4, 6]) == "0,2|4,6"
    assert not too_few_cores(2, [3, 7])
    with pytest.raises(RuntimeError, match=r"tensor_parallel_size 4: .* may use 2 cores \(0-1\): use at most 2"):
        rank_binding(4, [0, 1])


def test_a_model_that_cannot_be_split_is_refused_before_vllm_loads(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576, '
                                          '"intermediate_size": 1536}')  # SmolLM2-135M's
    assert split_problem(tmp_path, 2) == (f"tensor_parallel_size 2: {tmp_path.name}: its 9 attention heads cannot "
                                          "be split over 2 tensor-parallel ranks")
    assert split_problem(tmp_path, 3) == "" and split_problem(tmp_path, 1) == ""
