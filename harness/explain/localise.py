"""From per-point errors (engine vs reference, with the noise floor) to a localisation in plain words: where the
engines' computations part, which component that implicates, and why the tokens differ.

Candidate causes, checked in this order: prompt/tokenisation (prompt ids differ), numerical hazard (inf/NaN), the
first capture point that leaves the noise floor (fused projection, attention kernel, rope, MLP, norm, ...), sampler
or penalty semantics (logits agree within noise but tokens differ), a near-tie (both within noise, the top-2 logits
of the two engines rank the tokens differently by a hair), an ending (the same tokens, one engine stops sooner), or
no difference at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from harness.compare import routing as routes
from harness.compare.layer_floor import block_words, sensitivity
from harness.core.points import COMPONENT, in_words, layer_point, parse
from harness.core.shards import ShardReading
from harness.rundir.localisations import Localisation

Decode = Callable[[int], str]


class Divergence(BaseModel):
    """The first step where the generated tokens differ, seen two ways: as generated (each engine's raw top-2 and
    margin from its own run, KV cache and all) and teacher-forced (both engines' raw logits from one full pass over
    the same tokens, the pass the capture points come from)."""

    step: int
    ref_token: int
    engine_token: int
    ref_top: list[int]
    ref_margin: float
    engine_top: list[int]
    engine_margin: float
    ref_took_argmax: bool  # the chosen token is (tied with) the top of the engine's own raw logits
    engine_took_argmax: bool
    position: int
    forced_ref_top: list[int]
    forced_ref_margin: float
    forced_engine_top: list[int]
    forced_engine_margin: float

    @property
    def picked_after_logits(self) -> bool:
        """An engine chose a token other than its raw argmax: penalties, sampling or the sampler decided."""
        return not (self.ref_took_argmax and self.engine_took_argmax)


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def candidate_cause(point: str, component: str, fused_ref: set[str], fused_engine: set[str],
                    reference: str, engine: str, caches: dict[str, str] | None = None) -> str:
    """The component a point implicates, naming a fusion when one engine fuses that projection and the other not, and
    at attention's output a KV cache one engine holds below full precision (caches: engine -> its cache's dtype, from
    its configuration as its trace records it; given only where the point reads attention's output)."""
    name = parse(point)[1]
    held = {who: dtype for who, dtype in (caches or {}).items() if who in (reference, engine)}
    if held:
        said = " and ".join(f"{who} holds it in {dtype}" for who, dtype in held.items())
        where = component if name == "attn" else f"{component}, the first point after attention captured"
        return (f"the KV cache: {said} (its configuration), and attention reads its keys and values back from it "
                f"({where})")
    if name in fused_ref ^ fused_engine:
        fuser, other = (engine, reference) if name in fused_engine else (reference, engine)
        parts = "q, k and v" if name in ("q", "k", "v") else "gate and up"
        return (f"fused projection: {fuser} computes {parts} in one fused matmul, {other} in separate ones "
                f"({component})")
    return component


def reads_attention(point: str, captured: set[str]) -> bool:
    """Whether a point is attention's output, or the first point after it where an engine's map captures none
    (llama.cpp's o_proj)."""
    layer, name = parse(point)
    return name == "attn" or (name == "o_proj" and layer_point(layer, "attn") not in captured)


def jump(points: pd.DataFrame, index: int, forced: bool = False) -> float:
    """How much a point's error exceeds the largest error among what feeds it: the points before it in its layer
    and the residual stream entering the layer (a forced pass: its layer started from the reference's input, so the
    points before it in its layer only). The errors compared are the judged ones (a forced pass: each point's worst
    block)."""
    column = "block_error" if forced else "error"
    row = points.iloc[index]
    before = points.iloc[:index]
    same_layer = before[before["layer"] == row["layer"]][column]
    incoming = before[before["point"].str.endswith(".residual") | (before["point"] == "embeddings")][column].tail(1)
    inputs = pd.concat([same_layer] if forced else [same_layer, incoming]).max() if index else 0.0
    return float(row[column] / inputs) if inputs and inputs > 0 else float("inf")


def error_curve(points: pd.DataFrame) -> list[dict[str, Any]]:
    """The residual stream's error and floor by layer (a forced pass: what each layer adds, its worst block's)."""
    residual = points[points["point"].str.endswith(".residual")]
    column = "block_error" if "block_error" in points else "error"
    return [{"layer": int(layer), "error": float(error), "floor": float(floor)}
            for layer, error, floor in zip(residual["layer"], residual[column], residual["floor"], strict=True)]


