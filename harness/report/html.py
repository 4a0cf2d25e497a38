"""`parity report RUN_DIR`: one self-contained HTML file (no network, no CDN; plots are inline SVG) built from a
run directory alone: verdicts, aligned tokens with the first divergence and its top-k alternatives, per-step
logprob-delta plots, the params each engine was sent with differences marked, versions and machine."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from harness.compare.verdicts import VERDICT_TYPES
from harness.report.summary import exposed_servers
from harness.run.store import RunMeta, read_json, read_meta, write_atomic
from harness.run.tables import RESULT_TYPES, STEP_TYPES, read_parquet

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;
vertical-align:top;font-size:13px}th{background:#f3f3f3}.match{color:#1a7f37}.benign_tie{color:#9a6700}
.diverged,.engine_error{color:#cf222e;font-weight:bold}.no{background:#ffebe9}.differs{background:#fff8c5}
.tokens{font-family:monospace;font-size:12px;line-height:1.9;white-space:pre-wrap}
.answer{font-family:monospace;font-size:12px;white-space:pre-wrap}.exposed{padding:6px;font-weight:bold}
.tok{border:1px solid #ddd;border-radius:3px;padding:0 2px;margin:1px}.tok.first{background:#ffcecb;
border-color:#cf222e}.tok.after{color:#888}.case{border-top:2px solid #ddd;margin-top:18px}
"""

SCRIPT = """
document.querySelectorAll('tr[data-case]').forEach(function (row) {
  row.style.cursor = 'pointer';
  row.addEventListener('click', function () {
    var target = document.getElementById('case-' + row.dataset.case);
    if (target) { target.scrollIntoView(); }
  });
});
document.body.dataset.ready = 'yes';
"""


def _e(value) -> str:
    return html.escape(str(value))


def svg_plot(series: dict[str, tuple[list[int], list[float]]], title: str, width: int = 560,
             height: int = 200, xlabel: str = "step") -> str:
    """A log-scale line plot of y >= 0 values as inline SVG (zeros drawn at the floor)."""
    colours = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#9a6700"]
    points = [(x, y) for xs, ys in series.values() for x, y in zip(xs, ys, strict=False) if y == y]
    if not points:
        return f"<p>{_e(title)}: no shared steps to plot.</p>"
    positive = [y for _, y in points if y > 0] or [1e-9]
    lo, hi = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
    hi = max(hi, lo + 1)
    x_max = max(max(x for x, _ in points), 1)
    left, right, top, bottom = 50, 10, 24, 28

    def sx(x: float) -> float:
        return left + (width - left - right) * x / x_max

    def sy(y: float) -> float:
        v = math.log10(y) if y > 0 else lo
        return top + (height - top - bottom) * (hi - min(max(v, lo), hi)) / (hi - lo)

    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img"><title>{_e(title)}</title>',
             f'<text x="{left}" y="14" font-size="12">{_e(title)}</text>']
    for exp in range(lo, hi + 1):
        y = sy(10.0 ** exp)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="4" y="{y + 4:.1f}" font-size="10">1e{exp}</text>')
    parts.append(f'<text x="{width - 60}" y="{height - 6}" font-size="10">{_e(xlabel)} (0..{x_max})</text>')
    for i, (name, (xs, ys)) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=False) if y == y)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        parts.append(f'<text x="{left + 10 + 150 * i}" y="{height - 6}" font-size="11" fill="{colour}">'
                     f'{_e(name)}</text>')
    return "".join(parts) + "</svg>"


def _decoder(meta: RunMeta) -> Callable[[int], str]:
    from harness.scenario.prompts import load_tokenizer

    reference = meta.engines.get(meta.reference)
    if reference is None:  # the run was interrupted before the reference started
        return lambda token: f"#{token}"
    path = Path(reference.model_path)
    try:
        tokenizer = load_tokenizer(path)
    except Exception:  # the model folder may be gone: show ids instead of text
        return lambda token: f"#{token}"
    return lambda token: tokenizer.decode([int(token)]) if token >= 0 else "(none)"


