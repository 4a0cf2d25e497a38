"""Scenario validation and expansion (no engines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.errors import ConfigError
from harness.scenario.spec import load

from helpers import SCENARIOS, write_scenario

VALID = """\
model: tiny-llama
engines:
  a: {engine: hf, reference: true}
  b: {engine: vllm, params: {frequency_penalty: 0.5}}
prompts:
  - "plain text"
  - {id: chat, messages: [{role: user, content: hi}]}
params: {temperature: 0, max_new_tokens: 4}
grid: {repetition_penalty: [1.0, 1.2]}
"""


def test_grid_expands_prompts_times_points_with_engine_overrides(tmp_path: Path) -> None:
    scenario = load(write_scenario(tmp_path / "s.yaml", VALID))
    assert [c.case_id for c in scenario.cases] == [
        "p0[repetition_penalty=1.0]", "chat[repetition_penalty=1.0]",
        "p0[repetition_penalty=1.2]", "chat[repetition_penalty=1.2]"]
    last = scenario.cases[-1]
    assert last.engine_params["a"].repetition_penalty == 1.2 and last.engine_params["a"].frequency_penalty is None
    assert last.engine_params["b"].frequency_penalty == 0.5 and last.engine_params["b"].greedy
    assert scenario.spec.reference == "a"


def test_prompts_from_files(tmp_path: Path) -> None:
    (tmp_path / "lines.txt").write_text("first prompt\n\nsecond prompt\n")
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"token_ids": [1, 2]}\n')
    text = VALID.replace('  - "plain text"\n', "  - {file: lines.txt}\n  - {file: chat.jsonl}\n")
    scenario = load(write_scenario(tmp_path / "s.yaml", text.replace("grid:", "#grid:")))
    assert [c.case_id for c in scenario.cases] == ["lines-0", "lines-1", "chat-0", "chat-1", "chat"]
    assert scenario.cases[1].prompt.text == "second prompt"
    assert scenario.cases[3].prompt.token_ids == [1, 2]


@pytest.mark.parametrize("mutation, where, words", [
    (("  b: {engine: vllm,", "  b: {engine: nosuch,"), ":4:", "engines.b.engine: unknown engine 'nosuch'"),
    (("params: {temperature: 0", "params: {temprature: 0"), ":8:", "params.temprature: unknown key"),
    (("max_new_tokens: 4", "max_new_tokens: -4"), ":8:", "params.max_new_tokens"),
    (("{engine: hf, reference: true}", "{engine: hf}"), ":2:", "exactly one engine needs reference: true"),
    (("b: {engine: vllm,", "b: {engine: vllm, options: {enforce_eagr: true},"), ":4:",
     "engines.b.options.enforce_eagr"),
    (("frequency_penalty: 0.5", "frequency_penalty: 5"), ":4:", "engines.b.params.frequency_penalty"),
    (("- {id: chat,", "- {id: chat, text: x,"), ":7:", "exactly one of text, messages, token_ids, file"),
    (("[1.0, 1.2]}", "[1.0, 1.2]"), ":10:", "invalid YAML"),
])
def test_bad_files_name_file_line_and_key(tmp_path: Path, mutation, where, words) -> None:
    old, new = mutation
    assert old in VALID
    path = write_scenario(tmp_path / "bad.yaml", VALID.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load(path)
    message = info.value.message
    assert message.startswith(f"{path}{where}"), message
    assert words in message, message
    assert "\n" not in message


def test_missing_prompt_file_is_named(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "s.yaml", VALID.replace('  - "plain text"', "  - {file: nope.txt}"))
    with pytest.raises(ConfigError, match=r"s.yaml:6: prompts.0.file: prompt file .*nope.txt does not exist"):
        load(path)


def test_shipped_scenarios_are_valid() -> None:
    for path in sorted(SCENARIOS.glob("*.yaml")):
        assert load(path).cases, path


@pytest.mark.parametrize("text", ["?\n", "name: x\n1: 2\n"])
def test_keys_that_are_not_strings_are_a_config_error(tmp_path: Path, text: str) -> None:
    """YAML allows a null (`?`) or number key; a scenario's keys are names (found by the fuzz suite: a TypeError)."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=str(path)):
        load(path)