def localise(points: pd.DataFrame, *, case_id: str, engine: str, reference: str, prompt_equal: bool,
             divergence: Divergence | None, nonfinite: dict[str, dict[str, int]], fused: dict[str, set[str]],
             param_note: str, k: float, decode: Decode, ending: str = "", missing_map: str = "",
             near_tie: bool = False, routing: pd.DataFrame | None = None,
             adapter: dict[str, Any] | None = None, forced: bool = False, run_reading: str = "",
             shards: dict[str, ShardReading] | None = None, caches: dict[str, str] | None = None) -> Localisation:
    """points: against_floor() (or, forced, against_forced_floor()) output for this engine vs the reference, in
    forward order. ending: how the engines stop at different steps when the run judged them apart with no differing
    token to look at. missing_map: why no point inside the model was captured by both (only the logits were
    compared). near_tie: the run judged the divergence a near-tie (where it did not and no point leaves its floor,
    the cause is beyond_noise, with the run's reason: run_reading). routing: both engines' chosen experts compared
    (harness.compare.routing.classify). adapter: both engines' LoRA updates compared
    (harness.explain.adapter_reading.compare). forced: the engine's layers started from the reference's input.
    shards: a tensor-parallel engine's split points, where in its ranks each one's difference lives
    (harness.core.shards). caches: each engine's KV cache dtype where it holds the cache below full precision."""
    if set(points["point"]) <= {"logits"}:
        return _logits_only(points, case_id=case_id, engine=engine, reference=reference, prompt_equal=prompt_equal,
                            divergence=divergence, nonfinite=nonfinite, k=k, decode=decode, ending=ending,
                            missing_map=missing_map, near_tie=near_tie, param_note=param_note)
    base = dict(case_id=case_id, engine=engine, reference=reference, k=k,
                first_step=divergence.step if divergence else None,
                divergence=divergence.model_dump() if divergence else None, curve=error_curve(points),
                forced=forced, sensitivity=sensitivity(points) if forced else None)
    overall = routes.reading(routing) if routing is not None else None
    said_after = f" Routing: {routes.sentence(overall, engine)}." if overall else ""  # routing and LoRA readings
    if overall:
        base["routing"] = {**overall, "grid": routes.grid(routing), "legend": routes.GRID_LEGEND}
    if adapter:
        base["adapter"] = adapter
        said_after += f" LoRA: {adapter['sentence']}."
    differs = points[points["error"] > 0]
    if len(differs):
        first = differs.iloc[0]
        base["first_difference"] = {"point": first["point"], "error": float(first["error"])}
    step_note = _step_note(divergence, decode, engine) if divergence else "The generated tokens agree"

    if not prompt_equal:
        return Localisation(cause="prompt", verdict="prompt token ids differ between the engines: a tokenisation or "
                            "chat-template difference, not a numerical one", **base)
    hazard = _hazard(nonfinite, points)
    if hazard:
        return Localisation(cause="hazard", verdict=hazard, **base)
    out = points[points["leaves_floor"]]
    if len(out):
        index = int(np.flatnonzero(points["leaves_floor"].to_numpy())[0])
        row = points.iloc[index]
        cause = candidate_cause(row["point"], row["component"], fused.get(reference, set()),
                                fused.get(engine, set()), reference, engine,
                                caches if reads_attention(row["point"], set(points["point"])) else None)
        grew = jump(points, index, forced)
        base["out_of_floor"] = {"point": row["point"], "layer": int(row["layer"]), "component": row["component"],
                                "cause": cause, "error": float(row["error"]), "floor": float(row["floor"]),
                                "ratio": float(row["ratio"]), "jump": grew, "position": int(row["worst_position"]),
                                "first_position": int(row.get("first_out_position", row["worst_position"]))}
        if forced:
            base["out_of_floor"].update(block_error=float(row["block_error"]), block_start=int(row["block_start"]))
        origin = ("its inputs agree exactly, so the difference starts here" if grew == float("inf")
                  else f"{_fmt(grew)}x the error of its inputs")
        if forced:
            origin = ("its layer started from the reference's input, so the difference starts in this layer" +
                      ("" if grew == float("inf") else f" ({_fmt(grew)}x the error of the points before it there)"))
        since = base["out_of_floor"]["first_position"]
        moe = _moe_reading(routing, row, engine) if routing is not None else None
        if moe:
            base["out_of_floor"]["routing"], cause, said_after = moe[0], moe[1], ""
        shard = (shards or {}).get(row["point"])
        if shard is not None:
            base["out_of_floor"]["shards"] = {"ranks": shard.ranks, "words": shard.words}
            cause = (f"{row['component']} {shard.words}: one rank's shard differs, not what every rank computes alike"
                     if shard.ranks else f"{cause}, {shard.words}")
            base["out_of_floor"]["cause"] = cause
        if adapter and adapter["kind"] != "same":
            base["out_of_floor"]["adapter"] = adapter["kind"]
            cause, said_after = f"{cause}; the LoRA adapter: {adapter['sentence']}", ""
        measured = (f"relative error {_fmt(row['block_error'])} over "
                    f"{block_words(int(row['block']), int(row['block_start']))} (RMS over a block) is "
                    f"{_fmt(row['ratio'])}x the floor there ({_fmt(row['floor'])}; threshold {k:g}x)"
                    if forced else f"relative error {_fmt(row['error'])} is {_fmt(row['ratio'])}x the floor "
                    f"({_fmt(row['floor'])}; threshold {k:g}x)")
        verdict = (f"{in_words(row['point'])} leaves the noise floor first (from position {since}): {measured}, "
                   f"{origin}. Candidate cause: {cause}. {step_note}.{said_after}")
        # a point out of its floor is never benign: near-tie routing flips are left out of what is judged
        return Localisation(cause="component", verdict=verdict, **base)
    worst = points.loc[points["ratio"].idxmax()]
    within = (f"every capture point stays below the threshold ({k:g}x the floor; largest: "
              f"{in_words(worst['point'])} at {_fmt(worst['ratio'])}x the floor)")
    if base["sensitivity"]:
        reach = base["sensitivity"]
        within += (f"; none above {100 * reach['threshold']:.3g}% (the largest threshold, at "
                   f"{in_words(reach['point'])}: a change in any block of positions beyond it is seen)")
    first = base.get("first_difference")
    drift = (f"; the engines first differ at {in_words(first['point'])} ({COMPONENT.get(parse(first['point'])[1])})"
             if first else "; the engines' activations are bit-identical")
    if divergence is None and ending:
        return Localisation(cause="ending", verdict=f"{ending}; {within}{drift}.{said_after}", **base)
    if divergence is None:
        return Localisation(cause="none", verdict=f"no divergence: {within}{drift}.{said_after}", **base)
    if divergence.picked_after_logits:
        d = divergence
        verdict = (f"logits agree within noise but tokens differ: {within}; at step {d.step} the reference's raw "
                   f"logits rank {decode(d.ref_top[0])!r} first and it chose {decode(d.ref_token)!r}, {engine}'s "
                   f"rank {decode(d.engine_top[0])!r} first and it chose {decode(d.engine_token)!r}: the tokens "
                   "were picked after the logits, so the difference is in the sampler or penalty semantics")
        return Localisation(cause="sampler", verdict=verdict + (f"; {param_note}" if param_note else "") + said_after,
                            **base)
    if near_tie:
        verdict = (f"near-tie: {step_note[0].lower()}{step_note[1:]}; {within}{drift}; a drift this small flips only "
                   f"near-tied tokens.{said_after}")
        return Localisation(cause="near_tie", verdict=verdict, **base)
    verdict = (f"beyond the measured noise: {step_note[0].lower()}{step_note[1:]}; {within}{drift}; yet the run "
               f"judged the divergence no near-tie ({run_reading or 'its margin is beyond the measured noise'}): "
               f"differences below every floor added up beyond rounding.{said_after}")
    return Localisation(cause="beyond_noise", verdict=verdict, **base)


