"""Render `parity explain` results: explain/summary.md and the lines the CLI prints."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.rundir.store import write_atomic

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """Log-scale bars of positive values (zeros and non-finite values shown as the lowest bar and '!')."""
    logs = [math.log10(v) for v in values if v > 0 and math.isfinite(v)]
    if not logs:
        return BLOCKS[0] * len(values)
    lo, hi = min(logs), max(logs)
    if hi == lo:  # one value above zero (a fault in one layer, every other bit for bit alike): it is the highest
        lo = hi - 1.0
    span = hi - lo
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("!")
        elif v <= 0:
            out.append(BLOCKS[0])
        else:
            out.append(BLOCKS[min(len(BLOCKS) - 1, int((math.log10(v) - lo) / span * len(BLOCKS)))])
    return "".join(out)


def curve_line(curve: list[dict[str, Any]], k: float | None = None, forced: bool = False) -> str:
    """One line: residual-stream error per layer as bars (forced: what each layer adds), its range, and the largest
    error/floor ratio against the threshold (k x the floor)."""
    if not curve:
        return "error curve: no layers compared"
    errors = [c["error"] for c in curve]
    ratios = [c["error"] / c["floor"] for c in curve if c["floor"] > 0 and math.isfinite(c["error"])]
    largest = max(ratios or [0])
    threshold = f", {'above' if largest > k else 'below'} the threshold ({k:g}x the floor)" if k else ""
    what = "error each layer adds" if forced else "residual error by layer"
    return (f"{what} {curve[0]['layer']}..{curve[-1]['layer']}: {sparkline(errors)} "
            f"{min(errors):.2g} .. {max(errors):.2g} (max {largest:.2g}x the floor{threshold})")


def localisation_lines(loc: dict[str, Any]) -> list[str]:
    lines = [f"{loc['case_id']} [{loc['engine']} vs {loc['reference']}]: {loc['cause']}", f"  {loc['verdict']}"]
    if loc.get("first_difference"):
        fd = loc["first_difference"]
        lines.append(f"  first difference: {fd['point']} (relative error {fd['error']:.3g})")
    if loc.get("curve"):
        lines.append(f"  {curve_line(loc['curve'], loc.get('k'), bool(loc.get('forced')))}")
    return lines


GRID_WIDTH = 120  # positions of the routing grid shown per line in summary.md (routing.parquet has them all)


def routing_lines(routing: dict[str, Any]) -> list[str]:
    """The routing view: one line per layer, one mark per position."""
    lines = ["", f"Chosen experts per layer and position ({routing['legend']}):", "", "```"]
    for line in routing["grid"]:
        label, marks = line.split(": ", 1)
        more = f" ... {len(marks) - GRID_WIDTH} more positions" if len(marks) > GRID_WIDTH else ""
        lines.append(f"{label:>9}: {marks[:GRID_WIDTH]}{more}")
    return [*lines, "```"]


def write_markdown(path: Path, scenario: str, run_id: str, meta: dict[str, Any], decode: Callable[[int], str]) -> None:
    lines = [f"# explain: {scenario}, run {run_id}", "",
             f"- noise floor: {meta['floor']}; a capture point leaves it when its relative error exceeds "
             f"{meta['k']:g} x the floor", f"- cases: {', '.join(meta['cases']) or 'none'}"]
    if meta.get("forced"):
        lines.append(f"- layer-forced (each layer started from the reference's input): {', '.join(meta['forced'])}")
    if meta.get("free_floor"):
        lines.append(f"- the engines whose layers ran free: {meta['free_floor']}")
    lines += [f"- note: {n}" for n in meta["notes"]]
    for loc in meta["localisations"]:
        k = loc.get("k") or meta["k"]
        lines += ["", f"## {loc['case_id']}: {loc['engine']} vs {loc['reference']}", "",
                  f"**{loc['cause']}**: {loc['verdict']}", ""]
        out = loc.get("out_of_floor")
        if out:
            error = out.get("block_error", out["error"])
            lines += [f"| point | component | error | floor | x floor (threshold {k:g}x) | x inputs | "
                      "worst position |",
                      "|---|---|---|---|---|---|---|",
                      f"| {out['point']} | {out['cause']} | {error:.3g} | {out['floor']:.3g} | "
                      f"{out['ratio']:.3g} | {out.get('jump', float('nan')):.3g} | {out['position']} |", ""]
        d = loc.get("divergence")
        if d:
            lines += [f"| first divergent step {d['step']} | chose | raw top-2 | margin | teacher-forced top-2 | "
                      "margin |", "|---|---|---|---|---|---|"]
            for who, prefix, forced in ((loc["reference"], "ref", "forced_ref"), (loc["engine"], "engine",
                                                                                  "forced_engine")):
                lines.append(f"| {who} | {decode(d[prefix + '_token'])!r} | {[decode(t) for t in d[prefix + '_top']]} "
                             f"| {d[prefix + '_margin']:.3g} | {[decode(t) for t in d[forced + '_top']]} | "
                             f"{d[forced + '_margin']:.3g} |")
            lines.append("")
        if loc.get("curve"):
            what = ("What each layer adds to the residual stream, started from the reference's input (relative L2, "
                    "RMS over its worst block of positions):" if loc.get("forced") else
                    "Residual stream after each layer (relative L2 at the worst position):")
            lines += [what, "", f"| layer | error | floor | x floor (threshold {k:g}x) |", "|---|---|---|---|"]
            lines += [f"| {c['layer']} | {c['error']:.3g} | {c['floor']:.3g} | {c['error'] / c['floor']:.3g} |"
                      for c in loc["curve"]]
        if loc.get("routing"):
            lines += routing_lines(loc["routing"])
    lines += ["", "Per point and position: `errors.parquet`; per point with floor and ratio: `points.parquet`; the "
              "chosen experts compared per layer and position (a mixture-of-experts model): `routing.parquet`."]
    write_atomic(path, "\n".join(lines) + "\n")
