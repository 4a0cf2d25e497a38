"""summary.md for a run directory: the run, its engines, each verdict family's section, and what the reader should
know (exposed servers, effective params that differ, prompt identity, engine warnings)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pandas as pd

from harness.render import markdown
from harness.rundir.store import RunMeta, write_atomic
from harness.verdicts.family import families


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


def write_summary(path: Path, meta: RunMeta, tables: dict[str, pd.DataFrame]) -> None:
    """tables: each verdict family's rows (harness.verdicts), by family name."""
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
    for family in families():
        rows = tables.get(family.name)
        if rows is not None and not rows.empty:
            lines += ["", f"## {family.title}", "", *family.summary_lines(rows)]
        elif family.always_shown:
            lines += ["", f"## {family.title}", "", family.always_shown]
    if meta.effective_differences:
        lines += ["", "## Effective params that differ (computed by each engine's own code)", ""]
        lines += [f"- cases {markdown.some(cases)}: {text}" for cases, text in meta.effective_differences]
    if meta.prompt_warnings:
        lines += ["", "## Prompt identity (ids that are not what the model expects)", ""]
        lines += [f"- prompt {pid}: {'; '.join(ws)}" for pid, ws in meta.prompt_warnings.items()]
    if meta.engine_prompt_warnings:
        lines += ["", "## Prompt identity for an engine's own model file", ""]
        lines += [f"- {engine}, prompt {pid}: {'; '.join(ws)}"
                  for engine, prompts in meta.engine_prompt_warnings.items() for pid, ws in prompts.items()]
    warned = {name: ws for name, ws in meta.warnings.items() if ws}
    if warned:
        lines += ["", "## Engine warnings (params whose meaning differs or that were not applied)", ""]
        lines += [f"- {name}: {w}" for name, ws in warned.items() for w in ws]
    write_atomic(path, "\n".join(lines) + "\n")