def _token_row(ids: list[int], first: int, decode) -> str:
    spans = []
    for i, token in enumerate(ids):
        cls = "tok first" if i == first else "tok after" if 0 <= first < i else "tok"
        spans.append(f'<span class="{cls}" title="step {i}, id {token}">{_e(decode(token))}</span>')
    return "".join(spans)


def _alternatives(steps: pd.DataFrame, engine: str, case_id: str, step: int, decode) -> str:
    row = steps[(steps.engine == engine) & (steps.case_id == case_id) & (steps.step == step)]
    if row.empty:
        return "<td>(no step)</td>"
    top = zip(row.iloc[0].top_ids, row.iloc[0].top_logprobs, strict=False)
    return "<td>" + "<br>".join(f"{_e(repr(decode(int(t))))} {lp:.3f}" for t, lp in top) + "</td>"


def _verdict_table(verdicts: pd.DataFrame) -> str:
    rows = ["<table id='verdicts'><tr><th>case</th><th>engine</th><th>verdict</th><th>as expected</th>"
            "<th>first divergence</th><th>max |Δlogprob|</th><th>explanation</th></tr>"]
    for i, r in enumerate(verdicts.itertuples()):
        first = "" if r.first_divergence is None or pd.isna(r.first_divergence) or r.first_divergence < 0 \
            else int(r.first_divergence)
        delta = "" if pd.isna(r.max_abs_logprob_delta) else f"{r.max_abs_logprob_delta:.2g}"
        rows.append(f"<tr data-case='{i}' class='{'' if r.expected else 'no'}'><td>{_e(r.case_id)}</td>"
                    f"<td>{_e(r.engine)}</td><td class='{_e(r.verdict)}'>{_e(r.verdict)}</td>"
                    f"<td>{'yes' if r.expected else 'NO'}</td><td>{first}</td><td>{delta}</td>"
                    f"<td>{_e(r.explanation)}</td></tr>")
    return "\n".join(rows) + "</table>"


def _case_section(i: int, v, results: pd.DataFrame, steps: pd.DataFrame, reference: str, decode) -> str:
    ref = results[(results.engine == reference) & (results.case_id == v.case_id)]
    oth = results[(results.engine == v.engine) & (results.case_id == v.case_id)]
    out = [f"<div class='case' id='case-{i}'><h3>{_e(v.case_id)}: {_e(v.engine)} vs {_e(reference)} "
           f"<span class='{_e(v.verdict)}'>{_e(v.verdict)}</span></h3><p>{_e(v.explanation)}</p>"]
    if ref.empty or oth.empty or v.verdict == "engine_error":
        return "".join(out) + "</div>"
    first = -1 if pd.isna(v.first_divergence) else int(v.first_divergence)
    out.append("<table class='aligned'>")
    for name, row in ((reference, ref.iloc[0]), (v.engine, oth.iloc[0])):
        out.append(f"<tr><th>{_e(name)}</th><td class='tokens'>{_token_row(list(row.token_ids), first, decode)}"
                   "</td></tr>")
    out.append("</table><table class='answers'>")
    for name, row in ((reference, ref.iloc[0]), (v.engine, oth.iloc[0])):  # engine output: text, always escaped
        out.append(f"<tr><th>{_e(name)} answer</th><td class='answer'>{_e(row.text)}</td></tr>")
    out.append("</table>")
    if first >= 0:
        out.append(f"<table class='alternatives'><tr><th colspan=2>top-k at step {first}</th></tr><tr>"
                   f"<th>{_e(reference)}</th><th>{_e(v.engine)}</th></tr><tr>"
                   f"{_alternatives(steps, reference, v.case_id, first, decode)}"
                   f"{_alternatives(steps, v.engine, v.case_id, first, decode)}</tr></table>")
    a = steps[(steps.engine == reference) & (steps.case_id == v.case_id)].set_index("step").chosen_logprob
    b = steps[(steps.engine == v.engine) & (steps.case_id == v.case_id)].set_index("step").chosen_logprob
    shared = a.index.intersection(b.index)
    shared = shared[shared < first] if first >= 0 else shared
    delta = (a[shared] - b[shared]).abs()
    out.append(svg_plot({v.engine: (list(shared), delta.tolist())},
                        f"|Δ chosen-token logprob| per step, {v.engine} vs {reference} (shared steps)"))
    return "".join(out) + "</div>"


