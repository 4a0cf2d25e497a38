"""Property-based fuzzing of what agents send in a scenario: `tools`, `tool_choice`, `chat_template_kwargs` and
messages with calls and tool results. A usable change must validate (exit 0); an odd one must be a one-line error
(exit 2) naming the scenario file and the key; a value of any other kind ends either way, never with a traceback.
`parity validate` runs in-process; no engine starts."""

from __future__ import annotations

import copy
import itertools
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import NOWHERE, fuzz_settings, validated

NUMBERED = itertools.count()
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "now", "parameters": CITY}}
CALL = {"id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
EXCHANGE = [{"role": "user", "content": "weather?"}, {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"t": 18}'}]
ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                   lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children,
                                                                                     max_size=3), max_leaves=6)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="parity-fuzz-agent-") as tmp:
        yield Path(tmp)


def _scenario(**change: Any) -> dict[str, Any]:
    data = {"model": "tiny-llama", "engines": {"ref": {"engine": "hf", "reference": True, "python": NOWHERE},
                                               "other": {"engine": "vllm", "python": NOWHERE}},
            "tools": [copy.deepcopy(WEATHER)], "prompts": [{"id": "p", "messages": copy.deepcopy(EXCHANGE)}],
            "params": {"temperature": 0, "max_new_tokens": 4}}
    for key, value in change.items():
        if key == "messages":
            data["prompts"][0]["messages"] = value
        elif key == "parameters":
            data["tools"][0]["function"]["parameters"] = value
        elif key == "name":
            data["tools"][0]["function"]["name"] = value
        else:
            data[key] = value
    return data


ODD = {  # key -> values a chat API cannot take, and the words the error must name
    "parameters": (st.sampled_from([{"type": "string"}, {"type": "array"}, {"properties": {}}, {"type": "object",
                                    "properties": 5}, {"type": "object", "required": "city"}, []]),
                   ["tools", "parameters"]),
    "name": (st.sampled_from(["", "get weather", "x" * 65, "a/b", 5]), ["tools", "name"]),
    "tool_choice": (st.sampled_from(["sometimes", {"type": "function", "function": {"name": "nope"}},
                                     {"type": "function"}, {"function": {"name": "get_weather", "x": 1}}]),
                    ["tool_choice"]),
    "messages": (st.sampled_from([
        [{"role": "tool", "content": "x"}, {"role": "user", "content": "a"}],
        [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
        EXCHANGE[:2],
        [*EXCHANGE[:2], {"role": "tool", "tool_call_id": "c9", "content": "{}"}],
        [{"role": "user", "content": "a", "tool_calls": [CALL]}],
        [{"role": "robot", "content": "a"}],
        [EXCHANGE[0], {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": "{not json"}}]}, EXCHANGE[2]],
        [EXCHANGE[0], {"role": "assistant", "tool_calls": [{"function": {"name": "other", "arguments": {}}}]},
         EXCHANGE[2]],
    ]), ["prompts", "messages"]),
    "chat_template_kwargs": (st.sampled_from([["enable_thinking"], "enable_thinking", 5]), ["chat_template_kwargs"]),
}
FINE = {
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function",
                                                                  "function": {"name": "get_weather"}}]),
    "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x"]), st.booleans(), max_size=2),
    "parameters": st.sampled_from([{"type": "object"}, {"type": "object", "properties": {"n": {"type": "integer"}},
                                                         "required": ["n"]}]),
    "messages": st.sampled_from([EXCHANGE, [{"role": "system", "content": "s"}, *EXCHANGE],
                                 [EXCHANGE[0], {"role": "assistant", "tool_calls": [
                                     {"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
                                  {"role": "tool", "content": "{}"}]]),
}


@st.composite
def agent_change(draw) -> tuple[dict[str, Any], list[str] | None]:
    kind = draw(st.sampled_from(["odd", "fine", "any"]))
    if kind == "odd":
        key = draw(st.sampled_from(sorted(ODD)))
        values, words = ODD[key]
        return {key: draw(values)}, words
    if kind == "fine":
        key = draw(st.sampled_from(sorted(FINE)))
        return {key: draw(FINE[key])}, []
    return {draw(st.sampled_from([*ODD, "tools"])): draw(ANY)}, None


@fuzz_settings(150)
@given(agent_change())
def test_agent_inputs_validate_or_fail_in_one_line_naming_the_key(workdir, change) -> None:
    data, words = change
    path = workdir / f"s{next(NUMBERED)}.yaml"
    path.write_text(yaml.safe_dump(_scenario(**data), sort_keys=False))
    validated(path, words)
