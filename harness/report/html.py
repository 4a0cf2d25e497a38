"""`parity report RUN_DIR`: one self-contained HTML file (no network, no CDN; plots are inline SVG) built from a
run directory alone: each verdict family's section (harness.verdicts: the verdicts with aligned tokens, top-k
alternatives and logprob-delta plots per case; invariance; drift), the sections other commands added
(harness.report.sections), the params each engine was sent with differences marked, versions and machine. A large run's
cases past the first page go to further pages beside it (REPORT-cases-N.html), so its first screen stays light."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness.render.html_parts import esc
from harness.render.page import Page
from harness.report.sections import SECTIONS
from harness.report.summary import exposed_servers
from harness.rundir import layout
from harness.rundir.store import write_atomic
from harness.rundir.tables import read_parquet
from harness.verdicts.family import families

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

# rows link to their case; data-ready-ms: from navigation start to this script, at the end of the page (every
# element above it parsed), which the report's own test reads to hold the first screen to its time
SCRIPT = """
document.querySelectorAll('tr[data-href]').forEach(function (row) {
  row.style.cursor = 'pointer';
  row.addEventListener('click', function () { window.location.href = row.dataset.href; });
});
document.body.dataset.ready = 'yes';
document.body.dataset.readyMs = String(Math.round(performance.now()));
"""


def _params_table(results: pd.DataFrame) -> str:
    engines = list(dict.fromkeys(results.engine))
    first = {e: results[results.engine == e].iloc[0] for e in engines}
    canonical = {e: json.loads(first[e].params or "{}") for e in engines}
    native = {e: json.loads(first[e].native_params or "{}") for e in engines}
    rows = ["<table id='params'><tr><th>param</th>" + "".join(f"<th>{esc(e)}</th>" for e in engines) + "</tr>"]
    for label, table in (("canonical", canonical), ("sent to engine", native)):
        keys = sorted({k for values in table.values() for k in values})
        rows.append(f"<tr><th colspan='{len(engines) + 1}'>{label} (first case)</th></tr>")
        for key in keys:
            values = [table[e].get(key, "—") for e in engines]
            differs = label == "canonical" and len({json.dumps(v) for v in values}) > 1
            rows.append(f"<tr class='{'differs' if differs else ''}'><td>{esc(key)}</td>"
                        + "".join(f"<td>{esc(v)}</td>" for v in values) + "</tr>")
    return "\n".join(rows) + "</table>"


def _effective_table(results: pd.DataFrame) -> str:
    """What each engine's own code makes of the first case's params, differing rows marked."""
    from harness.core.types import COMPARED, Effective
    from harness.semantics.effective import differing_fields, display

    first = results.drop_duplicates("engine")
    by_engine = {r.engine: Effective.model_validate(json.loads(r.effective or "{}"))
                 for r in first.itertuples() if json.loads(r.effective or "{}").get("decoding")}
    if not by_engine:
        return "<p>No effective params recorded.</p>"
    differ = set(differing_fields(by_engine))
    rows = ["<table id='effective'><tr><th>param</th>" + "".join(f"<th>{esc(e)}</th>" for e in by_engine) + "</tr>"]
    for field in (*COMPARED, "processors"):
        rows.append(f"<tr class='{'differs' if field in differ else ''}'><td>{esc(field)}</td>"
                    + "".join(f"<td>{esc(display(getattr(e, field)))}</td>" for e in by_engine.values()) + "</tr>")
    notes = "".join(f"<li>{esc(name)}: {esc(note)}</li>" for name, e in by_engine.items() for note in e.notes)
    return "\n".join(rows) + "</table>" + (f"<ul>{notes}</ul>" if notes else "")


def build(run_dir: Path, stem: str = "report") -> tuple[str, dict[str, str]]:
    """The report's HTML, and its further pages (file name -> HTML); stem: the report's file name without .html."""
    page = Page(run_dir, stem)
    meta, reference = page.meta, page.reference
    body = [f"<h1>{esc(meta.scenario_name)}</h1><p>run <b>{esc(meta.run_id)}</b>, status "
            f"{esc(meta.status)}, exit code {esc(meta.exit_code)}, reference engine <b>{esc(reference)}</b>, "
            f"model <code>{esc(meta.model)}</code>, wall {meta.wall_s:.1f} s</p>"]
    body += [f"<p class='exposed no'>{esc(note)}</p>" for note in exposed_servers(meta)]
    own = [(f"{engine}, prompt", pid, ws) for engine, prompts in meta.engine_prompt_warnings.items()
           for pid, ws in prompts.items()]
    if meta.prompt_warnings or own:
        body.append("<h2>Prompt identity</h2><ul id='prompt-identity'>" + "".join(
            f"<li class='no'>{esc(what)} <b>{esc(pid)}</b>: {esc('; '.join(ws))}</li>"
            for what, pid, ws in [("prompt", p, w) for p, w in meta.prompt_warnings.items()] + own) + "</ul>")
    for family in families():
        rows = read_parquet(run_dir, family.table, family.columns, required=False)
        if rows is not None and not rows.empty:
            body.append(f"<h2 id='{family.anchor}'>{esc(family.title)}</h2>" + family.html(rows, page))
        elif family.always_shown:
            body.append(f"<h2 id='{family.anchor}'>{esc(family.title)}</h2><p>{esc(family.always_shown)}</p>")
    body += [section.render(page) for section in SECTIONS.all()]
    results = page.results
    body += ["<h2>Params</h2><p>Rows where the engines were given different canonical params are marked.</p>",
             _params_table(results), "<h3>Effective params (each engine's own code, first case)</h3>",
             _effective_table(results), "<h2>Engines and machine</h2><table id='engines'><tr><th>engine</th>"
             "<th>type</th><th>model</th><th>dtype</th><th>threads</th><th>versions</th><th>load s</th>"
             "<th>warnings</th></tr>"]
    for name, e in meta.engines.items():
        versions = ", ".join(f"{k} {v}" for k, v in e.versions.items())
        warnings = "<br>".join(esc(w) for w in meta.warnings.get(name, []))
        model = _model_name(Path(e.model_path)) + (f" + LoRA {Path(e.lora).name}" if e.lora else "")
        body.append(f"<tr><td>{esc(name)}</td><td>{esc(e.engine)}</td><td>{esc(model)}</td><td>{esc(e.dtype)}</td>"
                    f"<td>{esc(e.threads)}</td><td>{esc(versions)}</td>"
                    f"<td>{esc(', '.join(f'{s:.1f}' for s in e.load_s))}</td><td>{warnings}</td></tr>")
    machine = ", ".join(f"{k}: {v}" for k, v in meta.machine.items())
    body.append(f"</table><p id='machine'>{esc(machine)}</p>")
    further = {name: document(f"{meta.scenario_name}: {title}", f"<h1>{esc(meta.scenario_name)}: {esc(title)}</h1>"
                              + part) for name, (title, part) in page.further.items()}
    return document(meta.scenario_name, "\n".join(body)), further


def _model_name(folder: Path) -> str:
    """A model folder's name (a cached model's, not its dtype variant's)."""
    return folder.parent.name if folder.name in ("float32", "bfloat16") else folder.name


def document(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>llm-parity: {esc(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}<script>{SCRIPT}</script></body></html>\n")


def write(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report (default RUN_DIR/report.html) and its further pages beside it; returns the report's path."""
    path = out or run_dir / layout.REPORT
    main, further = build(run_dir, path.stem)
    for name, html in further.items():
        write_atomic(path.parent / name, html)
    write_atomic(path, main)
    return path
