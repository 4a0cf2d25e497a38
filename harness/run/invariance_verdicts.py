"""The invariance checks' verdict rows, from a run's results: each knob's baseline against its variant (verdict rules:
harness.compare.invariance), unsupported knobs and configurations that fail on every case said in words."""

from __future__ import annotations

import platform
import re

from adapters import registry
from harness.compare.invariance import InvarianceRow, control_expected, judge_pair, judge_samples
from harness.run.invariance import WORDS, Check
from harness.scenario.spec import LoadedScenario
from harness.types import Result


def judge(scenario: LoadedScenario, checks: list[Check], results: dict[tuple[str, str], Result],
          decode) -> list[InvarianceRow]:
    settings = scenario.spec.invariance
    rows = []
    for check in checks:
        words = WORDS.get(check.knob, ("", ""))
        base = InvarianceRow(engine=check.engine, knob=check.knob, control=check.control, verdict="unsupported",
                             baseline=check.baseline.words if check.baseline else words[0],
                             variant=check.variant.words if check.variant else words[1])
        if check.unsupported:
            rows.append(base.model_copy(update={"explanation": _unsupported(scenario, check)}))
            continue
        sides = [[results.get((s.config, r.case_id)) or Result.engine_error(r.case_id, s.config, "not run")
                  for r in s.requests] for s in (check.baseline, check.variant)]
        fields = (judge_samples(*sides, settings.steps, settings.alpha) if check.sampled
                  else judge_pair(*sides, decode))
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
    return rows


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
        return "near-tie" in row.explanation
    return row.verdict not in ("engine_error", "distribution_diverged")


def _unsupported(scenario: LoadedScenario, check: Check) -> str:
    engine = scenario.spec.engines[check.engine]
    requirement = registry.describe(engine.engine).requirement
    version = registry.installed_version(requirement, engine.python) or "not installed"
    return f"{engine.engine} ({requirement.distribution} {version}): {check.unsupported}"
