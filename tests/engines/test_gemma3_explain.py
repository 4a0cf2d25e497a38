"""`parity explain` on Gemma 3 270M (q/k norms, sandwich norms, scaled embeddings, sliding-window layers with their own
rope): vLLM stays inside the noise floor at every capture point, and three faults planted in HF copies are named by
layer and component, one of them only from the positions past the sliding window. One explain run of the shipped
scenario (scenarios/gemma3-planted-fault.yaml, a prompt of about 600 tokens) serves every test."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity

pytestmark = pytest.mark.engines

POINTS_PER_LAYER = 17  # Llama's 13, plus q_norm, k_norm and the two sandwich norms


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, ParityRun]:
    """gemma3-planted-fault.yaml (float32) and gemma3-bf16.yaml explained in one command, each run by its name."""
    out = tmp_path_factory.mktemp("gemma3")
    run = parity("explain", str(SCENARIOS / "gemma3-planted-fault.yaml"), str(SCENARIOS / "gemma3-bf16.yaml"), out=out)
    return {d.name.split("-", 2)[2]: ParityRun(run.code, run.stdout, run.stderr, d) for d in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def explained(both: dict[str, ParityRun]) -> ParityRun:
    return both["gemma3-planted-fault"]


def test_bf16_a_two_percent_fault_in_half_of_an_mlps_channels_is_named_and_vllm_stays_clean(
        both: dict[str, ParityRun]) -> None:
    """Gemma 3 in bfloat16: the post-feed-forward norm would cancel a change of every channel alike, not one confined
    to half the channels (scenarios/bf16_faults.py); vLLM inside every floor, and `parity run`'s own near-tie check
    tells the faulty copy's flip from vLLM's."""
    run = both["gemma3-bf16"]
    assert run.code == 0, run.stdout[-3000:]
    found = {loc["engine"]: loc for loc in json.loads(
        (run.run_dir / "explain" / "localisation.json").read_text())["localisations"]}
    fault = found["mlp-half-fault"]
    assert fault["cause"] == "component" and fault["out_of_floor"]["point"] == "layers.9.mlp", fault["verdict"]
    assert found["vllm"]["cause"] in ("none", "near_tie"), found["vllm"]["verdict"]
    assert found["vllm"]["sensitivity"]["threshold"] <= 0.05
    verdicts = run.verdicts.set_index("engine")
    assert verdicts.loc["mlp-half-fault", "verdict"] != "benign_tie", verdicts.loc["mlp-half-fault", "explanation"]


@pytest.fixture(scope="module")
def config(explained: ParityRun) -> dict:
    """The model's config.json, from the folder the run used."""
    return json.loads((Path(explained.meta["engines"]["hf"]["model_path"]) / "config.json").read_text())


@pytest.fixture(scope="module")
def localisations(explained: ParityRun) -> dict[str, dict]:
    assert explained.code == 0, explained.stderr[-3000:]
    data = json.loads((explained.run_dir / "explain" / "localisation.json").read_text())
    return {loc["engine"]: loc for loc in data["localisations"]}


@pytest.fixture(scope="module")
def points(explained: ParityRun) -> pd.DataFrame:
    return pd.read_parquet(explained.run_dir / "explain" / "points.parquet")


@pytest.fixture(scope="module")
def errors(explained: ParityRun) -> pd.DataFrame:
    return pd.read_parquet(explained.run_dir / "explain" / "errors.parquet")


def engine_errors(errors: pd.DataFrame, points: pd.DataFrame, engine: str) -> pd.DataFrame:
    """An engine's per-position errors against the reference, with each point's threshold and whether it leaves it."""
    rows = errors[(errors.engine == engine) & (errors.compared_to == "hf")]
    threshold = points[points.engine == engine].set_index("point")["threshold"]
    rows = rows.assign(threshold=threshold.reindex(rows.point).to_numpy())
    return rows.assign(out=rows.rel_l2 > rows.threshold)


def test_vllm_stays_within_the_noise_floor_at_every_point_past_the_window(
        explained: ParityRun, localisations: dict[str, dict], points: pd.DataFrame, config: dict) -> None:
    assert len(explained.results.set_index("engine").loc["hf", "prompt_ids"]) > config["sliding_window"] + 50
    loc = localisations["vllm"]
    assert loc["cause"] == "none", loc["verdict"]
    vllm = points[points.engine == "vllm"]
    assert vllm.point.nunique() == 1 + config["num_hidden_layers"] * POINTS_PER_LAYER + 2  # embeddings .. logits
    assert not vllm.leaves_floor.any(), vllm[vllm.leaves_floor]
    # sliding (local rope) and full (global rope) layers alike: HF's derived rope is vLLM's rope
    assert {"layers.4.q_rope", "layers.5.k_rope", "layers.5.q_norm", "layers.17.ffn_post_norm"} <= set(vllm.point)


def test_planted_k_norm_fault_is_named_by_layer_and_component(localisations: dict[str, dict]) -> None:
    loc = localisations["k-norm-fault"]
    assert loc["cause"] == "component"
    assert loc["out_of_floor"]["point"] == "layers.4.k_norm" and loc["out_of_floor"]["jump"] == float("inf")
    assert loc["first_difference"]["point"] == "layers.4.k_norm"
    assert "layer 4 k_norm leaves the noise floor first (from position 0)" in loc["verdict"]
    assert "k norm" in loc["verdict"] and loc["out_of_floor"]["first_position"] == 0


def test_planted_post_feed_forward_norm_fault_is_named_by_layer_and_component(
        localisations: dict[str, dict]) -> None:
    loc = localisations["ffn-norm-fault"]
    assert loc["cause"] == "component" and loc["out_of_floor"]["point"] == "layers.13.ffn_post_norm"
    assert "post-MLP sandwich norm" in loc["out_of_floor"]["cause"]
    assert all(c["error"] == 0 for c in loc["curve"][:13]) and loc["curve"][13]["error"] > 0


def test_planted_window_fault_is_named_only_from_the_positions_past_the_window(
        localisations: dict[str, dict], points: pd.DataFrame, errors: pd.DataFrame, config: dict) -> None:
    window = config["sliding_window"]
    assert config["layer_types"][8] == "sliding_attention"
    loc = localisations["window-fault"]
    assert loc["cause"] == "component" and loc["out_of_floor"]["point"] == "layers.8.attn"
    assert "attention kernel" in loc["verdict"] and loc["first_difference"]["point"] == "layers.8.attn"
    rows = engine_errors(errors, points, "window-fault")
    assert rows[rows.position < window].rel_l2.max() == 0  # inside the window the faulty mask is the right one
    # position 512 (the 513th token) is the first whose window hides a key, the BOS: the wider window shows there
    assert loc["out_of_floor"]["first_position"] == window
    assert f"leaves the noise floor first (from position {window})" in loc["verdict"]
    attn = rows[rows.point == "layers.8.attn"]
    assert attn[attn.out].position.min() == window  # the record agrees with the per-position errors
