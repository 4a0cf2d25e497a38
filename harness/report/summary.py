"""summary.md for a run directory, and the verdict table printed by the CLI."""

from __future__ import annotations

import ipaddress
import math
from pathlib import Path

import pandas as pd

from harness.report.console import print_table
from harness.run.store import RunMeta, write_atomic

VERDICT_STYLE = {"match": "green", "benign_tie": "yellow", "diverged": "red", "hazard": "bold red",
                 "engine_error": "bold red"}


def _num(value, spec: str = ".2g") -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _step(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) or value < 0 else str(int(value))


def exposed_servers(meta: RunMeta) -> list[str]:
    """Servers the harness started that listened on an address other machines can reach (a scenario opted in with
    bind and allow_remote), one sentence each; every report says so."""
    notes = []
    for name, engine in meta.engines.items():
        listening = engine.versions.get("server_listening")
        if listening and not _loopback(listening.rpartition(":")[0]):
            notes.append(f"{name}: the server the harness started listened on {listening}, not on a loopback "
                         "address: it was reachable from other machines while the run lasted (the scenario set "
                         "bind and allow_remote)")
    return notes


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def verdict_rows(verdicts: pd.DataFrame) -> list[list[str]]:
    return [[r.case_id, r.engine, r.verdict, "yes" if r.expected else "NO", _step(r.first_divergence),
             _num(r.max_abs_logprob_delta), r.explanation] for r in verdicts.itertuples()]


HEADERS = ["case", "engine", "verdict", "ok", "diverges at", "max dlogprob", "explanation"]


def print_verdicts(verdicts: pd.DataFrame, reference: str) -> None:
    rows = verdict_rows(verdicts)
    styles = [["", "", VERDICT_STYLE.get(row[2], ""), "" if row[3] == "yes" else "bold red", "", "", ""]
              for row in rows]
    print_table(f"verdicts vs reference '{reference}'", HEADERS, rows, styles)


def invariance_table(rows: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Knob x engine: each cell the verdict, its step or drift, and whether it is as expected."""
    engines = list(dict.fromkeys(rows["engine"]))
    knobs = list(dict.fromkeys(rows["knob"]))
    by = {(r.engine, r.knob): r for r in rows.itertuples()}
    table = []
    for knob in knobs:
        cells = [knob]
        for engine in engines:
            r = by.get((engine, knob))
            if r is None:
                cells.append("")
                continue
            detail = (f" at step {int(r.first_divergence)} ({r.case_id})" if r.verdict == "diverged" else
                      f", drift {r.max_abs_logprob_delta:.2g}" if r.verdict == "tokens_identical" else "")
            cells.append(f"{r.verdict}{detail}{'' if r.expected else ' NO'}")
        table.append(cells)
    return ["knob", *engines], table


def knob_label(knob: str, control: bool) -> str:
    return f"{knob} (negative control)" if control and "control" not in knob else knob


def print_invariance(rows: pd.DataFrame) -> None:
    headers, table = invariance_table(rows)
    styles = [["bold"] + ["red" if cell.endswith(" NO") else "green" if cell.startswith("identical") else ""
                          for cell in row[1:]] for row in table]
    print_table("invariance: the same engine under a baseline and a variant configuration", headers, table, styles)


DRIFT_HEADERS = ["case", "engine", "against", "ok", "mean KLD", "p99 KLD", "top-1 agreement", "RMS delta p",
                 "PPL (base)", "explanation"]


def drift_rows(drift: pd.DataFrame) -> list[list[str]]:
    return [[r.case_id, r.engine, r.against, "yes" if r.ok else "NO", _num(r.mean_kld, ".3g"), _num(r.p99_kld, ".3g"),
             "" if r.status != "ok" else f"{r.top1_agreement:.1%}", _num(r.rms_delta_p, ".3g"),
             "" if r.status != "ok" else f"{r.ppl:.4g} ({r.ppl_base:.4g})", r.explanation]
            for r in drift.itertuples()]


def print_drift(drift: pd.DataFrame) -> None:
    rows = drift_rows(drift)
    styles = [["", "", "", "" if row[3] == "yes" else "bold red", *[""] * 6] for row in rows]
    print_table("quantisation drift (llama.cpp's perplexity --kl-divergence measures)", DRIFT_HEADERS, rows, styles)


def write_summary(path: Path, meta: RunMeta, verdicts: pd.DataFrame, drift: pd.DataFrame | None = None,
                  knobs: pd.DataFrame | None = None) -> None:
    lines = [f"# {meta.scenario_name}: run {meta.run_id}", "",
             f"- scenario: `{meta.scenario}`", f"- model: `{meta.model}`",
             f"- reference engine: `{meta.reference}`", f"- status: {meta.status}, exit code {meta.exit_code}",
             f"- wall time: {meta.wall_s:.1f} s", "", "## Engines", "",
             "| engine | type | dtype | threads | versions | load s | restarts |", "|---|---|---|---|---|---|---|"]
    for name, e in meta.engines.items():
        versions = ", ".join(f"{k} {v}" for k, v in e.versions.items())
        loads = ", ".join(f"{s:.1f}" for s in e.load_s)
        lines.append(f"| {name} | {e.engine} | {e.dtype} | {e.threads} | {versions} | {loads} | {e.restarts} |")
    for name, reason in meta.skipped.items():
        lines.append(f"| {name} | skipped: {reason} | | | | | |")
    exposed = exposed_servers(meta)
    if exposed:
        lines += ["", "## Exposure", "", *[f"- {note}" for note in exposed]]
    lines += ["", "## Verdicts", ""]
    if verdicts.empty:
        lines.append("No verdicts: the run was interrupted before any case finished.")
    else:
        lines += ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in verdict_rows(verdicts)]
    if knobs is not None and not knobs.empty:
        headers, table = invariance_table(knobs)
        lines += ["", "## Invariance (each engine against itself)", "", "| " + " | ".join(headers) + " |",
                  "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in table]
        lines += ["", "| engine | knob | baseline | variant | verdict | ok | explanation |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r.engine} | {knob_label(r.knob, r.control)} | {r.baseline} | {r.variant} | "
                  f"{r.verdict} | {'yes' if r.expected else 'NO'} | {r.explanation.replace('|', '/')} |"
                  for r in knobs.itertuples()]
    if drift is not None and not drift.empty:
        lines += ["", "## Quantisation drift", "", "Each case's text (the baseline's prompt and generated tokens) "
                  "teacher-forced through both engines; per token: KL divergence of the engine's next-token "
                  "distribution from the baseline's, same top-1, delta p of the text's token (llama.cpp's perplexity "
                  "--kl-divergence measures; per token in drift_tokens.parquet).", ""]
        lines += ["| " + " | ".join(DRIFT_HEADERS) + " |", "|" + "---|" * len(DRIFT_HEADERS)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in drift_rows(drift)]
    if meta.effective_differences:
        lines += ["", "## Effective params that differ (computed by each engine's own code)", ""]
        lines += [f"- cases {', '.join(cases)}: {text}" for cases, text in meta.effective_differences]
    if meta.prompt_warnings:
        lines += ["", "## Prompt identity (ids that are not what the model expects)", ""]
        lines += [f"- prompt {pid}: {'; '.join(ws)}" for pid, ws in meta.prompt_warnings.items()]
    warned = {name: ws for name, ws in meta.warnings.items() if ws}
    if warned:
        lines += ["", "## Engine warnings (params whose meaning differs or that were not applied)", ""]
        lines += [f"- {name}: {w}" for name, ws in warned.items() for w in ws]
    write_atomic(path, "\n".join(lines) + "\n")
