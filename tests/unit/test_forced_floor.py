"""The layer-forced floor rule (harness.compare.layer_floor) and the mixture-of-experts readings built on it, on
hand-made per-position errors (no engines): a point is judged per block of positions and per expert's positions by the
RMS of its relative L2 against k x the floor's over the same positions, near-tie routing flips left out."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.compare import routing
from harness.compare.floors import out_of_floor
from harness.compare.layer_floor import BLOCK, RULES, against_forced_floor
from harness.compare.routing import LayerRoutes
from harness.compare.trace_diff import summarize
from harness.explain.localise import localise

POSITIONS = 64


def frame(errors: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per point and position, as compare_traces makes it (only rel_l2 matters here)."""
    rows = [pd.DataFrame({"point": point, "layer": int(point.split(".")[1]), "position": np.arange(len(values)),
                          "rel_l2": values, "max_abs": values, "cosine": 1.0, "rel_diff": values ** 2})
            for point, values in errors.items()]
    return pd.concat(rows, ignore_index=True)


def judged(engine: dict[str, np.ndarray], floor: dict[str, np.ndarray], **kwargs) -> pd.DataFrame:
    per_position = frame(engine)
    return against_forced_floor(summarize(per_position), per_position, frame(floor), "bfloat16",
                                RULES["bfloat16"].k, **kwargs)


def noise(scale: float, seed: int) -> np.ndarray:
    return scale * np.random.default_rng(seed).uniform(0.5, 1.5, POSITIONS)


def test_a_two_percent_change_in_one_block_leaves_the_floor_where_rounding_stays_inside() -> None:
    """Rounding scatters position by position (here 0.35-1.05%, the engine's and the floor's worst positions apart);
    a block's RMS averages it, so a clean engine stays near 1x the floor while 2% at every position of one block
    stands at about 3x."""
    floor = {"layers.3.mlp": noise(0.007, 1)}
    clean = judged({"layers.3.mlp": noise(0.007, 2)}, floor).iloc[0]
    assert not clean["leaves_floor"] and clean["ratio"] < 1.3
    faulty = noise(0.007, 2)
    faulty[BLOCK:] = np.hypot(faulty[BLOCK:], 0.02)  # positions 32.. only (past a sliding window, say)
    found = judged({"layers.3.mlp": faulty}, floor).iloc[0]
    assert found["leaves_floor"] and found["block_start"] == BLOCK and found["first_out_position"] >= BLOCK
    assert 0.02 <= found["block_error"] <= 0.023 and found["sensitivity"] < 0.05


def test_a_point_computed_alike_still_has_a_floor() -> None:
    """Both engines' embeddings bit for bit alike measure a floor of 0: the least floor (bfloat16's 2^-9) keeps a
    threshold, so any change there is seen and nothing divides by zero."""
    zero = {"layers.0.attn": np.zeros(POSITIONS)}
    row = judged({"layers.0.attn": np.full(POSITIONS, 0.01)}, zero).iloc[0]
    assert row["floor"] == 2.0**-9 and row["leaves_floor"]


def reference_routes() -> dict[int, LayerRoutes]:
    """Layer 0 routing positions 0..31 to experts {0, 3}, 32..63 to {1, 2}."""
    return {0: LayerRoutes(np.array([[0, 3]] * 32 + [[1, 2]] * 32), np.full((POSITIONS, 2), 0.5),
                           np.full(POSITIONS, 0.3))}


def test_an_expert_fault_beside_a_near_tie_flip_in_its_layer_is_an_expert_kernel() -> None:
    """A near-tie routing flip at position 5 (a big error at that one position, the engines' routers a hair apart)
    and, in the same layer, expert 1's output 2% off where it acts: the flip is left out of what is judged, the block
    output leaves its floor at expert 1's positions, and the reading there is an expert kernel, not the benign
    near-tie elsewhere in the layer."""
    reference, flipped = reference_routes(), reference_routes()
    flipped[0].ids[5] = [0, 2]
    flipped[0].margin[5], reference[0].margin[5] = 0.01, 0.02
    compared = routing.compare_routes(reference, flipped)
    moe, floor = noise(0.005, 3), noise(0.005, 4)
    moe[5] = 0.6
    moe[32:] = np.hypot(moe[32:], 0.02)
    router = np.full(POSITIONS, 1e-3)
    per_position = frame({"layers.0.router": router, "layers.0.moe": moe})
    rough = against_forced_floor(summarize(per_position), per_position, frame({"layers.0.router": router,
                                                                               "layers.0.moe": floor}),
                                 "bfloat16", 2.0)
    per_position["max_abs"] = np.where(per_position["point"] == "layers.0.router", 0.05, per_position["max_abs"])
    kinds = routing.classify(compared, per_position, rough, 2.0)
    assert list(kinds.loc[kinds["kind"] != "same", "position"]) == [5]
    assert kinds.set_index("position").loc[5, "kind"] == "near_tie_flip"
    experts = pd.DataFrame({"layer": 0, "position": np.repeat(np.arange(POSITIONS), 2),
                            "expert": reference[0].ids.reshape(-1)})
    points = against_forced_floor(summarize(per_position), per_position,
                                  frame({"layers.0.router": router, "layers.0.moe": floor}), "bfloat16", 2.0,
                                  excluded=kinds.loc[kinds["kind"] == "near_tie_flip", ["layer", "position"]],
                                  experts=experts)
    moe_row = points.set_index("point").loc["layers.0.moe"]
    assert moe_row["leaves_floor"] and moe_row["left_out"] == 1 and moe_row["block"] in (-2, -3, 1)
    kinds = kinds.assign(out=out_of_floor(per_position, points, kinds))
    loc = localise(points, case_id="c", engine="e", reference="r", prompt_equal=True, divergence=None, nonfinite={},
                   fused={}, param_note="", k=2.0, decode=str, routing=kinds, forced=True)
    assert loc.cause == "component" and loc.out_of_floor["point"] == "layers.0.moe"
    assert "an expert kernel" in loc.verdict, loc.verdict


def test_a_block_whose_every_position_was_left_out_hides_nothing() -> None:
    """Expert 0's positions all near-tie flips (left out): its empty block is not judged, and a 2% fault at positions
    32.. of the same point is still found (an empty block's NaN ratio was taken for the worst and read inside)."""
    moe, floor = noise(0.005, 5), noise(0.005, 6)
    moe[BLOCK:] = np.hypot(moe[BLOCK:], 0.02)
    experts = pd.DataFrame({"layer": 0, "position": np.repeat(np.arange(POSITIONS), 2),
                            "expert": np.array([[0, 1] if p < 4 else [2, 3] for p in range(POSITIONS)]).reshape(-1)})
    flips = pd.DataFrame({"layer": 0, "position": np.arange(4)})
    row = judged({"layers.0.moe": moe}, {"layers.0.moe": floor}, excluded=flips, experts=experts).iloc[0]
    assert row["leaves_floor"] and row["left_out"] == 4 and np.isfinite(row["ratio"])