def _params_table(results: pd.DataFrame) -> str:
    engines = list(dict.fromkeys(results.engine))
    first = {e: results[results.engine == e].iloc[0] for e in engines}
    canonical = {e: json.loads(first[e].params or "{}") for e in engines}
    native = {e: json.loads(first[e].native_params or "{}") for e in engines}
    rows = ["<table id='params'><tr><th>param</th>" + "".join(f"<th>{_e(e)}</th>" for e in engines) + "</tr>"]
    for label, table in (("canonical", canonical), ("sent to engine", native)):
        keys = sorted({k for values in table.values() for k in values})
        rows.append(f"<tr><th colspan='{len(engines) + 1}'>{label} (first case)</th></tr>")
        for key in keys:
            values = [table[e].get(key, "—") for e in engines]
            differs = label == "canonical" and len({json.dumps(v) for v in values}) > 1
            rows.append(f"<tr class='{'differs' if differs else ''}'><td>{_e(key)}</td>"
                        + "".join(f"<td>{_e(v)}</td>" for v in values) + "</tr>")
    return "\n".join(rows) + "</table>"


def _effective_table(results: pd.DataFrame) -> str:
    """What each engine's own code makes of the first case's params, differing rows marked."""
    from harness.semantics.effective import differing_fields, display
    from harness.types import COMPARED, Effective

    first = results.drop_duplicates("engine")
    by_engine = {r.engine: Effective.model_validate(json.loads(r.effective or "{}"))
                 for r in first.itertuples() if json.loads(r.effective or "{}").get("decoding")}
    if not by_engine:
        return "<p>No effective params recorded.</p>"
    differ = set(differing_fields(by_engine))
    rows = ["<table id='effective'><tr><th>param</th>" + "".join(f"<th>{_e(e)}</th>" for e in by_engine) + "</tr>"]
    for field in (*COMPARED, "processors"):
        rows.append(f"<tr class='{'differs' if field in differ else ''}'><td>{_e(field)}</td>"
                    + "".join(f"<td>{_e(display(getattr(e, field)))}</td>" for e in by_engine.values()) + "</tr>")
    notes = "".join(f"<li>{_e(name)}: {_e(note)}</li>" for name, e in by_engine.items() for note in e.notes)
    return "\n".join(rows) + "</table>" + (f"<ul>{notes}</ul>" if notes else "")


class _CurvePoint(BaseModel):
    layer: int
    error: float
    floor: float


class _Localisation(BaseModel):
    case_id: str
    engine: str
    reference: str
    cause: str
    verdict: str
    curve: list[_CurvePoint] = Field(default_factory=list)


class _Explained(BaseModel):
    """What the report reads of explain/localisation.json (written by `parity explain`)."""

    k: float
    floor: str
    localisations: list[_Localisation]


class _Transplanted(BaseModel):
    """What the report reads of each verdict in transplant/verdicts.json (written by `parity transplant`)."""

    case_id: str
    engine: str
    cause: str
    verdict: str


