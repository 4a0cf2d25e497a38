"""Noise floor, per-point metrics and the localisation verdict on synthetic traces (no engines)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.compare.trace_diff import EPS, against_floor, position_metrics
from harness.core.points import LAYER_POINTS, layer_point, ordered
from harness.explain.localise import Divergence, localise


def points_frame(errors: dict[str, float]) -> pd.DataFrame:
    """A summarize()-like frame over 2 layers: every point 0 unless given."""
    names = ordered(["embeddings", *[layer_point(i, p) for i in range(2) for p in LAYER_POINTS], "final_norm",
                     "logits"])
    rows = []
    for name in names:
        layer = -1 if name == "embeddings" else 10**6 if "." not in name else int(name.split(".")[1])
        rows.append({"point": name, "layer": layer, "error": errors.get(name, 0.0), "worst_position": 3,
                     "max_abs": 0.0, "min_cosine": 1.0, "max_rel_diff": 0.0,
                     "component": name.split(".")[-1]})
    return pd.DataFrame(rows)


def localised(errors: dict[str, float], floor: dict[str, float] | None = None, **kwargs):
    summary = points_frame(errors)
    floor_frame = points_frame(floor) if floor is not None else None
    points = against_floor(summary, floor_frame, "float32", 10.0)
    defaults = dict(case_id="c", engine="e", reference="r", prompt_equal=True, divergence=None, nonfinite={},
                    fused={"r": set(), "e": {"q", "k", "v"}}, param_note="", k=10.0, decode=lambda t: f"#{t}")
    return localise(points, **{**defaults, **kwargs}), points


def test_metrics_per_position() -> None:
    x = np.array([[1.0, 0.0], [1.0, 1.0]])
    y = np.array([[1.0, 0.0], [1.0, 1.1]])
    m = position_metrics(x, y)
    assert m["max_abs"][0] == 0 and m["max_abs"][1] == pytest.approx(0.1)
    assert m["rel_l2"][1] == pytest.approx(0.1 / np.sqrt(2)) and m["cosine"][0] == pytest.approx(1.0)
    assert m["rel_diff"][0] == 0 and m["rel_diff"][1] == pytest.approx(1 - 2 * 2.1 / (2 + 2.21))
    tiny = position_metrics(x, x * (1 + 2.0**-40))  # far below float64's cancellation in 1 - 2xy/(xx+yy)
    assert tiny["rel_diff"][1] == pytest.approx(2.0**-81, rel=1e-3)


def test_floor_is_cumulative_per_kind_and_never_below_the_rounding_unit() -> None:
    floor = {"layers.0.v": 1e-5, "layers.1.v": 2e-6}
    _, points = localised({}, floor)
    by_point = points.set_index("point")["floor"]
    assert by_point["layers.0.v"] == 1e-5 and by_point["layers.1.v"] == 1e-5  # noise upstream carries forward
    assert by_point["layers.0.q"] == EPS["float32"]


def test_first_point_out_of_the_floor_names_layer_component_and_fusion() -> None:
    loc, _ = localised({"layers.1.v": 1e-2, "layers.1.attn": 1e-2, "layers.1.residual": 1e-3})
    assert loc.cause == "component" and loc.out_of_floor["point"] == "layers.1.v"
    assert loc.out_of_floor["jump"] == float("inf")  # nothing upstream differs
    assert "fused projection: e computes q, k and v in one fused matmul" in loc.out_of_floor["cause"]
    assert loc.verdict.startswith("layer 1 v leaves the noise floor first")


def test_within_the_floor_a_token_picked_after_the_logits_is_sampler_semantics() -> None:
    divergence = Divergence(step=3, ref_token=5, engine_token=6, ref_top=[6, 5], ref_margin=0.3, engine_top=[6, 5],
                            engine_margin=0.3, ref_took_argmax=False, engine_took_argmax=True, position=9,
                            forced_ref_top=[6, 5], forced_ref_margin=0.3, forced_engine_top=[6, 5],
                            forced_engine_margin=0.3)
    loc, _ = localised({"layers.0.q": 1e-7}, divergence=divergence, param_note="penalties differ")
    assert loc.cause == "sampler" and "tokens were picked after the logits" in loc.verdict
    assert loc.verdict.endswith("penalties differ")


def test_within_the_floor_both_taking_their_argmax_is_a_near_tie() -> None:
    divergence = Divergence(step=3, ref_token=5, engine_token=6, ref_top=[5, 6], ref_margin=0.01, engine_top=[6, 5],
                            engine_margin=0.0, ref_took_argmax=True, engine_took_argmax=True, position=9,
                            forced_ref_top=[5, 6], forced_ref_margin=0.01, forced_engine_top=[5, 6],
                            forced_engine_margin=0.02)
    loc, _ = localised({"layers.0.q_rope": 1e-7}, divergence=divergence, near_tie=True)
    assert loc.cause == "near_tie" and "the engines first differ at layer 0 q_rope (rope)" in loc.verdict
    # the run read it otherwise (a margin beyond the measured noise): explain says so, never a near-tie of its own
    loc, _ = localised({"layers.0.q_rope": 1e-7}, divergence=divergence,
                       run_reading="not a near-tie: the margin is beyond the tie margin 0.005 nats")
    assert loc.cause == "beyond_noise" and "the margin is beyond the tie margin 0.005 nats" in loc.verdict


def test_prompt_and_hazard_come_first() -> None:
    assert localised({"layers.0.v": 1.0}, prompt_equal=False)[0].cause == "prompt"
    loc, _ = localised({"layers.0.v": 1.0}, nonfinite={"e": {"layers.1.attn": 3}})
    assert loc.cause == "hazard" and "3 inf/NaN value(s), first at layer 1 attn" in loc.verdict


def test_within_the_floor_an_engine_that_stops_sooner_is_an_ending_not_no_divergence() -> None:
    """The run judged the case apart although no token differs (one engine stopped sooner): explain says so."""
    ending = "the generated tokens agree for the first 3 steps and the engines stop at different steps: r after 3"
    loc, _ = localised({"layers.0.q": 1e-9}, ending=ending)
    assert loc.cause == "ending" and loc.verdict.startswith(ending)
    assert localised({"layers.0.q": 1e-9})[0].cause == "none"


def test_within_the_floor_the_largest_multiple_is_said_with_its_threshold() -> None:
    loc, _ = localised({"layers.0.q": 3e-7})  # 2.5x float32's rounding unit
    assert "every capture point stays below the threshold (10x the floor; largest: layer 0 q at 2.52x the floor)" \
        in loc.verdict, loc.verdict


def logits_only(error: float, **kwargs):
    """A logits-only trace pair (no per-layer map): its single point, against float32's rounding unit."""
    summary = pd.DataFrame([{"point": "logits", "layer": 10**6, "error": error, "worst_position": 7, "max_abs": 0.0,
                             "min_cosine": 1.0, "max_rel_diff": 0.0, "component": "lm_head / logits"}])
    points = against_floor(summary, None, "float32", 10.0).assign(first_out_position=4)
    defaults = dict(case_id="c", engine="e", reference="r", prompt_equal=True, divergence=None, nonfinite={},
                    fused={}, param_note="", k=10.0, decode=lambda t: f"#{t}",
                    missing_map="no hf architecture map for model type 'codegen'")
    return localise(points, **{**defaults, **kwargs})


