"""Routing compared: the experts a mixture-of-experts model chose, per layer and position, in two engines (each
engine's table, written by adapters.tracing.routes beside its trace), and what a difference there means.

Sets are compared for equality, weights (matched by expert id) by their largest absolute difference, never by
relative L2. Where the sets differ, the reading at the first such (layer, position) is one of:
- near_tie_flip: both engines' margins between the last chosen and the first unchosen expert are positive (each chose
  what its own scores rank first) and within what the router logits' measured difference there can reorder (2x
  their largest difference), the logits within the noise floor: benign;
- router: the router logits there already differ beyond the noise floor, the router point out of its floor (the
  choice follows them);
- routing_rule: the router logits agree within the floor and the margin is wide, or an engine's own scores rank an
  unchosen expert above a chosen one (a negative margin: its rule is not the ranking): the routing rules differ.
Where every set agrees: weighting (a chosen expert's weight differs beyond k x the weights' own floor, the largest
weight difference the noise floor's pass shows against the reference: renormalisation, scaling) or, when the
block's output leaves the floor with equal choices and weights, an expert kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.points import layer_point
from harness.rundir.traces import Trace

TIE_BAND = 2.0  # a margin within this many times the router logits' largest difference can be reordered by it
GRID_MARK = {"same": ".", "weighting": "w", "near_tie_flip": "~", "router": "r", "routing_rule": "x", "flip": "?"}
GRID_LEGEND = ". same experts and weights; w weights differ; ~ a near-tie flip; r router logits differ; x a flip " \
              "without a tie; ? a flip whose margin was not captured"
SEVERITY = {"router": 0, "routing_rule": 0, "flip": 1, "near_tie_flip": 2, "weighting": 3}  # the reading's choice
KIND_WORDS = {"near_tie_flip": "a routing flip at a near-tie (benign)",
              "router": "a routing flip that follows router logits already apart",
              "routing_rule": "a routing flip without a tie (the routing rule or scoring differs)",
              "weighting": "the same experts with different weights (a weighting or renormalisation difference)",
              "expert_kernel": "the same experts and weights with a different output (an expert kernel)",
              "flip": "a routing flip whose margin cannot be read (the router logits were not captured)"}


@dataclass
class LayerRoutes:
    ids: np.ndarray  # [positions, k], sorted by expert id per position
    weights: np.ndarray  # [positions, k], in the order of ids
    margin: np.ndarray  # [positions] (NaN where the router logits were not captured)


def read_routes(path: str | Path) -> dict[int, LayerRoutes]:
    """One engine's routing table: layer -> its chosen experts."""
    table = Trace(path)
    layers: dict[int, LayerRoutes] = {}
    for name in table.tensors:
        if not name.endswith(".experts"):
            continue
        layer = int(name.split(".")[1])
        first, end = table.span(name)
        ids = table.rows(name, first, end)
        weights = table.rows(layer_point(layer, "expert_weights"), first, end)
        margin_name = layer_point(layer, "router_margin")
        margin = table.rows(margin_name, first, end)[:, 0] if margin_name in table.tensors \
            else np.full(len(ids), np.nan)
        order = np.argsort(ids, axis=1, kind="stable")
        layers[layer] = LayerRoutes(np.take_along_axis(ids, order, 1).astype(np.int64),
                                    np.take_along_axis(weights, order, 1), margin)
    return layers


