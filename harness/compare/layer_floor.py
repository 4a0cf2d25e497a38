"""The noise floor of a layer-forced pass (adapters.tracing.forcing: every layer of the engine, and of the floor's pass,
starts from the reference's rows of its input), judged block by block of positions.

In a forced pass a point's error is what its own layer added, and the floor is the reference against itself on its
own weights in higher precision, forced the same way: arithmetic rounding and nothing else. Both are per position; a
single position's rounding error scatters several-fold from one position to the next (bfloat16 on SmolLM2: a point's
worst position is 2-5x its typical one, and the engine's and the floor's worst positions are not the same), so the
floor is not judged position by position nor by its worst position. The positions are cut into blocks of BLOCK, and
in each block the root mean square of the engine's per-position relative L2 is held against k times the floor's
over the same positions: the noise averages out within a block (clean HF against vLLM in bfloat16 stays within
1.6x of the floor), while a fault that changes a component's output by 2% at every position of a block stands at
3-4x. A fault confined to some positions shows in their blocks.

k and the least floor are set per dtype by the measured false-alarm check in benchmarks/floor_calibration.py (each
clean pair's largest ratio, beside the ratio of planted 2% faults): RULES below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

BLOCK = 32  # positions per block; the last block takes a remainder shorter than half a block


@dataclass(frozen=True)
class FloorRule:
    k: float  # a block leaves the floor when its error exceeds k x the floor's
    minimum: float  # the least floor, half the dtype's unit roundoff (a point both engines compute bit for bit alike
    # has a measured floor of 0)


# benchmarks/floor_calibration.py, 2026-12-02: bfloat16 clean pairs at most 1.66x their floor (the tiny MoE's block
# output in vLLM; Gemma 3 at 690 positions 1.55x, SmolLM2 1.30x), planted 2% faults at least 2.09x (an expert's output
# where it acts); float16 clean at most 1.49x (llama.cpp on F16 weights); float32 clean at most 2.11x, faults of 1% at
# 10^4x and more, so float32 keeps the k it had
RULES = {"float32": FloorRule(10.0, 2.0**-25), "bfloat16": FloorRule(2.0, 2.0**-9),
         "float16": FloorRule(2.0, 2.0**-12), "float64": FloorRule(10.0, 2.0**-54)}


def block_of(position: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each row's block: (position - the point's first position) // BLOCK."""
    return (position - first) // BLOCK


def _rows(frame: pd.DataFrame, excluded: pd.DataFrame | None, experts: pd.DataFrame | None) -> pd.DataFrame:
    """Each row of a per-position frame in its block (point, block, position, rel_l2, kept): blocks of BLOCK
    positions, numbered from 0; and, for a mixture of experts' block output (`moe` points), each expert's positions
    (those the reference routed to it) as a block of its own, numbered -1 - expert, so a fault in one expert is
    judged where that expert acts. excluded: (layer, position) pairs at which every point of that layer but its
    router is not judged (the router logits are what a flip is read by; the points after them carry another
    expert's output)."""
    frame = frame[["point", "layer", "position", "rel_l2"]]
    first = frame.groupby("point", sort=False)["position"].transform("min").to_numpy()
    last = frame.groupby("point", sort=False)["position"].transform("max").to_numpy()
    block = block_of(frame["position"].to_numpy(), first)
    final = block_of(last, first)
    short = (last - first + 1) - final * BLOCK < BLOCK // 2  # the last block is short: merged into the one before
    rows = frame.assign(block=np.where(short & (block == final) & (final > 0), final - 1, block))
    if experts is not None and len(experts):
        moe = rows[rows["point"].str.endswith(".moe")].drop(columns="block")
        rows = pd.concat([rows, moe.merge(experts, on=["layer", "position"]).assign(
            block=lambda t: -1 - t["expert"]).drop(columns="expert")], ignore_index=True)
    kept = np.ones(len(rows), dtype=bool)
    if excluded is not None and len(excluded):
        keys = pd.MultiIndex.from_frame(excluded[["layer", "position"]].astype(int))
        pairs = pd.MultiIndex.from_arrays([rows["layer"].astype(int), rows["position"].astype(int)])
        kept = rows["point"].str.endswith(".router").to_numpy() | ~pairs.isin(keys)
    return rows.assign(kept=kept)


def _blocks(frame: pd.DataFrame, excluded: pd.DataFrame | None, experts: pd.DataFrame | None) -> pd.DataFrame:
    """Per point and block: the RMS of rel_l2 over the positions kept, the block's first position and how many
    positions were left out (_rows)."""
    rows = _rows(frame, excluded, experts)
    table = rows.assign(squared=np.where(rows["kept"], rows["rel_l2"].to_numpy() ** 2, 0.0),
                        kept=rows["kept"].astype(int))
    out = table.groupby(["point", "block"], sort=False).agg(
        sum_squared=("squared", "sum"), kept=("kept", "sum"), start=("position", "min"),
        size=("position", "size")).reset_index()
    with np.errstate(all="ignore"):
        out["rms"] = np.sqrt(out["sum_squared"] / out["kept"])
    out["left_out"] = np.where(out["block"] >= 0, out["size"] - out["kept"], 0)  # an expert's block repeats them
    return out.drop(columns=["sum_squared"])


