"""Gate results for CI: JUnit XML, a Markdown summary (for $GITHUB_STEP_SUMMARY), GitHub annotations."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.compare.gate import GateCase
from harness.rundir.store import write_atomic


def junit_xml(cases: list[GateCase]) -> str:
    suites = ET.Element("testsuites", name="llm-parity gate")
    for scenario in dict.fromkeys(c.scenario for c in cases):
        mine = [c for c in cases if c.scenario == scenario]
        suite = ET.SubElement(suites, "testsuite", name=scenario, tests=str(len(mine)),
                              failures=str(sum(not c.passed for c in mine)))
        for case in mine:
            element = ET.SubElement(suite, "testcase", classname=scenario, name=f"{case.case_id} [{case.engine}]")
            if not case.passed:
                failure = ET.SubElement(element, "failure", message=case.failures[0][:500])
                failure.text = "\n".join(case.failures)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def markdown_summary(cases: list[GateCase]) -> str:
    failed = [c for c in cases if not c.passed]
    head = f"## llm-parity gate: {'FAIL' if failed else 'PASS'} ({len(cases) - len(failed)}/{len(cases)} passed)\n\n"
    if not failed:
        return head
    rows = ["| scenario | case | engine | why |", "|---|---|---|---|"]
    rows += [f"| {c.scenario} | {c.case_id} | {c.engine} | {'; '.join(c.failures).replace('|', '/')} |"
             for c in failed]
    return head + "\n".join(rows) + "\n"


def github_annotations(cases: list[GateCase]) -> list[str]:
    return [f"::error title=parity {c.scenario} {c.case_id} [{c.engine}]::{'; '.join(c.failures)}"
            for c in cases if not c.passed]


def write_outputs(cases: list[GateCase], junit: Path | None, summary: Path | None) -> list[str]:
    """Write the requested files; under GitHub Actions also append the summary and return annotation lines."""
    if junit:
        write_atomic(junit, junit_xml(cases))
    if summary:
        write_atomic(summary, markdown_summary(cases))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a") as f:
            f.write(markdown_summary(cases))
    return github_annotations(cases) if os.environ.get("GITHUB_ACTIONS") == "true" else []
