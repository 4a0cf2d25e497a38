"""The invariance verdicts, each engine against itself (invariance.parquet): each knob's baseline against its variant
(verdict rules: harness.compare.invariance_rules), unsupported knobs and configurations that fail on every case said
in words."""

from __future__ import annotations

import platform
import re

import numpy as np
import pandas as pd

from adapters import registry
from harness.compare.diff import compare
from harness.compare.invariance_rules import (
    FAILING,
    UNMEASURED,
    InvarianceRow,
    KnobNoise,
    Noise,
    control_expected,
    judge_pair,
    judge_samples,
)
from harness.compare.tie_noise import TieEvidence
from harness.core.types import Result
from harness.plan.invariance_checks import WORDS, Check
from harness.render import markdown
from harness.render.console import print_table
from harness.render.html_parts import esc
from harness.render.markdown import yes_no
from harness.render.page import Page
from harness.scenario.spec import LoadedScenario
from harness.verdicts.family import Judged, Judging, VerdictFamily


def judge_checks(scenario: LoadedScenario, checks: list[Check], results: dict[tuple[str, str], Result],
                 decode, ties: TieEvidence | None = None,
                 versions: dict[str, dict[str, str]] | None = None) -> list[InvarianceRow]:
    """versions: what each engine configuration reported of itself (a knob whose two sides report alike what it
    turns is unsupported, not judged)."""
    settings = scenario.spec.invariance
    rows = []
    noise = own_noise(scenario, checks, results, ties or TieEvidence())
    for check in checks:
        words = WORDS.get(check.knob, ("", ""))
        base = InvarianceRow(engine=check.engine, knob=check.knob, control=check.control, verdict="unsupported",
                             baseline=check.baseline.words if check.baseline else words[0],
                             variant=check.variant.words if check.variant else words[1])
        if check.unsupported:
            rows.append(base.model_copy(update={"explanation": _unsupported(scenario, check)}))
            continue
        alike = ran_alike(check, versions or {})
        if alike:
            rows.append(base.model_copy(update={"explanation": alike, "cases": len(check.baseline.requests)}))
            continue
        sides = [[results.get((s.config, r.case_id)) or Result.engine_error(r.case_id, s.config, "not run")
                  for r in s.requests] for s in (check.baseline, check.variant)]
        fields = (judge_samples(*sides, settings.steps, settings.alpha) if check.sampled
                  else judge_pair(*sides, decode, noise.get(check.engine, UNMEASURED)))
        failed_config = _failed_configuration(check, sides)
        if failed_config:
            fields = {"verdict": "unsupported", "cases": len(sides[0]), "explanation": (
                f"unsupported on this machine ({platform.machine()}, no CUDA needed for the others): configuration "
                f"{failed_config} fails on every case: {sides[1][0].error.removeprefix('engine error: ')}")}
        if fields.get("case_id"):
            fields["case_id"] = fields["case_id"].split("#", 1)[0]
            fields["explanation"] = re.sub(r"#[\w.-]+", "", fields["explanation"])
        row = base.model_copy(update=fields)
        rows.append(row.model_copy(update={"expected": _expected(row, settings.identical if settings else [])}))
    return [_control_unused(row, rows) for row in rows]


def _control_unused(row: InvarianceRow, rows: list[InvarianceRow]) -> InvarianceRow:
    """A control shows its engine's knobs could have seen a difference; where none of them was judged (each
    unsupported), nothing rests on it and its outcome fails nothing."""
    if not row.control or row.expected or any(
            r.engine == row.engine and not r.control and r.verdict != "unsupported" for r in rows):
        return row
    return row.model_copy(update={"expected": True, "explanation": f"{row.explanation}; no knob of {row.engine} was "
                                  "judged, so nothing rests on its control"})


def own_noise(scenario: LoadedScenario, checks: list[Check], results: dict[tuple[str, str], Result],
              ties: TieEvidence) -> dict[str, KnobNoise]:
    """Per engine, its noise measured apart from the knobs it is judged on: its repeat knob's largest chosen-token
    |delta logprob| (the same requests twice), else the scenario's max_logprob_delta for it; and per case the
    reference's own rounding noise, where the run's noise pass measured it (harness.run.tie_checks)."""
    found: dict[str, Noise] = {}
    for check in checks:
        if check.knob != "repeat" or check.unsupported or check.sampled or check.control:
            continue
        sides = [[results.get((s.config, r.case_id)) for r in s.requests] for s in (check.baseline, check.variant)]
        if all(r is not None and r.status == "ok" for side in sides for r in side):
            drift = float(np.nanmax(compare(*sides)["max_abs_logprob_delta"].to_numpy(dtype=float), initial=0.0))
            found[check.engine] = (drift, drift, "its repeat knob's drift")
    for name in scenario.spec.engines:
        bound = scenario.spec.engine_expectation(name).max_logprob_delta
        if name not in found and bound is not None:
            found[name] = (bound, bound, "the scenario's max_logprob_delta")
    cases = {case: (n.margin, n.chosen, n.words().removeprefix("twice ")) for case, n in ties.noise.items()}
    return {name: KnobNoise(found.get(name, UNMEASURED.default), cases) for name in scenario.spec.engines}