def _explain_section(run_dir: Path) -> str:
    """parity explain's localisations, each with the residual-stream error curve against the noise floor."""
    data = read_json(run_dir, "explain/localisation.json", _Explained)
    if data is None:
        return ""
    out = [f"<h2 id='explain'>Explain</h2><p>Noise floor: {_e(data.floor)}; a capture point leaves it when its "
           f"relative error exceeds {data.k:g} x the floor. Per point: <code>explain/points.parquet</code>; per "
           "point and position: <code>explain/errors.parquet</code>.</p>"]
    for loc in data.localisations:
        out.append(f"<div class='case'><h3>{_e(loc.case_id)}: {_e(loc.engine)} vs {_e(loc.reference)}: "
                   f"{_e(loc.cause)}</h3><p>{_e(loc.verdict)}</p>")
        if loc.curve:
            layers = [c.layer for c in loc.curve]
            out.append(svg_plot({"error": (layers, [c.error for c in loc.curve]),
                                 "noise floor": (layers, [c.floor for c in loc.curve])},
                                "residual stream after each layer: relative error (worst position)", xlabel="layer"))
        out.append("</div>")
    return "".join(out)


def _invariance_section(run_dir: Path) -> str:
    """Each engine against itself: the knob x engine table, then every knob's baseline, variant and why."""
    from harness.report.summary import invariance_table, knob_label

    rows = read_parquet(run_dir, "invariance.parquet", required=False)
    if rows is None or rows.empty:
        return ""
    headers, table = invariance_table(rows)
    out = ["<h2 id='invariance'>Invariance (each engine against itself)</h2><table id='invariance-table'><tr>"
           + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>"]
    out += ["<tr>" + "".join(f"<td class='{'no' if cell.endswith(' NO') else ''}'>{_e(cell)}</td>" for cell in row)
            + "</tr>" for row in table]
    out.append("</table><table><tr><th>engine</th><th>knob</th><th>baseline</th><th>variant</th><th>verdict</th>"
               "<th>explanation</th></tr>")
    out += [f"<tr class='{'' if r.expected else 'no'}'><td>{_e(r.engine)}</td><td>{_e(knob_label(r.knob, r.control))}"
            f"</td><td>{_e(r.baseline)}</td><td>{_e(r.variant)}</td>"
            f"<td>{_e(r.verdict)}</td><td>{_e(r.explanation)}</td></tr>" for r in rows.itertuples()]
    return "\n".join(out) + "</table>"


def _drift_section(run_dir: Path) -> str:
    """Quantisation drift: the per-case measures, the distribution of per-token KLD of each engine over all cases
    (sorted: the value at each percentile of tokens), and per case the KLD of each token."""
    drift = read_parquet(run_dir, "drift.parquet", required=False)
    tokens = read_parquet(run_dir, "drift_tokens.parquet", required=False)
    if drift is None or drift.empty:
        return ""
    from harness.report.summary import DRIFT_HEADERS, drift_rows

    out = ["<h2 id='drift'>Quantisation drift</h2><p>Each case's text (the baseline's prompt and generated tokens) "
           "teacher-forced through the engine and its full-precision baseline; per token the KL divergence of the "
           "engine's next-token distribution from the baseline's, whether both rank the same token first, and delta "
           "p of the text's token (llama.cpp's <code>perplexity --kl-divergence</code> measures).</p><table id='drift-"
           "table'><tr>" + "".join(f"<th>{_e(h)}</th>" for h in DRIFT_HEADERS) + "</tr>"]
    for row, cells in zip(drift.itertuples(), drift_rows(drift), strict=True):
        out.append(f"<tr class='{'' if row.ok else 'no'}'>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    if tokens is None or tokens.empty:
        return "".join(out)
    series = {}
    for engine, group in tokens.groupby("engine", sort=False):
        values = sorted(group["kld"].tolist())
        series[engine] = ([100.0 * i / max(1, len(values) - 1) for i in range(len(values))], values)
    width = 160 * len(series) + 120  # room for every engine's legend entry
    out.append(svg_plot(series, "per-token KLD over all cases, sorted (distribution)", width=width,
                        xlabel="percentile of tokens"))
    for case_id, group in tokens.groupby("case_id", sort=False):
        per_engine = {engine: (g["position"].tolist(), g["kld"].tolist())
                      for engine, g in group.groupby("engine", sort=False)}
        out.append(f"<div class='case'><h3>{_e(case_id)}: drift per token</h3>"
                   + svg_plot(per_engine, f"{case_id}: KLD per generated token", width=width, xlabel="token")
                   + "</div>")
    return "".join(out)


def _transplant_section(run_dir: Path) -> str:
    verdicts = read_json(run_dir, "transplant/verdicts.json", list[_Transplanted])
    if verdicts is None:
        return ""
    rows = ["<h2 id='transplant'>Sampler transplant</h2><table><tr><th>case</th><th>engine</th><th>cause</th>"
            "<th>verdict</th></tr>"]
    rows += [f"<tr><td>{_e(v.case_id)}</td><td>{_e(v.engine)}</td><td>{_e(v.cause)}</td>"
             f"<td>{_e(v.verdict)}</td></tr>" for v in verdicts]
    return "\n".join(rows) + "</table>"


def build(run_dir: Path) -> str:
    meta = read_meta(run_dir)
    results = read_parquet(run_dir, "results.parquet", RESULT_TYPES)
    steps = read_parquet(run_dir, "steps.parquet", STEP_TYPES)
    verdicts = read_parquet(run_dir, "verdicts.parquet", VERDICT_TYPES, required=False)
    verdicts = verdicts if verdicts is not None else pd.DataFrame()
    decode = _decoder(meta)
    reference = meta.reference
    body = [f"<h1>{_e(meta.scenario_name)}</h1><p>run <b>{_e(meta.run_id)}</b>, status "
            f"{_e(meta.status)}, exit code {_e(meta.exit_code)}, reference engine <b>{_e(reference)}</b>, "
            f"model <code>{_e(meta.model)}</code>, wall {meta.wall_s:.1f} s</p>"]
    body += [f"<p class='exposed no'>{_e(note)}</p>" for note in exposed_servers(meta)]
    if meta.prompt_warnings:
        body.append("<h2>Prompt identity</h2><ul id='prompt-identity'>" + "".join(
            f"<li class='no'>prompt <b>{_e(pid)}</b>: {_e('; '.join(ws))}</li>"
            for pid, ws in meta.prompt_warnings.items()) + "</ul>")
    body.append("<h2>Verdicts</h2>")
    body.append(_verdict_table(verdicts) if not verdicts.empty else "<p>No verdicts (interrupted run).</p>")
    body.append("<h2>Cases</h2>")
    body += [_case_section(i, v, results, steps, reference, decode) for i, v in enumerate(verdicts.itertuples())]
    body += [_invariance_section(run_dir), _drift_section(run_dir), _explain_section(run_dir),
             _transplant_section(run_dir)]
    body += ["<h2>Params</h2><p>Rows where the engines were given different canonical params are marked.</p>",
             _params_table(results), "<h3>Effective params (each engine's own code, first case)</h3>",
             _effective_table(results), "<h2>Engines and machine</h2><table id='engines'><tr><th>engine</th>"
             "<th>type</th><th>dtype</th><th>threads</th><th>versions</th><th>load s</th><th>warnings</th></tr>"]
    for name, e in meta.engines.items():
        versions = ", ".join(f"{k} {v}" for k, v in e.versions.items())
        warnings = "<br>".join(_e(w) for w in meta.warnings.get(name, []))
        body.append(f"<tr><td>{_e(name)}</td><td>{_e(e.engine)}</td><td>{_e(e.dtype)}</td>"
                    f"<td>{_e(e.threads)}</td><td>{_e(versions)}</td>"
                    f"<td>{_e(', '.join(f'{s:.1f}' for s in e.load_s))}</td><td>{warnings}</td></tr>")
    machine = ", ".join(f"{k}: {v}" for k, v in meta.machine.items())
    body.append(f"</table><p id='machine'>{_e(machine)}</p>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>llm-parity: "
            f"{_e(meta.scenario_name)}</title><style>{STYLE}</style></head><body>" + "\n".join(body)
            + f"<script>{SCRIPT}</script></body></html>\n")


def write(run_dir: Path, out: Path | None = None) -> Path:
    path = out or run_dir / "report.html"
    write_atomic(path, build(run_dir))
    return path
