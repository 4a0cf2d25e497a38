"""The routing rules of harness.compare.routing on hand-made tables: sets compared as sets whatever order an engine
returns them in, weights matched by expert id, and each difference read as the module docstring says."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.compare import routing
from harness.compare.routing import LayerRoutes


def table(ids: list[list[int]], weights: list[list[float]], margins: list[float]) -> dict[int, LayerRoutes]:
    ids_array, weights_array = np.array(ids), np.array(weights, dtype=float)
    order = np.argsort(ids_array, axis=1)
    return {0: LayerRoutes(np.take_along_axis(ids_array, order, 1), np.take_along_axis(weights_array, order, 1),
                           np.array(margins, dtype=float))}


def errors(router_diff: list[float], router_rel: list[float]) -> pd.DataFrame:
    n = len(router_diff)
    return pd.DataFrame({"point": "layers.0.router", "layer": 0, "position": np.arange(n),
                         "max_abs": router_diff, "rel_l2": router_rel})


POINTS = pd.DataFrame({"point": ["layers.0.router"], "floor": [1e-6], "threshold": [1e-5]})


def classified(other: dict[int, LayerRoutes], diff: list[float], rel: list[float]) -> pd.DataFrame:
    reference = table([[0, 1], [2, 3], [0, 2], [1, 3]], [[0.7, 0.3], [0.6, 0.4], [0.5, 0.5], [0.9, 0.1]],
                      [1.0, 0.001, 2.0, 3.0])
    return routing.classify(routing.compare_routes(reference, other), errors(diff, rel), POINTS, k=10)


def test_the_same_experts_in_another_order_agree() -> None:
    other = table([[1, 0], [3, 2], [2, 0], [3, 1]], [[0.3, 0.7], [0.4, 0.6], [0.5, 0.5], [0.1, 0.9]],
                  [1.0, 0.001, 2.0, 3.0])
    found = classified(other, [0.0] * 4, [0.0] * 4)
    assert list(found["kind"]) == ["same"] * 4
    assert routing.reading(found)["kind"] == "same"
    assert routing.grid(found) == ["layer 0: ...."]


def test_a_flip_within_what_the_router_difference_reorders_is_a_near_tie() -> None:
    other = table([[0, 1], [2, 1], [0, 2], [1, 3]], [[0.7, 0.3], [0.6, 0.4], [0.5, 0.5], [0.9, 0.1]],
                  [1.0, 0.002, 2.0, 3.0])
    found = classified(other, [0.0, 0.001, 0.0, 0.0], [0.0, 1e-6, 0.0, 0.0])
    assert list(found["kind"]) == ["same", "near_tie_flip", "same", "same"]
    first = routing.reading(found)
    assert (first["kind"], first["layer"], first["position"], first["near_tie_flips"]) == ("near_tie_flip", 0, 1, 1)
    assert "near-tie (benign)" in routing.sentence(first, "vllm")


def test_a_wide_flip_with_agreeing_logits_is_the_routing_rule_and_apart_logits_the_router() -> None:
    other = table([[0, 1], [2, 3], [1, 3], [0, 2]], [[0.7, 0.3], [0.6, 0.4], [0.5, 0.5], [0.9, 0.1]],
                  [1.0, 0.001, -2.0, 3.0])
    found = classified(other, [0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.1])
    assert list(found["kind"]) == ["same", "same", "routing_rule", "router"]
    text = routing.sentence(routing.reading(found), "fault")
    assert "without a tie" in text and "its own scores rank an unchosen expert above a chosen one" in text


def test_the_same_experts_with_weights_apart_beyond_the_router_floor_is_weighting() -> None:
    other = table([[0, 1], [2, 3], [0, 2], [1, 3]], [[0.7, 0.3], [0.6, 0.4], [0.5 + 1e-7, 0.5], [0.8, 0.2]],
                  [1.0, 0.001, 2.0, 3.0])
    found = classified(other, [0.0] * 4, [0.0] * 4)
    assert list(found["kind"]) == ["same", "same", "same", "weighting"]  # 1e-7 is inside 10 x the floor
    first = routing.reading(found)
    assert (first["kind"], first["position"]) == ("weighting", 3)
    assert routing.grid(found) == ["layer 0: ...w"]


def test_a_layer_reads_as_benign_only_when_every_flip_in_it_is_a_near_tie() -> None:
    other = table([[0, 1], [2, 1], [1, 3], [1, 3]], [[0.7, 0.3], [0.6, 0.4], [0.5, 0.5], [0.9, 0.1]],
                  [1.0, 0.002, -2.0, 3.0])
    found = classified(other, [0.0, 0.001, 0.0, 0.0], [0.0, 1e-6, 0.0, 0.0])
    assert list(found["kind"]) == ["same", "near_tie_flip", "routing_rule", "same"]
    first = routing.reading(found, layer=0)
    assert (first["kind"], first["position"]) == ("routing_rule", 2)  # not the near-tie flip before it


def test_a_flip_without_captured_router_logits_is_not_judged() -> None:
    reference = table([[0, 1]], [[0.7, 0.3]], [float("nan")])
    other = table([[0, 2]], [[0.7, 0.3]], [float("nan")])
    found = routing.classify(routing.compare_routes(reference, other), errors([0.0], [0.0]), POINTS, k=10)
    assert list(found["kind"]) == ["flip"] and routing.grid(found) == ["layer 0: ?"]


def test_a_negative_margin_in_either_engine_is_never_a_near_tie() -> None:
    """docs/moe.md's shifted-rule fault: the reference chose by a margin of 0.0366, the engine against its own scores
    (margin -5.73); in bfloat16 the router logits differ by 0.0625, so the old rule (the smaller margin with its sign
    dropped, within twice the logits' difference) read it benign."""
    reference = table([[0, 3]], [[0.6, 0.4]], [0.0366])
    shifted = table([[2, 3]], [[0.6, 0.4]], [-5.73])
    found = routing.classify(routing.compare_routes(reference, shifted), errors([0.0625], [1e-6]), POINTS, k=10)
    assert list(found["kind"]) == ["routing_rule"]
    within = table([[2, 3]], [[0.6, 0.4]], [0.01])  # the engine's own scores do rank its choice first
    found = routing.classify(routing.compare_routes(reference, within), errors([0.0625], [1e-6]), POINTS, k=10)
    assert list(found["kind"]) == ["near_tie_flip"]


def test_weights_are_judged_against_the_weights_own_floor() -> None:
    """An absolute weight difference is held against the weights' floor (the noise floor's pass against the
    reference, harness.compare.routing.weight_floor), not the router logits' relative one."""
    reference = table([[0, 1]], [[0.70, 0.30]], [1.0])
    other = table([[0, 1]], [[0.72, 0.28]], [1.0])
    floor = table([[0, 1]], [[0.71, 0.29]], [1.0])
    weights = routing.weight_floor(routing.compare_routes(reference, floor))
    assert abs(weights[0] - 0.01) < 1e-12
    judged = routing.classify(routing.compare_routes(reference, other), errors([0.0], [0.0]), POINTS, k=10,
                              weights=weights)
    assert list(judged["kind"]) == ["same"]  # 0.02 is inside 10 x 0.01
    unfloored = routing.classify(routing.compare_routes(reference, other), errors([0.0], [0.0]), POINTS, k=10)
    assert list(unfloored["kind"]) == ["weighting"]


def test_router_logits_are_apart_only_where_the_router_point_left_its_floor() -> None:
    """One position's router rounding above the point's (block-level) threshold is not the router being apart: a
    bfloat16 flip with both margins at a tie (0.002 and 0) stays a near-tie flip while the router point as a whole
    is inside its floor (tiny-qwen3_moe, layer 1, read 'router' and out of its floor before)."""
    reference = table([[1, 2]], [[0.6, 0.4]], [0.002])
    other = table([[1, 3]], [[0.6, 0.4]], [0.0])
    inside = POINTS.assign(leaves_floor=False)
    found = routing.classify(routing.compare_routes(reference, other), errors([0.05], [0.02]), inside, k=2)
    assert list(found["kind"]) == ["near_tie_flip"]
    out = POINTS.assign(leaves_floor=True)
    found = routing.classify(routing.compare_routes(reference, other), errors([0.05], [0.02]), out, k=2)
    assert list(found["kind"]) == ["router"]
