"""pytest plugin (entry point `parity`): `pytest scenarios/quickstart.yaml` runs a scenario and turns each case
and engine into a test item whose failure message is the verdict. Only YAML files with `model:` and `engines:`
at top level are collected; the scenario runs once, on its first item, through `parity run`'s own code."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("parity")
    group.addoption("--parity-out", default="reports", help="where parity scenario runs write their reports")


def pytest_collect_file(parent, file_path: Path):
    if file_path.suffix in (".yaml", ".yml") and _is_scenario(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def _is_scenario(path: Path) -> bool:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "engines" in data and "model" in data


class ScenarioFailure(Exception):
    pass


class ScenarioFile(pytest.File):
    def collect(self):
        from harness.core.errors import ParityError
        from harness.scenario.spec import load

        try:
            scenario = load(self.path)
        except ParityError as exc:
            raise self.CollectError(exc.message) from None
        self.outcome = None
        self.scenario = scenario
        reference = scenario.spec.reference
        for case in scenario.cases:
            for engine in scenario.spec.engines:
                if engine != reference:
                    yield ScenarioItem.from_parent(self, name=f"{case.case_id}[{engine}]", case_id=case.case_id,
                                                   engine=engine)

    def run_once(self):
        if self.outcome is None:
            from harness.run.execute import Selection, execute

            out = Path(self.config.getoption("parity_out"))
            self.outcome = execute(self.scenario, out, Selection(), None, lambda name, event: None,
                                   lambda scenario, run_dir: None)
        return self.outcome


class ScenarioItem(pytest.Item):
    def __init__(self, *, case_id: str, engine: str, **kwargs):
        super().__init__(**kwargs)
        self.case_id, self.engine = case_id, engine

    def runtest(self) -> None:
        from harness.core.errors import ParityError

        try:
            outcome = self.parent.run_once()
        except ParityError as exc:
            raise ScenarioFailure(exc.message) from None
        rows = outcome.verdicts[(outcome.verdicts.case_id == self.case_id) & (outcome.verdicts.engine == self.engine)]
        if rows.empty:
            raise ScenarioFailure("not run: the run was interrupted")
        row = rows.iloc[0]
        if not row.expected:
            raise ScenarioFailure(f"{row.verdict}: {row.explanation}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ScenarioFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name
