"""`parity baseline save` and `parity gate` on the tiny model: pass against its own baseline, fail (exit 1) with
JUnit failures naming the cases when one engine's dtype changes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers import parity, write_scenario

pytestmark = pytest.mark.engines

GATED = """\
name: gated
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  hf-batched: {engine: hf, options: {batched: true}}
prompts: ["Hello world, this is", {id: chat, messages: [{role: user, content: "Hi there"}]}]
params: {max_new_tokens: 12, ignore_eos: true}
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("gate")
    scenario = write_scenario(tmp / "gated.yaml", GATED)
    run = parity("run", str(scenario), out=tmp / "reports")
    assert run.code == 0, run.stdout
    saved = parity("baseline", "save", str(run.run_dir), "--to", str(tmp / "baselines"))
    assert saved.code == 0 and "gated.jsonl" in saved.stdout
    return scenario, tmp / "baselines"


def test_gate_passes_against_its_own_baseline(saved, tmp_path: Path) -> None:
    scenario, baselines = saved
    lines = (baselines / "gated.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 2 * 2  # header + one line per case and engine
    run = parity("gate", str(scenario), "--baseline", str(baselines), "--junit", str(tmp_path / "junit.xml"),
                 "--summary", str(tmp_path / "summary.md"), out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:]
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    assert "PASS (4/4 passed)" in (tmp_path / "summary.md").read_text()


def test_gate_fails_when_an_engine_changes_dtype(saved, tmp_path: Path) -> None:
    scenario, baselines = saved
    changed = write_scenario(tmp_path / "gated.yaml", GATED.replace("options: {batched: true}",
                                                                     "options: {batched: true}, dtype: bfloat16"))
    run = parity("gate", str(changed), "--baseline", str(baselines), "--junit", str(tmp_path / "junit.xml"),
                 out=tmp_path / "reports")
    assert run.code == 1, run.stdout[-3000:]
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    failed = {case.get("name"): case.find("failure").text for case in suite if case.find("failure") is not None}
    assert set(failed) == {"p0 [hf-batched]", "chat [hf-batched]"}
    assert all("moved" in text for text in failed.values())
    assert "REGRESSION gated p0 [hf-batched]" in run.stdout


def test_gate_without_baseline_is_a_config_error(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "gated.yaml", GATED)
    (tmp_path / "empty").mkdir()
    run = parity("gate", str(scenario), "--baseline", str(tmp_path / "empty"), out=tmp_path / "reports")
    assert run.code == 2 and "no baseline for scenario 'gated'" in run.stderr
    assert not (tmp_path / "reports").exists()
    run = parity("gate", str(scenario), "--baseline", str(tmp_path / "none"), out=tmp_path / "reports")
    assert run.code == 2 and f"--baseline {tmp_path / 'none'}: does not exist" in run.stderr
