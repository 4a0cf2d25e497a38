"""The plug point for sections of the HTML report that no verdict family renders: what other commands added to the
run directory (`parity explain`'s localisations, `parity transplant`'s verdicts). A ReportSection renders from the
run directory alone (harness.render.page.Page) and returns "" when it has nothing to show. Built-in sections are
listed in BUILTIN; others come from installed packages (the entry point group `llm_parity.report_sections`) or
register themselves (`SECTIONS.register(section)`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.core.plugins import Registry
from harness.render.page import Page


@dataclass(frozen=True)
class ReportSection:
    name: str
    render: Callable[[Page], str]  # the section's HTML, its heading included; "" when there is nothing to show


BUILTIN = ["harness.report.investigations:EXPLAIN", "harness.report.investigations:TRANSPLANT"]
SECTIONS = Registry(ReportSection, BUILTIN, "llm_parity.report_sections", lambda s: s.name)