def _moe_reading(routing: pd.DataFrame, row: pd.Series, engine: str) -> tuple[str, str] | None:
    """Where a mixture-of-experts point leaves the floor first: (kind, candidate cause in words) from the chosen
    experts of its layer, or None for any other point."""
    name = parse(row["point"])[1]
    if name not in ("router", "moe"):
        return None
    judged = None
    if name == "moe" and "out" in routing:  # what routing did where the block's output is out of the floor: a
        # near-tie flip elsewhere in the layer does not excuse it
        unexcused = (routing["kind"] != "near_tie_flip").to_numpy()
        out = routing["out"].to_numpy(dtype=bool) & unexcused
        judged = out if out[(routing["layer"] == int(row["layer"])).to_numpy()].any() else unexcused
    found = routes.reading(routing, int(row["layer"]), judged)
    if found is None:
        return None
    if found["kind"] != "same":
        return found["kind"], f"{row['component']}: {routes.sentence(found, engine)}"
    if name == "router":
        return None
    chosen = routes.experts_at(routing, int(row["layer"]), int(row["worst_position"]))
    return "expert_kernel", (f"{row['component']}: {routes.KIND_WORDS['expert_kernel']}; the experts chosen at "
                             f"position {int(row['worst_position'])}: {{{chosen}}}")


