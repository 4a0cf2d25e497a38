"""The verdict-family and report-section plug points: a family defined in one module (here, this test module) is
judged with the run's results, written as its own table, and shown in summary.md, the HTML report and the console;
a report section is shown in the HTML report; a plug-in from an installed package's entry point joins them, and one
that is broken is set aside with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.core.types import Result
from harness.render.console import console
from harness.render.html_parts import esc
from harness.render.markdown import table
from harness.render.page import Page
from harness.report.html import build
from harness.report.sections import SECTIONS, ReportSection
from harness.report.summary import write_summary
from harness.run.finish import judge_families
from harness.rundir.store import RunMeta, write_meta
from harness.rundir.tables import results_frame, steps_frame, write_parquet
from harness.scenario.spec import load
from harness.verdicts.family import FAMILIES, Judged, Judging, VerdictFamily, families

from helpers import fake_distribution, write_scenario

SCENARIO = """\
model: tiny-llama
engines:
  ref: {engine: hf, reference: true}
  other: {engine: hf}
prompts: [{id: a, text: "x"}, {id: b, text: "y"}]
params: {temperature: 0, max_new_tokens: 3}
"""


class LengthVerdicts(VerdictFamily):
    """A trivial family: each engine's generation must be as long as the reference's."""

    name = "length"
    table = "length.parquet"
    columns = {"case_id": "str", "engine": "str", "expected": "bool", "explanation": "str", "tokens": "int"}
    title = "Generation length"
    anchor = "length"

    def judge(self, judging: Judging) -> Judged:
        ref = judging.scenario.spec.reference
        rows = []
        for (engine, case_id), result in judging.compared.items():
            if engine == ref:
                continue
            want = len(judging.compared[(ref, case_id)].token_ids)
            rows.append({"case_id": case_id, "engine": engine, "expected": len(result.token_ids) == want,
                         "explanation": f"{len(result.token_ids)} tokens against the reference's {want}",
                         "tokens": len(result.token_ids)})
        return Judged(pd.DataFrame(rows, columns=list(self.columns)))

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        return table(["case", "engine", "tokens"], [[r.case_id, r.engine, str(r.tokens)] for r in rows.itertuples()])

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        return "<ul>" + "".join(f"<li>{esc(r.case_id)} {esc(r.engine)}: {esc(r.explanation)}</li>"
                                for r in rows.itertuples()) + "</ul>"

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        console.print(f"length verdicts against {reference}: {len(rows)} rows", markup=False)


def _result(engine: str, case: str, ids: list[int]) -> Result:
    return Result(case_id=case, engine=engine, status="ok", prompt_ids=[1], token_ids=ids, text="t",
                  chosen_logprobs=[-0.1] * len(ids), top_ids=[[i, 9] for i in ids],
                  top_logprobs=[[-0.1, -2.0]] * len(ids), finish_reason="length")


@pytest.fixture
def length_family():
    family = LengthVerdicts()
    FAMILIES.register(family)
    yield family
    FAMILIES.unregister(family.name)


def test_a_family_in_one_module_is_judged_written_and_rendered_everywhere(tmp_path: Path, length_family,
                                                                          capsys) -> None:
    scenario = load(write_scenario(tmp_path / "s.yaml", SCENARIO))
    results = [_result("ref", "a", [5, 6, 7]), _result("ref", "b", [5, 6, 7]), _result("other", "a", [5, 6, 7]),
               _result("other", "b", [5, 6])]
    by_key = {(r.engine, r.case_id): r for r in results}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    judging = Judging(scenario=scenario, run_dir=run_dir, results=by_key, compared=by_key, decode=str, checks=[],
                      prompt_warnings={}, engine_prompt_warnings={}, interrupted=False)
    tables = judge_families(judging)
    assert list(tables) == ["tokens", "length"]  # the built-in token verdicts, then the registered family
    written = pd.read_parquet(run_dir / "length.parquet")
    assert written.expected.tolist() == [True, False] and written.tokens.tolist() == [3, 2]

    meta = RunMeta(run_id="r", scenario="s.yaml", scenario_name="s", scenario_text=SCENARIO, model="tiny-llama",
                   reference="ref", started="now", status="finished", exit_code=1)
    write_meta(run_dir, meta)
    write_parquet(run_dir / "results.parquet", results_frame(results, {}, {}))
    write_parquet(run_dir / "steps.parquet", steps_frame(results))
    write_summary(run_dir / "summary.md", meta, tables)
    summary = (run_dir / "summary.md").read_text()
    assert "## Generation length\n\n| case | engine | tokens |" in summary and "| b | other | 2 |" in summary
    page, _ = build(run_dir)
    assert "<h2 id='length'>Generation length</h2><ul><li>a other: 3 tokens against the reference&#x27;s 3" in page

    for family in families():  # what `parity run` prints, family by family
        if family.name in tables:
            family.print(tables[family.name], "ref")
    assert "length verdicts against ref: 2 rows" in capsys.readouterr().out


def test_a_report_section_in_one_module_is_shown_in_the_html_report(tmp_path: Path) -> None:
    results = [_result("ref", "a", [5, 6, 7]), _result("other", "a", [5, 6, 7])]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_meta(run_dir, RunMeta(run_id="r", scenario="s.yaml", scenario_name="s", scenario_text=SCENARIO,
                                model="tiny-llama", reference="ref", started="now"))
    write_parquet(run_dir / "results.parquet", results_frame(results, {}, {}))
    write_parquet(run_dir / "steps.parquet", steps_frame(results))
    section = ReportSection("notes", lambda page: f"<h2 id='notes'>Notes</h2><p>{len(page.results)} results</p>")
    SECTIONS.register(section)
    try:
        assert "<h2 id='notes'>Notes</h2><p>2 results</p>" in build(run_dir)[0]
    finally:
        SECTIONS.unregister("notes")
    assert "id='notes'" not in build(run_dir)[0]


def test_a_family_from_an_installed_package_joins_and_a_broken_one_is_set_aside(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """Entry points as an installed package declares them (a .dist-info folder on sys.path)."""
    site = tmp_path / "site"
    fake_distribution(site, "parity_length_family",
                      "import sys\nFAMILY = sys.modules['test_verdict_families'].LengthVerdicts()\nNOT_A_FAMILY = 42\n",
                      {"llm_parity.verdict_families": {"length": "parity_length_family:FAMILY",
                                                       "broken": "parity_length_family:NOT_A_FAMILY"}})
    monkeypatch.syspath_prepend(str(site))
    registry = type(FAMILIES)(VerdictFamily, FAMILIES.builtin_paths, FAMILIES.group, FAMILIES.name_of,
                              FAMILIES.check)
    assert [f.name for f in registry.all()] == ["tokens", "text", "tools", "constraint", "invariance", "drift",
                                                "length"]
    [problem] = registry.problems()
    assert "broken (parity_length_family:NOT_A_FAMILY): it is a int, not a VerdictFamily" in problem
    assert "parity_length_family" in sys.modules
