"""What each engine of a scenario does with an agent's request, for `parity params`: who renders the chat prompt,
which parsers split the answer into calls and reasoning, and how the template's switches reach the template."""

from __future__ import annotations

from pathlib import Path

from adapters.engines.engine_parsers import FAMILIES
from adapters.engines.parser_runs import parsers_named
from adapters.engines.vllm_offline import renders_own_chat
from adapters.http.agent_support import NAMED, NONE, PARSER, REQUEST, STARTUP
from adapters.http.dialects import DIALECTS
from harness.scenario.spec import LoadedScenario

HEADERS = ["engine", "chat prompt rendered by", "tool calls", "reasoning", "template switches"]


def wanted(scenario: LoadedScenario) -> bool:
    """Whether the scenario sends agent requests, or an engine names parsers."""
    spec = scenario.spec
    return bool(spec.tools or spec.chat_template_kwargs or any(p.chat_template_kwargs for p in
                                                               (c.prompt for c in scenario.cases))
                or any(parsers_named(e.options) for e in spec.engines.values()))


def rows(scenario: LoadedScenario, names: list[str]) -> list[list[str]]:
    return [_row(scenario, name) for name in names]


def _row(scenario: LoadedScenario, name: str) -> list[str]:
    engine = scenario.spec.engines[name]
    options, description = engine.options, scenario.description(name)
    dialect_name = description.dialect_name(options)
    parsers = parsers_named(options) if engine.engine in FAMILIES else None
    own = f"{FAMILIES.get(engine.engine)}'s parser, run on its text"
    if dialect_name is None:  # in process: the harness's ids, or vLLM's own chat path
        own_chat = renders_own_chat(options)
        calls = f"{parsers.tool_parser} ({own})" if parsers and parsers.tool_parser else "-"
        reasoning = f"{parsers.reasoning_parser} ({own})" if parsers and parsers.reasoning_parser else "-"
        return [name, "vLLM's own chat path" if own_chat else "the harness (its ids)", calls, reasoning,
                "per request (vLLM's chat path)" if own_chat else "the harness's render"]
    support = DIALECTS[dialect_name].agent
    chat = options.get("endpoint") == "chat"
    render = "the harness (its ids)"
    if chat:
        render = f"--chat-template {Path(options['chat_template']).name}" if options.get("chat_template") else \
            "its GGUF's embedded template" if dialect_name == "llama-cpp-python" else "the server's own template"
    calls = {PARSER: f"{parsers.tool_parser} (the server's parser)" if parsers and parsers.tool_parser
             else "none: started without a tool parser", NAMED: "only for a named tool_choice",
             NONE: "none"}.get(support.calls, "not known")
    reasoning = {PARSER: f"{parsers.reasoning_parser} (the server's parser)" if parsers and parsers.reasoning_parser
                 else "none: started without a reasoning parser", NONE: "none"}.get(support.reasoning, "not known")
    switches = {REQUEST: "per request", NONE: "none",
                STARTUP: f"at start only: {options.get('chat_template_kwargs') or {}}"}.get(support.template_kwargs,
                                                                                          "not known")
    return [name, render, calls if chat else "-", reasoning if chat else "-", switches if chat else "-"]
