"""What an HTML report's sections read from a run directory, each file read (and checked) once, when first asked, and
the further pages a large report is split into."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.rundir.store import RunMeta, read_meta
from harness.rundir.tables import read_results, read_steps

if TYPE_CHECKING:
    import pandas as pd


class Page:
    def __init__(self, run_dir: Path, stem: str = "report"):
        self.run_dir = run_dir
        self.stem = stem  # the report's file name without .html: further pages are named after it
        self.further: dict[str, tuple[str, str]] = {}  # file name -> (title, body) of a further page

    def further_page(self, number: int) -> str:
        """The file name of the report's further page NUMBER (2, 3, ...), beside the report."""
        return f"{self.stem}-cases-{number}.html"

    @cached_property
    def meta(self) -> RunMeta:
        return read_meta(self.run_dir)

    @property
    def reference(self) -> str:
        return self.meta.reference

    @cached_property
    def results(self) -> pd.DataFrame:
        return read_results(self.run_dir)

    @cached_property
    def steps(self) -> pd.DataFrame:
        return read_steps(self.run_dir)

    @cached_property
    def result_of(self) -> dict[tuple[str, str], Any]:
        """(engine, case id) -> its row of results.parquet (a report looks up every case: one pass, not a filter
        each)."""
        return {(r.engine, r.case_id): r for r in self.results.itertuples()}

    @cached_property
    def steps_of(self) -> dict[tuple[str, str], pd.DataFrame]:
        """(engine, case id) -> its rows of steps.parquet, indexed by step."""
        return {key: rows.set_index("step") for key, rows in self.steps.groupby(["engine", "case_id"], sort=False)}

    @cached_property
    def decode(self) -> Callable[[int], str]:
        """A token id as text in the reference's tokenizer; `#id` when its model folder is gone."""
        from harness.scenario.prompts import load_tokenizer

        reference = self.meta.engines.get(self.meta.reference)
        if reference is None:  # the run was interrupted before the reference started
            return lambda token: f"#{token}"
        try:
            tokenizer = load_tokenizer(Path(reference.model_path))
        except Exception:  # the model folder may be gone: show ids instead of text
            return lambda token: f"#{token}"
        return lambda token: tokenizer.decode([int(token)]) if token >= 0 else "(none)"