def compare_routes(reference: dict[int, LayerRoutes], other: dict[int, LayerRoutes]) -> pd.DataFrame:
    """Per layer both engines routed and position: same (the expert sets are equal), weight_diff (the largest
    difference of a chosen expert's weight; NaN where the sets differ), both experts and margins."""
    frames = []
    for layer in sorted(set(reference) & set(other)):
        x, y = reference[layer], other[layer]
        rows = min(len(x.ids), len(y.ids))
        if x.ids.shape[1] == y.ids.shape[1]:
            same = (x.ids[:rows] == y.ids[:rows]).all(axis=1)
            diff = np.where(same, np.abs(x.weights[:rows] - y.weights[:rows]).max(axis=1), np.nan)
        else:  # a different number of experts chosen per token: no position agrees
            same, diff = np.zeros(rows, dtype=bool), np.full(rows, np.nan)
        frames.append(pd.DataFrame({
            "layer": layer, "position": np.arange(rows), "same": same, "weight_diff": diff,
            "ref_experts": [",".join(map(str, r)) for r in x.ids[:rows]],
            "engine_experts": [",".join(map(str, r)) for r in y.ids[:rows]],
            "ref_margin": x.margin[:rows], "engine_margin": y.margin[:rows]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["layer", "position", "same", "weight_diff", "ref_experts", "engine_experts", "ref_margin",
                 "engine_margin"])


def weight_floor(compared: pd.DataFrame | None) -> dict[int, float]:
    """Per layer, the largest weight difference of the experts both chose, from the noise floor's pass against the
    reference (compare_routes' frame; None: no floor routed)."""
    if compared is None or compared.empty:
        return {}
    return {int(layer): float(np.nan_to_num(rows["weight_diff"].max(), nan=0.0))
            for layer, rows in compared.groupby("layer")}


def classify(compared: pd.DataFrame, errors: pd.DataFrame, points: pd.DataFrame, k: float,
             weights: dict[int, float] | None = None) -> pd.DataFrame:
    """compared with a `kind` per (layer, position): same, weighting, near_tie_flip, router or routing_rule.
    errors: the engine's per-point, per-position metrics (errors.parquet's rows); points: its per-point summary with
    floor and threshold (harness.compare.trace_diff.against_floor); weights: the weights' floor per layer
    (weight_floor; a layer without one: float32's rounding unit)."""
    out = compared.copy()
    if out.empty:
        return out.assign(kind=pd.Series(dtype=str), router_diff=pd.Series(dtype=float))
    router = errors[errors["point"].str.endswith(".router")].set_index(["layer", "position"])
    keys = pd.MultiIndex.from_arrays([out["layer"], out["position"]])
    diff = router["max_abs"].reindex(keys).to_numpy()
    rel = router["rel_l2"].reindex(keys).to_numpy()
    by_point = points.set_index("point")
    names = [layer_point(int(layer), "router") for layer in out["layer"]]
    threshold = by_point["threshold"].reindex(names).to_numpy() if "threshold" in by_point else np.full(len(out),
                                                                                                          np.inf)
    ref_margin, engine_margin = out["ref_margin"].to_numpy(), out["engine_margin"].to_numpy()
    margin = np.fmin(ref_margin, engine_margin)
    # apart: the router logits left their floor (the point, judged over its blocks) and are beyond its threshold at
    # this position; one position's rounding above a block's threshold is not the router being apart
    router_out = by_point["leaves_floor"].reindex(names).fillna(False).to_numpy(dtype=bool) \
        if "leaves_floor" in by_point else np.ones(len(out), dtype=bool)
    apart = router_out & (np.nan_to_num(rel, nan=0.0) > np.nan_to_num(threshold, nan=np.inf))
    # a tie: both margins at least 0 (a negative one: an engine chose against its own ranking, never a tie) and
    # within what the router logits' difference can reorder
    tie = (margin >= 0) & (margin <= TIE_BAND * np.nan_to_num(diff, nan=0.0))
    unread = np.isnan(margin) & ~apart  # no router logits captured: no margin to judge the flip by
    flip_kind = np.where(apart, "router", np.where(unread, "flip", np.where(tie, "near_tie_flip", "routing_rule")))
    weight_floors = np.array([(weights or {}).get(int(layer), 0.0) for layer in out["layer"]])
    weighted = out["weight_diff"].to_numpy() > k * np.maximum(weight_floors, np.finfo(np.float32).eps)
    out["kind"] = np.where(~out["same"].to_numpy(), flip_kind, np.where(weighted, "weighting", "same"))
    out["router_diff"] = np.abs(diff)  # max_abs of an all-zero difference is -0.0
    return out


def grid(classified: pd.DataFrame) -> list[str]:
    """One line per layer, one mark per position (GRID_LEGEND)."""
    return [f"layer {layer}: " + "".join(GRID_MARK[k] for k in rows.sort_values("position")["kind"])
            for layer, rows in classified.groupby("layer", sort=True)]


def reading(classified: pd.DataFrame, layer: int | None = None,
            within: np.ndarray | None = None) -> dict[str, Any] | None:
    """The routing difference to report (in `layer` when given, else in the first layer with one; among the rows
    `within` selects, when given): the most serious kind, a flip not at a tie before a near-tie flip before a
    weighting difference (so a layer reads as benign only when every flip in it is a near-tie), at its first
    position; both engines' experts and margins there, and how much of the routing agrees (over every row)."""
    if classified.empty:
        return None
    rows = classified if layer is None else classified[classified["layer"] == layer]
    if within is not None:  # a mask over classified's rows (positional)
        rows = rows[within[classified.index.get_indexer(rows.index)]]
    differs = rows[rows["kind"] != "same"]
    total = {"positions": int(len(classified)), "same_experts": int(classified["same"].sum()),
             "flips": int((~classified["same"]).sum()),
             "near_tie_flips": int((classified["kind"] == "near_tie_flip").sum())}
    if differs.empty:
        return {"kind": "same", **total}
    first_layer = differs[differs["layer"] == differs["layer"].min()]
    first = first_layer.assign(severity=first_layer["kind"].map(SEVERITY)).sort_values(
        ["severity", "position"]).iloc[0]
    return {"kind": first["kind"], "layer": int(first["layer"]), "position": int(first["position"]),
            "ref_experts": first["ref_experts"], "engine_experts": first["engine_experts"],
            "ref_margin": float(first["ref_margin"]), "engine_margin": float(first["engine_margin"]),
            "router_diff": float(first["router_diff"]), "weight_diff": float(first["weight_diff"]), **total}


def experts_at(classified: pd.DataFrame, layer: int, position: int) -> str:
    """The reference's chosen experts at a layer and position ('' where not routed)."""
    row = classified[(classified["layer"] == layer) & (classified["position"] == position)]
    return row["ref_experts"].iloc[0] if len(row) else ""


def sentence(found: dict[str, Any], engine: str) -> str:
    """A routing reading in words."""
    if found["kind"] == "same":
        return (f"the chosen experts agree at all {found['positions']} (layer, position) pairs, their weights within "
                "the threshold (k x the weights' floor)")
    where = f"layer {found['layer']} position {found['position']}"
    if found["kind"] == "weighting":
        return (f"{KIND_WORDS['weighting']}: first at {where}, experts {{{found['ref_experts']}}} in both, weights "
                f"apart by {found['weight_diff']:.3g}")
    below = ": its own scores rank an unchosen expert above a chosen one" if found["engine_margin"] < 0 else ""
    return (f"{KIND_WORDS[found['kind']]}: first at {where}, experts {{{found['ref_experts']}}} in the reference "
            f"(margin {found['ref_margin']:.3g}) and {{{found['engine_experts']}}} in {engine} (margin "
            f"{found['engine_margin']:.3g}{below}), router logits apart by {found['router_diff']:.3g} there; "
            f"{found['flips']} of {found['positions']} (layer, position) pairs chose other experts "
            f"({found['near_tie_flips']} at a near-tie)")
