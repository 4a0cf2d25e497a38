"""The report sections of the investigations that write into a run directory: `parity explain` (where a divergence
starts, with each localisation's error curve against the noise floor) and `parity transplant` (samplers swapped)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from harness.render.html_parts import esc, svg_plot
from harness.render.page import Page
from harness.report.sections import ReportSection
from harness.rundir.localisations import ExplainFile
from harness.rundir.store import read_json


class _Transplanted(BaseModel):
    """What the report reads of each verdict in transplant/verdicts.json (written by `parity transplant`)."""

    case_id: str
    engine: str
    cause: str
    verdict: str


def _explain_section(page: Page) -> str:
    """parity explain's localisations, each with the residual-stream error curve against the noise floor."""
    data = read_json(page.run_dir, "explain/localisation.json", ExplainFile)
    if data is None:
        return ""
    out = [f"<h2 id='explain'>Explain</h2><p>Noise floor: {esc(data.floor)}; a capture point leaves it when its "
           f"relative error exceeds {data.k:g} x the floor. Per point: <code>explain/points.parquet</code>; per "
           "point and position: <code>explain/errors.parquet</code>.</p>"]
    for loc in data.localisations:
        out.append(f"<div class='case'><h3>{esc(loc.case_id)}: {esc(loc.engine)} vs {esc(loc.reference)}: "
                   f"{esc(loc.cause)}</h3><p>{esc(loc.verdict)}</p>")
        if loc.curve:
            layers, k = [c.layer for c in loc.curve], loc.k or data.k
            title = ("what each layer adds to the residual stream (relative error, worst block)" if loc.forced else
                     "residual stream after each layer: relative error (worst position)")
            out.append(svg_plot({"error": (layers, [c.error for c in loc.curve]),
                                 "noise floor": (layers, [c.floor for c in loc.curve]),
                                 f"threshold ({k:g}x the floor)": (layers, [k * c.floor for c in loc.curve])},
                                title, xlabel="layer"))
        if loc.routing:
            out.append(_routing_view(loc.routing))
        out.append("</div>")
    return "".join(out)


ROUTE_COLOUR = {"w": "#9a6700", "~": "#0969da", "r": "#8250df", "x": "#cf222e"}


def _routing_view(routing: dict[str, Any]) -> str:
    """The chosen experts compared per layer (rows) and position (columns), a mark per pair, differences coloured."""
    lines = []
    for line in routing["grid"]:
        label, marks = line.split(": ", 1)
        cells = "".join(f"<b style='color:{ROUTE_COLOUR[m]}'>{m}</b>" if m in ROUTE_COLOUR else m for m in marks)
        lines.append(f"{esc(label):>9}: {cells}")
    return (f"<p>Chosen experts per layer and position ({esc(routing['legend'])}):</p>"
            f"<pre class='routing'>{chr(10).join(lines)}</pre>")


def _transplant_section(page: Page) -> str:
    verdicts = read_json(page.run_dir, "transplant/verdicts.json", list[_Transplanted])
    if verdicts is None:
        return ""
    rows = ["<h2 id='transplant'>Sampler transplant</h2><table><tr><th>case</th><th>engine</th><th>cause</th>"
            "<th>verdict</th></tr>"]
    rows += [f"<tr><td>{esc(v.case_id)}</td><td>{esc(v.engine)}</td><td>{esc(v.cause)}</td>"
             f"<td>{esc(v.verdict)}</td></tr>" for v in verdicts]
    return "\n".join(rows) + "</table>"


EXPLAIN = ReportSection("explain", _explain_section)
TRANSPLANT = ReportSection("transplant", _transplant_section)
