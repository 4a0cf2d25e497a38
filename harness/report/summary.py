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


def write_summary(path: Path, meta: RunMeta, verdicts: pd.DataFrame) -> None:
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
    if meta.effective_differences:
        lines += ["", "## Effective params that differ (computed by each engine's own code)", ""]
        lines += [f"- cases {', '.join(cases)}: {text}" for cases, text in meta.effective_differences]
    warned = {name: ws for name, ws in meta.warnings.items() if ws}
    if warned:
        lines += ["", "## Engine warnings (params whose meaning differs or that were not applied)", ""]
        lines += [f"- {name}: {w}" for name, ws in warned.items() for w in ws]
    write_atomic(path, "\n".join(lines) + "\n")
