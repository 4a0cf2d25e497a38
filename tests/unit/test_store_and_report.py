"""The run directory as readers see it: a stored run renders to summary.md and HTML, a baseline is saved from it,
and a damaged, partial or older run directory is a one-line error, never a crash in pandas or pyarrow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.compare.baseline import save
from harness.compare.gate import compare_to_baseline, judge_run, out_of_expectation
from harness.compare.token_rules import judge
from harness.core.errors import ConfigError
from harness.core.types import Beam, Result
from harness.report.html import build
from harness.report.summary import write_summary
from harness.rundir.store import FORMAT_VERSION, EngineMeta, RunMeta, read_meta, write_meta
from harness.rundir.tables import STEP_TYPES, beams_frame, read_parquet, results_frame, steps_frame, write_parquet
from harness.scenario.spec import load
from harness.verdicts.family import families

from helpers import parity_in_process, write_scenario

SCENARIO = """\
model: tiny-llama
engines:
  ref: {engine: hf, reference: true}
  other: {engine: hf, params: {repetition_penalty: 1.3}}
prompts: [{id: a, text: "x"}, {id: b, text: "y"}]
params: {temperature: 0, max_new_tokens: 3}
"""


def result(engine: str, case: str, ids: list[int], text: str = "<b>bold</b>") -> Result:
    return Result(case_id=case, engine=engine, status="ok", prompt_ids=[1], token_ids=ids, text=text,
                  chosen_logprobs=[-0.1] * len(ids), top_ids=[[i, 9] for i in ids],
                  top_logprobs=[[-0.1, -2.0]] * len(ids), finish_reason="length")


def write_run(tmp_path: Path, results: list[Result], run_id: str = "20261123-000000-s") -> Path:
    """A run directory written by the store's own functions from hand-built results."""
    scenario = load(write_scenario(tmp_path / "s.yaml", SCENARIO))
    verdicts = judge(scenario, {(r.engine, r.case_id): r for r in results}, lambda t: f"tok{t}")
    run = tmp_path / "reports" / run_id
    run.mkdir(parents=True)
    engine = EngineMeta(engine="hf", dtype="float32", threads=1, python="python", model_path=str(tmp_path / "gone"))
    meta = RunMeta(run_id=run.name, scenario="s.yaml", scenario_name="s", scenario_text=SCENARIO, model="tiny-llama",
                   reference="ref", started="now", status="finished", exit_code=1,
                   engines={"ref": engine, "other": engine})
    write_parquet(run / "results.parquet", results_frame(results, {}, {}))
    write_parquet(run / "steps.parquet", steps_frame(results))
    write_parquet(run / "verdicts.parquet", verdicts)
    if any(r.beams for r in results):
        write_parquet(run / "beams.parquet", beams_frame(results))
    write_meta(run, meta)
    write_summary(run / "summary.md", meta, {"tokens": verdicts})
    return run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path, [result("ref", "a", [5, 6, 7]), result("ref", "b", [5, 6, 7]),
                                result("other", "a", [5, 6, 7]), result("other", "b", [5, 8, 7])])


def test_a_stored_run_renders_to_markdown_and_html(run_dir: Path) -> None:
    summary = (run_dir / "summary.md").read_text()
    assert "| a | other | match |" in summary and "| b | other | diverged | NO | 1 |" in summary
    html, _ = build(run_dir)
    assert "id='verdicts'" in html and "class='diverged'" in html and "top-k at step 1" in html
    assert "&lt;b&gt;" not in html or "<b>bold</b>" not in html  # engine text never lands unescaped
    assert json.loads((run_dir / "run.json").read_text())["format_version"] == FORMAT_VERSION
    done = parity_in_process("report", str(run_dir))
    assert done.code == 0 and (run_dir / "report.html").exists()


def test_a_baseline_is_saved_from_a_stored_run_and_compared(run_dir: Path, tmp_path: Path) -> None:
    path = save(run_dir, tmp_path / "baselines")
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 4 and json.loads(lines[0])["scenario"] == "s"
    old = json.loads(lines[1])
    moved = {**old, "token_ids": old["token_ids"][:1] + [99] + old["token_ids"][2:]}
    assert compare_to_baseline(old, moved, 1e-3) == ["tokens moved against the baseline from step 1"]
    assert compare_to_baseline(old, old, 1e-3) == []


@pytest.mark.parametrize("name", ["../escaped", "a\x00b", ".."])
def test_a_scenario_name_that_is_no_file_name_is_refused_in_one_line(run_dir: Path, tmp_path: Path, name: str) -> None:
    """A damaged run.json (or a scenario named "a/b") must not write a baseline outside its folder, nor reach the OS
    with a NUL byte: one line naming run.json's key."""
    write_meta(run_dir, read_meta(run_dir).model_copy(update={"scenario_name": name}))
    with pytest.raises(ConfigError, match=r"run\.json: scenario_name: the scenario name .* cannot name a baseline"):
        save(run_dir, tmp_path / "baselines")
    assert not (tmp_path / "escaped.jsonl").exists() and not (tmp_path / "baselines").exists()


def beam_result(engine: str, case: str, second: list[int]) -> Result:
    best = result(engine, case, [5, 6, 7])
    return best.model_copy(update={"beams": [Beam(token_ids=[5, 6, 7], logprobs=[-0.1] * 3, cum_logprob=-0.3),
                                             Beam(token_ids=second, logprobs=[-0.2] * 3, cum_logprob=-0.6)]})


