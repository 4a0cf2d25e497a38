"""The plain types of a run in progress and of a run done: what `parity run`, `--resume`, explain and transplant hand
each other. Importing them loads neither pandas nor the verdict rules (their tables are typed for the checker only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.types import Result
from harness.plan.invariance_checks import Check
from harness.plan.plans import EnginePlan
from harness.rundir.store import RunMeta
from harness.scenario.prompts import PromptTokenizer
from harness.scenario.spec import LoadedScenario

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class PendingRun:
    """A run whose directory and plans exist and whose engines have not run yet (or only partly: --resume)."""

    scenario: LoadedScenario
    run_dir: Path
    meta: RunMeta
    tokenizer: PromptTokenizer
    done: dict[tuple[str, str], Result]  # results already in hand (a resumed run's journals)
    plans: list[EnginePlan]
    checks: list[Check]
    prepare_started: float


@dataclass
class RunOutcome:
    scenario: LoadedScenario  # as run: the selected cases and the engines that ran
    run_dir: Path
    tables: dict[str, pd.DataFrame]  # verdict family name -> its rows (harness.verdicts); absent: nothing judged
    warnings: dict[str, list[str]]
    exit_code: int
    interrupted: bool
    effective_differences: list[tuple[list[str], str]]
    skipped: dict[str, str] = field(default_factory=dict)  # engine -> why it could not run here (--allow-missing)

    def rows(self, family: str) -> pd.DataFrame:
        """A verdict family's rows; an empty frame when the run judged none."""
        import pandas as pd

        return self.tables.get(family, pd.DataFrame())

    @property
    def verdicts(self) -> pd.DataFrame:
        """Each case's tokens (or beams, or samples) against the reference."""
        return self.rows("tokens")

    @property
    def invariance(self) -> pd.DataFrame:
        return self.rows("invariance")

    @property
    def drift(self) -> pd.DataFrame:
        return self.rows("drift")
