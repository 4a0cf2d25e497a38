"""Which cases explain may trace while the run still goes (harness.explain.early_passes.known_cases): those known
before the verdicts (--case, a one-case scenario), not decoded by beam search, in a scenario whose drift verdicts do
not take the reference's model after the run."""

from __future__ import annotations

from pathlib import Path

from harness.explain.early_passes import known_cases
from harness.scenario.spec import load

from helpers import write_scenario

SCENARIO = """\
name: cases
model: tiny-llama
engines:
  hf: {{engine: hf, reference: true}}
  other: {{engine: hf, dtype: bfloat16{drift}}}
prompts: {prompts}
params: {{max_new_tokens: 4{beams}}}
"""


def scenario(tmp_path: Path, prompts: list[str], beams: bool = False, drift: bool = False):
    text = SCENARIO.format(prompts=prompts, beams=", num_beams: 2" if beams else "",
                           drift=", drift: {max_mean_kld: 0.1}" if drift else "")
    return load(write_scenario(tmp_path / "s.yaml", text))


def test_the_only_case_of_a_scenario_and_requested_cases_are_known_before_the_verdicts(tmp_path: Path) -> None:
    assert known_cases(scenario(tmp_path, ["a"]), None) == ["p0"]
    assert known_cases(scenario(tmp_path, ["a", "b"]), ["p1"]) == ["p1"]


def test_cases_the_verdicts_choose_decoded_by_beam_search_or_beside_a_drift_verdict_are_not(tmp_path: Path) -> None:
    assert known_cases(scenario(tmp_path, ["a", "b"]), None) is None
    searched = scenario(tmp_path, ["a"], beams=True)
    assert known_cases(searched, None) is None and known_cases(searched, ["p0"]) is None
    assert known_cases(scenario(tmp_path, ["a"], drift=True), None) is None  # the drift's baseline: the reference
