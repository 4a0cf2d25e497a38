"""What agents receive, on real engines: tiny-agent's scripted think block and calls through HF, vLLM offline and
the vLLM server (unstreamed and streamed), then the planted faults of scenarios/agent-faults.yaml beside them, each
named by kind with the generated ids identical to HF's, and llama-cpp-python's server within its named limits (its
GGUF's template rendered here, a switch it cannot take named where the prompts part). One `parity run` of the
shipped scenarios and one variant serves the module."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness import models
from harness.core.agent_requests import template_messages
from harness.scenario.prompts import load_tokenizer
from harness.scenario.spec import load

from helpers import SCENARIOS, parity, write_scenario

WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
TIME = {"name": "local_time", "arguments": {"city": "Paris"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent")
    # real differences: llama-cpp-python's server asked for thinking off per request, which it takes only at start;
    # vLLM's server given a tool without a description
    no_thinking = (SCENARIOS / "agent-llamacpp.yaml").read_text().replace("name: agent-llamacpp", "name: no-thinking")
    no_thinking = no_thinking.replace('      description: "The local time in a city."\n', "").replace(
        "  - id: calls\n", "  - id: calls\n    chat_template_kwargs: {enable_thinking: false}\n").replace(
        "engines:\n", "engines:\n  vllm-server:\n    engine: vllm-server\n"
                      "    options: {endpoint: chat, tool_parser: hermes}\n")
    no_thinking = write_scenario(out.parent / "no-thinking.yaml", no_thinking)
    run = parity("run", *(str(SCENARIOS / f"agent-{name}.yaml") for name in ("tools", "faults", "llamacpp")),
                 str(no_thinking), out=out)
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-3000:]  # the faults scenarios fail, as they must
    dirs = {d.name.split("-", 2)[-1]: d for d in out.iterdir()}
    return {name: (pd.read_parquet(d / "tools.parquet"), pd.read_parquet(d / "results.parquet"),
                   pd.read_parquet(d / "verdicts.parquet"),
                   pd.read_parquet(d / "invariance.parquet") if (d / "invariance.parquet").exists() else None)
            for name, d in dirs.items()}


def _calls(split: str) -> list[dict]:
    return [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in json.loads(split)["tool_calls"]]


def test_every_engine_reads_the_same_calls_and_thinking_as_hf(runs) -> None:
    tools, _, verdicts, _ = runs["agent-tools"]
    assert set(verdicts.verdict) == {"match"}, verdicts
    assert tools.expected.all() and set(tools.tools_check) == {"same"}, tools[["engine", "explanation"]]
    assert len(tools) == 6 and set(tools.prompt) == {"same"}  # the server rendered the tools as the harness does
    for row in tools.itertuples():
        split = json.loads(row.split)
        if row.case_id == "calls":
            assert _calls(row.split) == [WEATHER, TIME] == _calls(row.reference_split), row
            assert "I call get_weather and local_time" in split["reasoning"]
        else:
            assert split["tool_calls"] == [] and split["content"] == "It is 18 degrees and sunny in Paris."
        assert json.loads(row.chunkings) == {}
    streamed = tools[(tools.engine == "vllm-server-stream") & (tools.case_id == "calls")].iloc[0]
    assert "content differs in whitespace only ('\\n\\n' against '')" in streamed.explanation
    knobs = runs["agent-tools"][3].set_index("knob")  # the server unstreamed against itself streamed
    assert knobs.loc["stream", "verdict"] == "identical" and knobs.loc["control", "verdict"] == "diverged"


def test_planted_faults_are_named_by_kind_with_the_ids_identical(runs) -> None:
    tools, results, _, _ = runs["agent-faults"]
    """In bfloat16, beside a clean streamed server whose one benign effect (the whitespace its streamed content keeps)
    is said and not failed."""
    kinds = {row.engine: row.tools_check.split(", ") for row in tools.itertuples()}
    assert kinds == {"clean-stream": ["same"], "brace-and-leak": ["streamed-call", "reasoning-split", "split"],
                     "whole-call-and-template": ["template", "split"]}, tools[["engine", "explanation"]]
    rows = tools.set_index("engine")
    assert rows.loc["clean-stream", "expected"]
    assert rows.loc["clean-stream", "explanation"] == "content differs in whitespace only ('\\n\\n' against '')"
    assert _calls(rows.loc["clean-stream", "split"]) == [WEATHER, TIME]
    assert "(the tools block)" in rows.loc["whole-call-and-template", "prompt"]
    assert list(json.loads(rows.loc["whole-call-and-template", "chunkings"])) == ["one chunk"]
    assert "content holds </think>" in rows.loc["brace-and-leak", "explanation"]
    assert '"celsius"\' are not JSON' in rows.loc["brace-and-leak", "explanation"]
    ids = {r.engine: list(r.token_ids) for r in results.itertuples()}
    assert ids["brace-and-leak"] == ids["hf"] == ids["whole-call-and-template"] == ids["clean-stream"]
    knobs = runs["agent-faults"][3].set_index("knob")  # the stream knob reads the streamed-call fault too
    assert knobs.loc["stream", "verdict"] == "text_diverged"
    assert "the answer splits otherwise: call 0 (get_weather): arguments" in knobs.loc["stream", "explanation"]


def test_the_harness_renders_tools_and_switches_as_transformers_does() -> None:
    """tools (a description with < & and non-ASCII, which jinja2's own tojson would escape), a thinking switch, and
    a conversation with calls and tool results: the harness's render gives transformers' ids."""
    from transformers import AutoTokenizer

    folder = models.resolve("tiny-agent", "float32")
    scenario = load(SCENARIOS / "agent-tools.yaml")
    tools = scenario.spec.tool_dicts()
    tools[0]["function"]["description"] = "Weather <now> & later, in °C"
    reference = AutoTokenizer.from_pretrained(folder)
    for prompt in [c.prompt for c in scenario.cases]:
        messages, kwargs = template_messages(prompt.messages), scenario.spec.template_kwargs(prompt)
        ours = load_tokenizer(folder).apply_chat_template(messages, tools, kwargs)
        theirs = reference.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                               **kwargs)
        assert ours == list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs), prompt.id


def test_llama_cpp_server_answers_within_its_limits_each_said(runs) -> None:
    tools, _, verdicts, _ = runs["agent-llamacpp"]
    assert set(verdicts.verdict) == {"match"} and tools.expected.all(), tools[["engine", "explanation"]]
    assert set(tools.tools_check) == {"not-applied"} and len(tools) == 4
    assert set(tools.prompt) == {"same (its GGUF's embedded template, rendered here)"}
    for row in tools.itertuples():
        assert "tools=get_weather,local_time NOT APPLIED: the llama-cpp-python server returns tool_calls only for a " \
               "named tool_choice" in row.explanation
        assert "reasoning=split NOT APPLIED" in row.explanation


def test_a_switch_llama_cpp_takes_only_at_start_is_named_where_the_prompts_part(runs) -> None:
    tools, _, verdicts, _ = runs["no-thinking"]
    tools = tools[tools.engine.str.startswith("llama.cpp")]
    verdicts = verdicts[verdicts.engine.str.startswith("llama.cpp")]
    calls = tools[tools.case_id == "calls"].set_index("engine")
    assert set(calls.tools_check) == {"template, not-applied"} and not calls.expected.any()
    assert set(calls.prompt) == {"at token 197 of 201 (what the template switches change (enable_thinking))"}
    assert 'chat_template_kwargs={"enable_thinking": false} NOT APPLIED' in calls.explanation.iloc[0]
    assert set(verdicts[verdicts.case_id == "calls"].verdict) == {"diverged"}
    assert tools[tools.case_id == "after-results"].expected.all()


def test_vllms_server_renders_a_tool_without_description_otherwise_than_transformers(runs) -> None:
    """A real difference the tools verdict found: vLLM's server (0.32) writes `"description": null` into the tools
    block for a tool that has none, where transformers and vLLM's own offline chat path leave it out."""
    tools, results, _, _ = runs["no-thinking"]
    server = tools[tools.engine == "vllm-server"]
    assert set(server.tools_check) == {"template"} and len(server) == 2, server.explanation
    assert all(p.endswith("(the tools block)") for p in server.prompt)
    prompt = list(results[(results.engine == "vllm-server") & (results.case_id == "calls")].prompt_ids.iloc[0])
    from harness.scenario.prompts import load_tokenizer

    assert '"name": "local_time", "description": null' in load_tokenizer(models.resolve("tiny-agent", "float32")) \
        .decode(prompt)
