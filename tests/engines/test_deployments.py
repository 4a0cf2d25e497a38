"""How engines are deployed (scenarios/tensor-parallel.yaml): vLLM split over two tensor-parallel ranks, offline and
as a server, against one rank (the tensor_parallel knob); `parity explain` capturing inside every rank of a two-rank
engine, clean and with a fault planted in one rank's shard. One `parity explain` serves the module."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity


@pytest.fixture(scope="module")
def explained(tmp_path_factory) -> ParityRun:
    out = tmp_path_factory.mktemp("deployments")
    run = parity("explain", str(SCENARIOS / "tensor-parallel.yaml"), out=out)
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


def localisations(run: ParityRun) -> dict[str, dict]:
    data = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    return {loc["engine"]: loc for loc in data["localisations"]}


def test_two_ranks_answer_as_one_offline_and_served(explained: ParityRun) -> None:
    """The knob on both vLLM engines: the same greedy tokens on one rank and on two, the logprobs within rounding;
    the negative control tells a real difference apart on each."""
    invariance = pd.read_parquet(explained.run_dir / "invariance.parquet")
    knob = invariance[invariance.knob == "tensor_parallel"].set_index("engine")
    assert set(knob.index) == {"vllm-tp2", "vllm-server"}
    assert set(knob.verdict) <= {"identical", "tokens_identical"}, knob[["verdict", "explanation"]]
    assert (knob.max_abs_logprob_delta < 1e-4).all()
    control = invariance[invariance.knob == "control"]
    assert set(control.verdict) == {"diverged"}, control


def test_the_ranks_and_their_cores_are_recorded(explained: ParityRun) -> None:
    engines = explained.meta["engines"]
    assert engines["vllm-tp2"]["versions"]["tensor_parallel_size"] == "2"
    assert engines["vllm-tp2"]["versions"]["threads_bind"] == "0|1"  # a core per rank, from the cores it may use
    sizes = {name: e["versions"].get("tensor_parallel_size") for name, e in engines.items() if "server" in name}
    assert sorted(sizes.values()) == ["1", "2"], sizes


def test_a_clean_two_rank_engine_stays_inside_the_floor_as_one_rank_does(explained: ParityRun) -> None:
    """Every layer captured in both ranks and joined: the same points as a one-rank engine, none out of its floor."""
    loc = localisations(explained)["vllm-tp2"]
    assert loc["cause"] == "none" and loc["forced"], loc["verdict"]
    points = pd.read_parquet(explained.run_dir / "explain" / "points.parquet")
    captured = set(points[points.engine == "vllm-tp2"].point)
    assert {"layers.1.q", "layers.1.k", "layers.1.attn", "layers.1.gate", "layers.1.up", "layers.1.mlp",
            "logits"} <= captured
    assert not points[points.engine == "vllm-tp2"].leaves_floor.any()


def test_a_fault_in_one_ranks_shard_is_named_with_its_layer_component_and_rank(explained: ParityRun) -> None:
    """Rank 1's query heads of layer 1 changed by 2% (scenarios/tp_faults.py), rank 0 untouched: named by layer and
    component, and as rank 1's shard (its query head), rank 0's shard measured clean."""
    loc = localisations(explained)["rank1-fault"]
    assert loc["cause"] == "component", loc["verdict"]
    out = loc["out_of_floor"]
    assert out["point"] == "layers.1.q" and out["shards"]["ranks"] == [1]
    assert "rank 1's shard (query head 1 of 2) only" in loc["verdict"]
    assert "fused projection" not in out["cause"]  # one rank's shard: no fusion every rank shares
