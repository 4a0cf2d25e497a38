"""The plug point for verdict families: each family judges one aspect of a run (tokens against the reference,
invariance, quantisation drift, ...), owns one parquet table of the run directory, and renders itself in the console,
summary.md and the HTML report. `parity run` judges with every registered family, summary.md and `parity report` show
every family whose table the run has; nothing else names a family.

A family is a VerdictFamily subclass in a module of its own: the built-in ones are listed in BUILTIN, others come from
installed packages (the entry point group `llm_parity.verdict_families`, naming an instance) or register themselves
(`FAMILIES.register(instance)`). Every table has the columns case_id, engine, expected (the one pass column: a row that
is not as expected fails the run, exit 1) and explanation. The steps are in docs/adding-a-verdict-family.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from harness.compare.ending import Ending
from harness.compare.tie_noise import TieEvidence
from harness.core.plugins import Registry
from harness.core.types import Result, TraceResult
from harness.plan.invariance_checks import Check
from harness.render.page import Page
from harness.scenario.spec import LoadedScenario

if TYPE_CHECKING:
    import pandas as pd

# module:attribute of each built-in family, in the order they are judged and shown
BUILTIN = ["harness.verdicts.tokens:FAMILY", "harness.verdicts.text:FAMILY", "harness.verdicts.tools:FAMILY",
           "harness.verdicts.constraint:FAMILY",
           "harness.verdicts.invariance:FAMILY", "harness.verdicts.drift:FAMILY"]
COMMON_COLUMNS = {"case_id": "str", "engine": "str", "expected": "bool", "explanation": "str"}


@dataclass
class Judging:
    """What a family judges a run from: every result in hand, by (engine configuration, case)."""

    scenario: LoadedScenario  # the cases and engines that ran
    run_dir: Path
    results: dict[tuple[str, str], Result]  # the engines' and the invariance configurations' results
    compared: dict[tuple[str, str], Result]  # the engines' results as compared (cut where their generation ended)
    decode: Callable[[int], str]  # a token id in the reference's tokenizer
    checks: list[Check]  # the invariance checks the run planned
    prompt_warnings: dict[str, list[str]]  # prompt id -> what is off about its ids
    engine_prompt_warnings: dict[str, dict[str, list[str]]]  # engine -> prompt id -> the same, for its own file
    interrupted: bool
    # teacher-forced logits passes run for the drift verdicts: (engine, the baseline whose text it read, case)
    drift_traces: dict[tuple[str, str, str], TraceResult] = field(default_factory=dict)
    versions: dict[str, dict[str, str]] = field(default_factory=dict)  # engine -> what it reported of itself
    # ids -> text in the reference's tokenizer, skipping special tokens or not (None: no tokenizer, no text verdicts)
    decode_ids: Callable[[list[int], bool], str] | None = None
    eos_ids: set[int] = field(default_factory=set)  # the reference model's EOS ids
    # the noise near-ties are read with and each near-tie's layer check (harness.run.tie_checks)
    ties: TieEvidence = field(default_factory=TieEvidence)
    # how each of the engines' answers ended (harness.compare.ending), read once: (engine, case) -> its ending
    endings: dict[tuple[str, str], Ending] = field(default_factory=dict)


@dataclass
class Judged:
    rows: pd.DataFrame  # the family's table (written when not empty)
    extra: dict[str, pd.DataFrame] = field(default_factory=dict)  # other parquet files of the family, by file name


class VerdictFamily(ABC):
    name: ClassVar[str]  # its key in RunOutcome.tables
    table: ClassVar[str]  # its parquet file in the run directory
    columns: ClassVar[dict[str, str]]  # column -> kind (harness.rundir.tables), COMMON_COLUMNS among them
    title: ClassVar[str]  # its heading in summary.md and the HTML report
    anchor: ClassVar[str]  # the HTML report section's id
    always_shown: ClassVar[str] = ""  # text shown under the heading when the run has no rows (else: no section)
    # its rows are one per engine and case: `parity gate` fails a case on any of them that is not as expected (the
    # invariance rows are one per knob and engine: the gate makes each its own case)
    per_case: ClassVar[bool] = True

    @abstractmethod
    def judge(self, judging: Judging) -> Judged:
        """The family's verdict rows for a run (an empty frame: nothing to judge)."""

    @abstractmethod
    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        """Markdown under the family's heading in summary.md."""

    @abstractmethod
    def html(self, rows: pd.DataFrame, page: Page) -> str:
        """HTML under the family's heading in the report."""

    @abstractmethod
    def print(self, rows: pd.DataFrame, reference: str) -> None:
        """The family's table as `parity run` prints it (harness.render.console.print_table)."""


def _problem(family: VerdictFamily) -> str:
    missing = [c for c in COMMON_COLUMNS if c not in family.columns]
    return f"its columns lack {missing}" if missing else ""


FAMILIES = Registry(VerdictFamily, BUILTIN, "llm_parity.verdict_families", lambda f: f.name, _problem)


def families() -> list[VerdictFamily]:
    """Every verdict family, in the order they are judged and shown."""
    return FAMILIES.all()