def block_words(block: int, start: int) -> str:
    """Which positions a block is, in words."""
    return f"the positions routed to expert {-1 - block}" if block < 0 else f"positions {start}.."


def against_forced_floor(summary: pd.DataFrame, per_position: pd.DataFrame, floor: pd.DataFrame | None, dtype: str,
                         k: float, excluded: pd.DataFrame | None = None,
                         floor_excluded: pd.DataFrame | None = None,
                         experts: pd.DataFrame | None = None) -> pd.DataFrame:
    """summary (harness.compare.trace_diff.summarize) with, per point: floor, threshold and ratio of its worst block
    (the block whose error is the largest multiple of its floor), block_error and block_start (that block's RMS error
    and first position), sensitivity (the largest threshold of any of its blocks: a change this large in any block
    of positions is seen), left_out (positions not judged: routing flips at a near-tie), leaves_floor and
    first_out_position. per_position: the engine's forced pass against the reference; floor: the floor's forced pass
    against the reference (per position; None: no floor, the least floor alone); experts: (layer, position, expert)
    the reference routed each position to (a mixture of experts)."""
    rule = RULES[dtype]
    engine = _blocks(per_position, excluded, experts)
    engine = engine[engine["kept"] > 0]  # a block whose every position was left out is not judged
    if floor is not None and len(floor):
        measured = _blocks(floor, floor_excluded, experts)
        # a floor block whose every position the floor's own routing flipped: the point's median floor stands in
        measured["rms"] = measured["rms"].fillna(measured.groupby("point")["rms"].transform("median"))
        engine = engine.merge(measured[["point", "block", "rms"]].rename(columns={"rms": "floor"}),
                              on=["point", "block"], how="left")
    else:
        engine = engine.assign(floor=np.nan)
    engine["floor"] = np.fmax(np.nan_to_num(engine["floor"].to_numpy(dtype=float), nan=0.0), rule.minimum)
    engine["threshold"] = k * engine["floor"]
    with np.errstate(all="ignore"):  # a non-finite error (inf/NaN in a capture) is as far out as it gets
        engine["ratio"] = np.where(np.isfinite(engine["rms"]), engine["rms"] / engine["floor"], np.inf)
    worst = engine.sort_values(["point", "ratio"], ascending=[True, False]).groupby("point", sort=False).head(1)
    worst = worst.set_index("point")
    reach = engine.groupby("point")["threshold"].max()
    left_out = engine.groupby("point")["left_out"].sum()
    out = summary.copy()
    names = out["point"]
    out["floor"] = worst["floor"].reindex(names).to_numpy()
    out["threshold"] = worst["threshold"].reindex(names).to_numpy()
    out["ratio"] = worst["ratio"].reindex(names).to_numpy()
    out["block_error"] = worst["rms"].reindex(names).to_numpy()
    out["block_start"] = worst["start"].reindex(names).fillna(-1).astype(int).to_numpy()
    out["block"] = worst["block"].reindex(names).fillna(0).astype(int).to_numpy()
    out["sensitivity"] = reach.reindex(names).to_numpy()
    out["left_out"] = left_out.reindex(names).fillna(0).astype(int).to_numpy()
    out["leaves_floor"] = out["ratio"].to_numpy() > k
    out["first_out_position"] = _first_out(engine, per_position, k).reindex(names).fillna(-1).astype(int).to_numpy()
    return out


def _first_out(blocks: pd.DataFrame, per_position: pd.DataFrame, k: float) -> pd.Series:
    """Per point, where along the sequence the engines part: in its first block that leaves the floor, the first
    position whose own error exceeds that block's threshold (else the block's first position)."""
    out = blocks[blocks["ratio"] > k].sort_values("start").groupby("point", sort=False).head(1).set_index("point")
    found = {}
    for point, row in out.iterrows():
        rows = per_position[(per_position["point"] == point) & (per_position["position"] >= row["start"])]  # an
        # expert's block: from its first position on, whichever expert a later position went to
        over = rows[rows["rel_l2"].to_numpy() > row["threshold"]]
        found[point] = int(over["position"].min()) if len(over) else int(row["start"])
    return pd.Series(found, dtype=float)


def sensitivity(points: pd.DataFrame) -> dict[str, float | str] | None:
    """The smallest change the comparison can tell from rounding, over every point: the largest per-point
    sensitivity and the point it belongs to (None where no point was judged this way)."""
    if "sensitivity" not in points or points["sensitivity"].isna().all():
        return None
    row = points.loc[points["sensitivity"].idxmax()]
    return {"threshold": float(row["sensitivity"]), "point": str(row["point"])}
