"""The tools verdict's rules: calls compared as JSON values, splits part by part, markup left in an answer, and where
two prompts part by template part; and what agent requests may hold (harness.core.agent_requests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.compare import tool_rules
from harness.core.agent_requests import Message, Tool, message_order_problem, template_messages, wire_messages

WEATHER = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}
TIME = {"name": "local_time", "arguments": '{"city":"Paris"}'}


def split(calls=(), content="", reasoning=None):
    return {"content": content, "reasoning": reasoning, "tool_calls": list(calls)}


def test_calls_are_compared_as_json_values_not_strings() -> None:
    spaced = {"name": "local_time", "arguments": '{"city": "Paris"}'}
    assert tool_rules.split_difference(split([WEATHER, TIME]), split([WEATHER, spaced])) is None
    reordered = {"name": "get_weather", "arguments": '{"unit": "celsius", "city": "Paris"}'}
    assert tool_rules.split_difference(split([WEATHER]), split([reordered])) is None


@pytest.mark.parametrize(("got", "words"), [
    ([WEATHER], "1 call(s) where 2 expected"),
    ([TIME, WEATHER], "call 0 is 'local_time' where 'get_weather' expected"),
    ([{**WEATHER, "arguments": '{"city": "Paris", "unit": "celsius"'}, TIME], "are not JSON"),
    ([{**WEATHER, "arguments": '{"city": "Rome", "unit": "celsius"}'}, TIME], "where '{\"city\": \"Paris\""),
    ([{**WEATHER, "arguments": ""}, TIME], "arguments '' are not JSON"),
])
def test_a_call_that_differs_is_named(got, words) -> None:
    difference = tool_rules.split_difference(split([WEATHER, TIME]), split(got))
    assert difference is not None and difference.kind == "calls" and words in difference.words, difference


def test_reasoning_and_content_differ_as_text_and_whitespace_alone_is_only_said() -> None:
    expected = split([WEATHER], content="", reasoning="\nI check.\n")
    assert tool_rules.split_difference(expected, split([WEATHER], content="\n\n", reasoning="I check.")) is None
    notes = tool_rules.whitespace_notes(expected, split([WEATHER], content="\n\n", reasoning="\nI check.\n"))
    assert notes == ["content differs in whitespace only ('\\n\\n' against '')"]
    moved = tool_rules.split_difference(expected, split([WEATHER], content="I check.", reasoning=None))
    assert moved is not None and moved.kind == "reasoning-split" and moved.part == "reasoning"


def test_markup_a_parser_should_have_consumed_is_named() -> None:
    assert tool_rules.leaked_markup(split(content="</think>\n\nIt is sunny.")) == \
        "content holds </think>: the parser left its markup in the answer"
    assert tool_rules.leaked_markup(split(content="It is sunny.", reasoning="I check.")) is None


def test_where_two_prompts_part_is_named_by_template_part() -> None:
    """A toy template: system turn with a tools line, each message, a thinking switch after the generation prompt."""
    def render(messages, tools, kwargs, generation):
        text = "<sys>" + (f"tools={[t['name'] for t in tools]}" if tools else "") + "</sys>"
        text += "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        if generation:
            text += "<assistant>" + ("<think></think>" if kwargs.get("enable_thinking") is False else "")
        return text

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "weather?"}]
    tools, kwargs = [{"name": "get_weather"}], {"enable_thinking": False}
    spans = tool_rules.template_spans(render, messages, tools, kwargs)
    full = render(messages, tools, kwargs, True)
    assert tool_rules.where_prompts_part(full.index("get_weather"), spans) == "the tools block"
    assert tool_rules.where_prompts_part(full.index("weather?"), spans) == "message 2 (user)"
    assert tool_rules.where_prompts_part(full.index("yo"), spans) == "message 1 (assistant)"
    assert tool_rules.where_prompts_part(full.index("<think>"), spans) == \
        "what the template switches change (enable_thinking)"
    assert tool_rules.where_prompts_part(0, spans) == "outside the parts the template renders"


CALL = {"id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOLS = [Tool(function={"name": "get_weather", "parameters": {"type": "object", "properties": {}}})]


@pytest.mark.parametrize(("messages", "index", "words"), [
    ([{"role": "tool", "content": "x"}], 0, "follows no assistant message with tool_calls"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], 1, "comes first or not at all"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [CALL]}], 1, "the last message is"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "c9", "content": "{}"}], 2, "names none of the calls before it (c1)"),
    ([{"role": "user", "content": "a", "tool_calls": [CALL]}], 0, "only an assistant message does"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "nope", "arguments": {}}}]}, {"role": "tool", "content": "{}"}], 1,
     "'nope', which is not among the scenario's tools"),
])
def test_a_message_order_no_chat_api_takes_is_found(messages, index, words) -> None:
    problem = message_order_problem([Message(**m) for m in messages], TOOLS)
    assert problem is not None and problem[0] == index and words in problem[1], problem


def test_a_usable_exchange_passes_and_goes_on_the_wire_with_ids_and_json_string_arguments() -> None:
    messages = [Message(**m) for m in [
        {"role": "user", "content": "a"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"t": 18}'}]]
    assert message_order_problem(messages, TOOLS) is None
    wire = wire_messages(template_messages(messages))
    assert wire[1]["tool_calls"] == [{"id": "call_1_0", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert wire[2] == {"role": "tool", "content": '{"t": 18}', "tool_call_id": "call_1_0"}


@pytest.mark.parametrize(("tool", "words"), [
    ({"function": {"name": "f", "parameters": {"type": "string"}}}, "JSON Schema of an object"),
    ({"function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}, "not a valid JSON Schema"),
    ({"function": {"name": "a b", "parameters": {"type": "object"}}}, "function name 'a b'"),
    ({"type": "code", "function": {"name": "f"}}, "'function'"),
])
def test_a_tool_that_is_no_function_definition_is_refused(tool, words) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Tool(**tool)


def test_params_says_who_renders_and_parses_for_each_engine() -> None:
    from harness.scenario.spec import load
    from harness.semantics import agents

    root = Path(__file__).parents[2] / "scenarios"
    scenario = load(root / "agent-tools.yaml")
    table = {row[0]: row[1:] for row in agents.rows(scenario, list(scenario.spec.engines))}
    assert table["hf"] == ["the harness (its ids)", "-", "-", "the harness's render"]
    assert table["vllm"] == ["vLLM's own chat path", "hermes (vllm's parser, run on its text)",
                             "qwen3 (vllm's parser, run on its text)", "per request (vLLM's chat path)"]
    assert table["vllm-server"] == ["the server's own template", "hermes (the server's parser)",
                                    "qwen3 (the server's parser)", "per request"]
    scenario = load(root / "agent-llamacpp.yaml")
    assert agents.rows(scenario, ["llama.cpp-server"]) == [[
        "llama.cpp-server", "its GGUF's embedded template", "only for a named tool_choice", "none",
        "at start only: {}"]]
    faults = load(root / "agent-faults.yaml")
    assert agents.rows(faults, ["whole-call-and-template"])[0][1] == "--chat-template template-copy.jinja"
    assert agents.wanted(scenario) and not agents.wanted(load(root / "quickstart.yaml"))


def test_the_stream_knob_reads_a_split_answer_by_its_calls_and_reasoning() -> None:
    from harness.compare.invariance_rules import answer_differences
    from harness.core.types import Result

    def result(message, text=""):
        return Result(case_id="c", engine="e", status="ok", token_ids=[1, 2], text=text, finish_reason="tool_calls",
                      message=message)

    whole = split([WEATHER, TIME], content="", reasoning="I check.")
    spaced = split([WEATHER, {**TIME, "arguments": '{"city": "Paris"}'}], content="\n\n", reasoning="I check.")
    assert answer_differences([result(whole)], [result(spaced, "\n\n")]) == []
    cut = split([{**WEATHER, "arguments": WEATHER["arguments"][:-1]}, TIME], reasoning="I check.")
    [(case, words)] = answer_differences([result(whole)], [result(cut)])
    assert case == "c" and words.startswith("the answer splits otherwise: call 0 (get_weather): arguments")