def test_a_beam_search_baseline_gates_every_beam(tmp_path: Path) -> None:
    """Only the second beam of one case moves: the gate fails that case and names the beam and step."""
    cases = [(e, c) for e in ("ref", "other") for c in ("a", "b")]
    before = write_run(tmp_path, [beam_result(e, c, [5, 6, 8]) for e, c in cases], "20261123-000000-s")
    after = write_run(tmp_path, [beam_result(e, c, [5, 9, 8] if (e, c) == ("other", "b") else [5, 6, 8])
                                 for e, c in cases], "20261123-000001-s")
    save(before, tmp_path / "baselines")
    gated = {(g.engine, g.case_id): g.failures for g in judge_run(after, tmp_path / "baselines", {}, {})}
    assert gated.pop(("other", "b")) == ["beam 2 moved against the baseline from step 1"]
    assert all(not failures for failures in gated.values()), gated
    assert all(not g.failures for g in judge_run(before, tmp_path / "baselines", {}, {}))


def test_a_text_or_constraint_finding_fails_the_gate_like_a_token_verdict(run_dir: Path, tmp_path: Path) -> None:
    """Every per-case verdict table gates its cases: the reference's own text and another engine's constrained
    answer fail them though their tokens matched the baseline; a table of rows per knob (invariance) is not one."""
    save(run_dir, tmp_path / "baselines")
    text = pd.DataFrame({"case_id": ["a", "a"], "engine": ["ref", "other"], "expected": [False, True],
                         "explanation": ["detokeniser: the text leaves the decoding of its own ids", "as the ids"]})
    constraint = pd.DataFrame({"case_id": ["a"], "engine": ["other"], "expected": [False],
                               "explanation": ["changed: the constraint masked a token"]})
    unexpected = out_of_expectation([text, constraint])
    assert unexpected == {("ref", "a"): "detokeniser: the text leaves the decoding of its own ids",
                          ("other", "a"): "changed: the constraint masked a token"}
    gated = {(g.engine, g.case_id): g.failures for g in judge_run(run_dir, tmp_path / "baselines", unexpected, {})}
    assert gated[("ref", "a")] == ["out of expectation: detokeniser: the text leaves the decoding of its own ids"]
    assert gated[("other", "a")] == ["out of expectation: changed: the constraint masked a token"]
    assert not gated[("ref", "b")] and not gated[("other", "b")]
    per_case = [family.name for family in families() if family.per_case]
    # what `parity gate` reads a case's verdicts from
    assert per_case == ["tokens", "text", "tools", "constraint", "drift"]


@pytest.mark.parametrize("damage, words", [
    (lambda run: (run / "run.json").unlink(), "not a run directory (no run.json)"),
    (lambda run: (run / "run.json").write_text("{not json"), "run.json: unreadable"),
    (lambda run: (run / "run.json").write_text("[1, 2]"), "not a run.json"),
    (lambda run: _edit(run, lambda m: m.pop("format_version")), "run-directory format 1"),
    (lambda run: _edit(run, lambda m: m.update(status=3)), "run.json: status"),
    (lambda run: (run / "results.parquet").write_bytes(b"PAR1 truncated"), "results.parquet: unreadable parquet"),
    (lambda run: (run / "steps.parquet").unlink(), "steps.parquet: missing"),
    (lambda run: _edit_results(run, "params", "x"), "results.parquet: column params: 'x' is not JSON"),
])
def test_damaged_run_directories_are_one_line_errors(run_dir: Path, damage, words: str) -> None:
    damage(run_dir)
    with pytest.raises(ConfigError, match=re.escape(words)):
        build(run_dir)
    for args in (["report", str(run_dir)], ["baseline", "save", str(run_dir), "--to", str(run_dir / "b")]):
        done = parity_in_process(*args)
        assert done.code == 2 and words.split(":")[-1].strip().split()[0] in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def _edit(run: Path, change) -> None:
    meta = json.loads((run / "run.json").read_text())
    change(meta)
    (run / "run.json").write_text(json.dumps(meta))


def test_read_meta_round_trips(run_dir: Path) -> None:
    meta = read_meta(run_dir)
    assert meta.reference == "ref" and meta.engines["other"].dtype == "float32"


def _edit_results(run: Path, column: str, value: str) -> None:
    frame = pd.read_parquet(run / "results.parquet")
    frame[column] = value
    write_parquet(run / "results.parquet", frame)


def test_a_run_without_steps_reads_back(tmp_path: Path) -> None:
    """A beam-search-only run has no per-step rows: its empty steps table (pandas types empty columns float64) still
    reads back for baseline save and the HTML report."""
    write_parquet(tmp_path / "steps.parquet", steps_frame([]))
    assert read_parquet(tmp_path, "steps.parquet", STEP_TYPES).empty


def test_a_nullable_column_with_no_values_reads_back(tmp_path: Path) -> None:
    """Beam verdicts have no first divergent step: their step columns hold only nulls, which pandas writes float64."""
    write_parquet(tmp_path / "t.parquet", pd.DataFrame({"flag": [None, None], "name": ["a", None]}))
    assert len(read_parquet(tmp_path, "t.parquet", {"flag": "bool?"})) == 2
    with pytest.raises(ConfigError, match="column name: has empty"):
        read_parquet(tmp_path, "t.parquet", {"name": "str"})
