"""What each server does with an agent's request (tools, tool choice, the chat template's switches) and whether it
splits reasoning from the answer, and the NOT APPLIED warnings a request gets where the server cannot do what the
scenario asks: an agent request is never silently answered as plain text.

Sources: vLLM 0.32's chat server (--enable-auto-tool-choice --tool-call-parser, --reasoning-parser, per-request
chat_template_kwargs), lmdeploy 0.18's api_server (--tool-call-parser, --reasoning-parser, per-request
chat_template_kwargs), llama-cpp-python 0.3.36's server (its GGUF-template handler renders tools but returns
tool_calls only for a named tool_choice, takes chat_template_kwargs only as a start-up setting, has no reasoning
split), all read in the installed code; the native llama-server and SGLang are not installed here."""

from __future__ import annotations

import json
from dataclasses import dataclass

from harness.core.types import Request

PARSER = "parser"  # split by a parser the server was started with
NAMED = "named"  # calls returned as tool_calls only for a named tool_choice
STARTUP = "startup"  # template switches taken once, when the server starts
REQUEST = "request"  # template switches taken per request
NONE = "none"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class AgentSupport:
    calls: str = UNKNOWN  # PARSER | NAMED | NONE | UNKNOWN
    reasoning: str = UNKNOWN  # PARSER | NONE | UNKNOWN
    template_kwargs: str = UNKNOWN  # REQUEST | STARTUP | NONE | UNKNOWN


@dataclass(frozen=True)
class AgentSetup:
    """How the harness started a server: which parsers, which start-up template switches (None: not known, the
    server was attached by url)."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    template_kwargs: dict | None = None
    known: bool = True


def agent_warnings(server: str, support: AgentSupport, setup: AgentSetup, request: Request) -> list[str]:
    """`param=value NOT APPLIED: why` for each part of an agent request the server will not honour."""
    if not request.messages or not (request.tools or request.chat_template_kwargs):
        return []
    found = []
    named = isinstance(request.tool_choice, dict)
    if request.tools and request.tool_choice != "none":
        tools = "tools=" + ",".join(t["function"]["name"] for t in request.tools)
        if support.calls == NONE:
            found.append(f"{tools} NOT APPLIED: the {server} server returns no tool_calls; the calls stay in the "
                         "answer's text")
        elif support.calls == NAMED and not named:
            found.append(f"{tools} NOT APPLIED: the {server} server returns tool_calls only for a named tool_choice "
                         "(its chat-template handler); the calls stay in the answer's text")
        elif support.calls == PARSER and setup.known and not setup.tool_parser:
            found.append(f"{tools} NOT APPLIED: the server was started without a tool-call parser (option "
                         "tool_parser); the calls stay in the answer's text")
    kwargs = request.chat_template_kwargs
    if kwargs:
        shown = f"chat_template_kwargs={json.dumps(kwargs, sort_keys=True)}"
        if support.template_kwargs == NONE:
            found.append(f"{shown} NOT APPLIED: the {server} server takes no template switches")
        elif support.template_kwargs == STARTUP and setup.known and kwargs != (setup.template_kwargs or {}):
            found.append(f"{shown} NOT APPLIED: the {server} server takes template switches only when it starts "
                         f"(option chat_template_kwargs: {json.dumps(setup.template_kwargs or {}, sort_keys=True)})")
    if support.reasoning == NONE:
        found.append(f"reasoning=split NOT APPLIED: the {server} server splits no reasoning from the answer; a think "
                     "block stays in the content")
    elif support.reasoning == PARSER and setup.known and not setup.reasoning_parser:
        found.append("reasoning=split NOT APPLIED: the server was started without a reasoning parser (option "
                     "reasoning_parser); a think block stays in the content")
    return found