def test_a_logits_only_answer_names_no_component_and_says_it_cannot_localise() -> None:
    """Only the logits were captured: nothing inside the model was measured, so nothing there is named or said to
    agree."""
    loc = logits_only(0.00767)
    assert loc.cause == "logits" and loc.out_of_floor["first_position"] == 4
    assert loc.verdict.startswith("the logits differ beyond the noise floor from position 4: relative error 0.00767 "
                                  "is 6.43e+04x the floor (1.19e-07), above the threshold (10x the floor)")
    assert "the generated tokens agree" in loc.verdict
    assert "only the logits were compared (no hf architecture map for model type 'codegen'), so where inside the " \
           "model the difference starts cannot be localised" in loc.verdict
    for claim in ("Candidate cause", "inputs agree", "lm_head"):
        assert claim not in loc.verdict, loc.verdict
    within = logits_only(3e-7)
    assert within.cause == "none" and within.verdict.startswith(
        "the logits stay within the noise floor: relative error 3e-07 is 2.52x the floor (1.19e-07), below the "
        "threshold (10x the floor)")


def test_a_logits_only_divergence_says_whether_it_was_a_near_tie() -> None:
    divergence = Divergence(step=2, ref_token=5, engine_token=6, ref_top=[5, 6], ref_margin=0.01, engine_top=[6, 5],
                            engine_margin=0.01, ref_took_argmax=True, engine_took_argmax=True, position=9,
                            forced_ref_top=[5, 6], forced_ref_margin=0.01, forced_engine_top=[6, 5],
                            forced_engine_margin=0.01)
    assert "; a near-tie; only the logits" in logits_only(0.01, divergence=divergence, near_tie=True).verdict
    assert "; not a near-tie; only the logits" in logits_only(0.01, divergence=divergence).verdict


def test_the_error_curve_line_says_its_largest_multiple_against_the_threshold() -> None:
    from harness.explain.localisation_report import curve_line

    curve = [{"layer": 0, "error": 1e-6, "floor": 1e-6}, {"layer": 1, "error": 3.4e-6, "floor": 1e-6}]
    assert curve_line(curve, 10.0).endswith("(max 3.4x the floor, below the threshold (10x the floor))")
    assert curve_line(curve, 2.0).endswith("(max 3.4x the floor, above the threshold (2x the floor))")