def _step_note(d: Divergence, decode: Decode, engine: str) -> str:
    ref_tok, engine_tok = decode(d.ref_token), decode(d.engine_token)
    if d.picked_after_logits:
        return (f"Tokens first differ at step {d.step} ({ref_tok!r} vs {engine_tok!r}), where the raw logits rank "
                f"{decode(d.ref_top[0])!r} and {decode(d.engine_top[0])!r} first")
    forced = ("teacher-forced, both rank the same token first" if d.forced_ref_top[0] == d.forced_engine_top[0]
              else f"teacher-forced, the margins are {_fmt(d.forced_ref_margin)} and {_fmt(d.forced_engine_margin)}")
    return (f"Tokens first differ at step {d.step}: the reference's logits put {ref_tok!r} on top with a margin of "
            f"{_fmt(d.ref_margin)} nats, {engine}'s put {engine_tok!r} on top with {_fmt(d.engine_margin)} nats "
            f"({forced})")


def _hazard(nonfinite: dict[str, dict[str, int]], points: pd.DataFrame) -> str:
    order = {p: i for i, p in enumerate(points["point"])}
    found = [(order.get(point, len(order)), point, engine, count)
             for engine, bad in nonfinite.items() for point, count in bad.items()]
    if not found:
        return ""
    _, point, engine, count = min(found)
    return (f"numerical hazard: {engine} produces {count} inf/NaN value(s), first at {in_words(point)}; everything "
            "after it is poisoned")


def _logits_only(points: pd.DataFrame, *, case_id: str, engine: str, reference: str, prompt_equal: bool,
                 divergence: Divergence | None, nonfinite: dict[str, dict[str, int]], k: float, decode: Decode,
                 ending: str, missing_map: str, near_tie: bool, param_note: str) -> Localisation:
    """Only the logits were compared (no per-layer map in one engine or both): say what was measured there, the
    logits' difference and where it starts, whether the tokens agree and whether at a near-tie, and that nothing
    inside the model can be named. No component and no "inputs agree": no input was measured."""
    base = dict(case_id=case_id, engine=engine, reference=reference, k=k,
                first_step=divergence.step if divergence else None,
                divergence=divergence.model_dump() if divergence else None)
    unmapped = (f"only the logits were compared ({missing_map or 'no per-layer map for this model'}), so where "
                "inside the model the difference starts cannot be localised: a per-layer map would "
                "(docs/adding-an-architecture.md)")
    if not prompt_equal:
        return Localisation(cause="prompt", verdict="prompt token ids differ between the engines: a tokenisation or "
                            f"chat-template difference, not a numerical one; {unmapped}", **base)
    hazard = _hazard(nonfinite, points)
    if hazard:
        return Localisation(cause="hazard", verdict=f"{hazard}; {unmapped}", **base)
    if divergence is None:
        tokens = ending or "the generated tokens agree"
    elif divergence.picked_after_logits:
        tokens = _step_note(divergence, decode, engine) + (f"; {param_note}" if param_note else "")
    else:
        tokens = _step_note(divergence, decode, engine) + ("; a near-tie" if near_tie else "; not a near-tie")
    row = points.iloc[0] if len(points) else None
    if row is None:
        return Localisation(cause="none", verdict=f"nothing compared; {tokens}; {unmapped}", **base)
    measured = (f"relative error {_fmt(row['error'])} is {_fmt(row['ratio'])}x the floor ({_fmt(row['floor'])}), "
                f"{'above' if row['leaves_floor'] else 'below'} the threshold ({k:g}x the floor)")
    if row["leaves_floor"]:
        since = int(row.get("first_out_position", row["worst_position"]))
        base["out_of_floor"] = {"point": "logits", "layer": int(row["layer"]), "component": row["component"],
                                "cause": "logits", "error": float(row["error"]), "floor": float(row["floor"]),
                                "ratio": float(row["ratio"]), "position": int(row["worst_position"]),
                                "first_position": since}
        return Localisation(cause="logits", verdict=f"the logits differ beyond the noise floor from position {since}: "
                            f"{measured}; {tokens}; {unmapped}", **base)
    cause = "none" if divergence is None and not ending else "ending" if divergence is None else \
        "sampler" if divergence.picked_after_logits else "near_tie"
    return Localisation(cause=cause, verdict=f"the logits stay within the noise floor: {measured}; {tokens}; "
                        f"{unmapped}", **base)
