"""Split invariance, run without a model: vLLM's parsers that the shipped scenarios use, fed tiny-agent's scripted
answers whole, one token per chunk and in seeded random chunks, give the unstreamed split every time; the planted
parsers of scenarios/agent_faults are named by kind (a call that loses its closing brace or its arguments, a bare
</think> in the content). vLLM's parsers are imported here (about 10 s, once for the module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.engines.engine_parsers import parsing_for
from adapters.engines.parser_runs import ParserOptions, chunkings, split_differences
from harness.compare import tool_rules
from harness.models import agent
from harness.models.catalog import agent_tokenizer

FAULTS = Path(__file__).parents[2] / "scenarios" / "agent_faults"
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("get_weather", "local_time")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-agent-tokenizer")
    agent_tokenizer().save_pretrained(out)
    return out


def _words(difference):
    return difference.words if difference else None


def _read(folder: Path, options: ParserOptions, script: agent.Script, thinking: bool = True, engine: str = "vllm"):
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
               "chat_template_kwargs": {} if thinking else {"enable_thinking": False}}
    parsing = parsing_for(engine, options, folder, request)
    ids = parsing.tokenizer.encode(script.answer, add_special_tokens=False)
    prompt = parsing.tokenizer.encode("<|im_start|>user\nWeather in Paris?<|im_end|>\n" + script.prompt_tail,
                                      add_special_tokens=False)
    text = parsing.decode(ids)
    return parsing.whole(text, ids, prompt), split_differences(parsing, text, ids, prompt,
                                                               lambda a, b: _words(tool_rules.split_difference(a, b)))


def test_the_shipped_parsers_give_one_split_however_the_answer_arrives(folder) -> None:
    options = ParserOptions(tool_parser="hermes", reasoning_parser="qwen3")
    whole, differences = _read(folder, options, agent.SCRIPTS[0])
    assert differences == {}
    assert [c["name"] for c in whole["tool_calls"]] == ["get_weather", "local_time"]
    assert "I call get_weather and local_time" in whole["reasoning"] and not whole["content"].strip()
    whole, differences = _read(folder, options, agent.SCRIPTS[1], thinking=False)
    assert differences == {} and whole == {"content": agent.SCRIPTS[1].answer, "reasoning": None, "tool_calls": []}


def test_lmdeploys_own_parsers_give_one_split_however_the_answer_arrives(folder) -> None:
    """lmdeploy's api_server parsers (its qwen3 tool parser and default reasoning parser), run as its server runs
    them: the same calls and thinking as vLLM's parsers read, whole or in chunks."""
    options = ParserOptions(tool_parser="qwen3", reasoning_parser="default")
    whole, differences = _read(folder, options, agent.SCRIPTS[0], engine="lmdeploy-server")
    assert differences == {}, differences
    assert [c["name"] for c in whole["tool_calls"]] == ["get_weather", "local_time"]
    whole, differences = _read(folder, options, agent.SCRIPTS[1], thinking=False, engine="lmdeploy-server")
    assert differences == {} and whole["content"] == agent.SCRIPTS[1].answer and not whole["tool_calls"]


def test_planted_parsers_are_named_by_kind(folder) -> None:
    plugins = {"tool_parser_plugin": str(FAULTS / "tool_parsers.py"),
               "reasoning_parser_plugin": str(FAULTS / "reasoning_parsers.py")}
    whole, brace = _read(folder, ParserOptions(tool_parser="hermes_drops_brace", reasoning_parser="qwen3", **plugins),
                         agent.SCRIPTS[0])
    assert set(brace) == set(chunkings([1, 2, 3])), brace  # every chunking loses the brace
    assert "are not JSON" in brace["token by token"] and '"celsius"\'' in brace["token by token"]
    _, whole_call = _read(folder, ParserOptions(tool_parser="hermes_loses_whole_call", reasoning_parser="qwen3",
                                                **plugins), agent.SCRIPTS[0])
    assert list(whole_call) == ["one chunk"] and "arguments '' are not JSON" in whole_call["one chunk"]
    leaked, _ = _read(folder, ParserOptions(tool_parser="hermes", reasoning_parser="think_leaks_end", **plugins),
                      agent.SCRIPTS[0])
    assert tool_rules.leaked_markup(leaked) == "content holds </think>: the parser left its markup in the answer"