# what an engine records of itself that a knob turns, and why an engine may not have turned it
RECORDED = {"compile": "compilation", "tensor_parallel": "tensor_parallel_size"}
WHY_ALIKE = {"compile": "vLLM's CPU platform compiles no graph for a configuration with a LoRA adapter"}


def ran_alike(check: Check, versions: dict[str, dict[str, str]]) -> str:
    """Why a knob's two sides are not compared ('' where they ran as the knob says): both recorded the same value
    of what the knob turns, so equal answers would be no reading of it."""
    key = RECORDED.get(check.knob)
    if key is None or check.control or check.baseline is None or check.variant is None:
        return ""
    ran = [versions.get(side.config, {}).get(key) for side in (check.baseline, check.variant)]
    if ran[0] is None or ran[0] != ran[1]:
        return ""
    why = f" ({WHY_ALIKE[check.knob]})" if check.knob in WHY_ALIKE else ""
    return (f"both sides ran with {key} {ran[0]}: {check.engine} did not turn what the knob turns{why}, so the two "
            "are not compared")


def _failed_configuration(check: Check, sides: list[list[Result]]) -> str:
    """A configuration that exists only for this check and failed on every case: the engine cannot run the knob
    here (e.g. vLLM's batch-invariant kernels on a CPU), which is a finding about the engine, not an error."""
    variant = check.variant.config
    if variant in check.exclusive and all(r.status != "ok" for r in sides[1]):
        return variant
    return ""


def _expected(row: InvarianceRow, identical: list[str]) -> bool:
    if row.control:
        return control_expected(row.verdict)
    if row.knob in identical:
        return row.verdict == "identical"
    if row.verdict == "diverged":
        return bool(row.near_tie)
    return row.verdict not in FAILING


def _unsupported(scenario: LoadedScenario, check: Check) -> str:
    engine = scenario.spec.engines[check.engine]
    requirement = scenario.description(check.engine).requirement
    version = registry.installed_version(requirement, engine.python) or "not installed"
    return f"{engine.engine} ({requirement.distribution} {version}): {check.unsupported}"


COLUMNS = {"engine": "str", "knob": "str", "baseline": "str", "variant": "str", "verdict": "str", "control": "bool",
           "expected": "bool", "first_divergence": "float?", "near_tie": "bool?", "case_id": "str?",
           "max_abs_logprob_delta": "float?", "cases": "int", "explanation": "str"}
DETAIL_HEADERS = ["engine", "knob", "baseline", "variant", "verdict", "ok", "explanation"]


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


def detail_rows(rows: pd.DataFrame) -> list[list[str]]:
    return [[r.engine, knob_label(r.knob, r.control), r.baseline, r.variant, r.verdict, yes_no(r.expected),
             r.explanation] for r in rows.itertuples()]


class InvarianceVerdicts(VerdictFamily):
    name = "invariance"
    table = "invariance.parquet"
    columns = COLUMNS
    title = "Invariance (each engine against itself)"
    anchor = "invariance"
    per_case = False

    def judge(self, judging: Judging) -> Judged:
        rows = judge_checks(judging.scenario, judging.checks, judging.results, judging.decode, judging.ties,
                            judging.versions)
        return Judged(pd.DataFrame([row.model_dump() for row in rows]))

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        headers, table = invariance_table(rows)
        return [*markdown.table(headers, table), "", *markdown.table(DETAIL_HEADERS, detail_rows(rows))]

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        headers, table = invariance_table(rows)
        styles = [["bold"] + ["red" if cell.endswith(" NO") else "green" if cell.startswith("identical") else ""
                              for cell in row[1:]] for row in table]
        print_table("invariance: the same engine under a baseline and a variant configuration", headers, table,
                    styles)

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        """The knob x engine table, then every knob's baseline, variant and why."""
        headers, table = invariance_table(rows)
        out = ["<table id='invariance-table'><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"]
        out += ["<tr>" + "".join(f"<td class='{'no' if cell.endswith(' NO') else ''}'>{esc(cell)}</td>"
                                 for cell in row) + "</tr>" for row in table]
        out.append("</table><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in DETAIL_HEADERS if h != "ok")
                   + "</tr>")
        out += [f"<tr class='{'' if r.expected else 'no'}'>" + "".join(
                f"<td>{esc(cell)}</td>" for i, cell in enumerate(cells) if DETAIL_HEADERS[i] != "ok") + "</tr>"
                for r, cells in zip(rows.itertuples(), detail_rows(rows), strict=True)]
        return "\n".join(out) + "</table>"


FAMILY = InvarianceVerdicts()
