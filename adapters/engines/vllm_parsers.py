"""vLLM's tool-call and reasoning parsers, run without a model the way its chat server runs them.

The server (vllm/entrypoints/openai/chat_completion/serving.py, vLLM 0.32) builds one composed Parser per request
(vllm.parser.parser_manager.ParserManager.get_parser) and calls `parse(text, request, enable_auto_tools, ids)` on an
unstreamed answer, `parse_delta(delta_text, delta_ids, request, prompt_ids, finished=...)` on each streamed chunk.
This module does the same on a generated answer given whole or cut into chunks at token boundaries, so an engine's
text can be parsed as its server would parse it, and a parser can be held to giving one split however the answer
arrives (a streamed call that loses its closing brace, arguments lost when a whole call comes in one delta).

Splits, chunkings and the options naming the parsers are adapters.engines.parser_runs'.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from adapters.engines.parser_runs import ParserOptions, Split, chunk_texts, join_call_delta


def server_args(options: ParserOptions) -> list[str]:
    """The server flags for the parsers the options name."""
    args: list[str] = []
    if options.tool_parser_plugin:
        args += ["--tool-parser-plugin", str(Path(options.tool_parser_plugin).resolve())]
    if options.reasoning_parser_plugin:
        args += ["--reasoning-parser-plugin", str(Path(options.reasoning_parser_plugin).resolve())]
    if options.tool_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", options.tool_parser]
    if options.reasoning_parser:
        args += ["--reasoning-parser", options.reasoning_parser]
    return args


@lru_cache(maxsize=8)
def parser_class(tool_parser: str | None, reasoning_parser: str | None, tool_plugin: str | None = None,
                 reasoning_plugin: str | None = None) -> Any:
    """vLLM's composed Parser class for these names, plugins imported first (as the server does at start)."""
    from vllm.parser.parser_manager import ParserManager
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    if tool_plugin:
        ToolParserManager.import_tool_parser(str(Path(tool_plugin).resolve()))
    if reasoning_plugin:
        ReasoningParserManager.import_reasoning_parser(str(Path(reasoning_plugin).resolve()))
    return ParserManager.get_parser(tool_parser_name=tool_parser, reasoning_parser_name=reasoning_parser,
                                    enable_auto_tools=tool_parser is not None)


@lru_cache(maxsize=4)
def tokenizer(model_path: str) -> Any:
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(model_path)


class VllmParsing:
    """One engine's parsers over one request: its answers parsed whole or chunk by chunk."""

    def __init__(self, options: ParserOptions, model_path: Path, request: dict[str, Any]):
        """request: the chat request's fields (messages in the API's form, tools, tool_choice,
        chat_template_kwargs)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        self.cls = parser_class(options.tool_parser, options.reasoning_parser, options.tool_parser_plugin,
                                options.reasoning_parser_plugin)
        self.auto_tools = options.tool_parser is not None
        self.tokenizer = tokenizer(str(model_path))
        self.template_kwargs = request.get("chat_template_kwargs") or {}
        self.request = ChatCompletionRequest(model="parity", **request)
        self.decoded: dict[tuple[int, ...], str] = {}

    def _parser(self) -> Any:
        return self.cls(self.tokenizer, self.request.tools, chat_template_kwargs=self.template_kwargs,
                        model_config=None)

    def whole(self, text: str, ids: list[int], prompt_ids: list[int]) -> Split:
        """An unstreamed answer's split, as the server's parse() makes it."""
        parser = self._parser()
        parser.set_prompt_token_ids(prompt_ids)
        reasoning, content, calls = parser.parse(text, self.request, enable_auto_tools=self.auto_tools,
                                                 model_output_token_ids=ids)
        return {"content": content or "", "reasoning": reasoning,
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []]}

    def decode(self, ids: list[int]) -> str:
        """The ids' text, each prefix decoded once for every chunking of an answer."""
        key = tuple(ids)
        if key not in self.decoded:
            self.decoded[key] = self.tokenizer.decode(ids)
        return self.decoded[key]

    def streamed(self, chunks: list[list[int]], prompt_ids: list[int]) -> Split:
        """A streamed answer's split, its chunks given to parse_delta one by one with their text, the deltas joined
        as a client joins them."""
        parser = self._parser()
        content, reasoning = "", None
        calls: dict[int, dict[str, str]] = {}
        texts = chunk_texts(self.decode, chunks)
        for n, (chunk, text) in enumerate(zip(chunks, texts, strict=True)):
            delta = parser.parse_delta(text, list(chunk), self.request, prompt_ids, finished=n == len(chunks) - 1)
            if delta is None:
                continue
            content += delta.content or ""
            if delta.reasoning is not None:
                reasoning = (reasoning or "") + delta.reasoning
            for position, call in enumerate(delta.tool_calls or []):
                function = call.function
                if isinstance(function, dict):
                    name, arguments = function.get("name"), function.get("arguments")
                else:
                    name, arguments = (function.name, function.arguments) if function is not None else (None, None)
                join_call_delta(calls, call.index if call.index is not None else position, name, arguments)
        return {"content": content, "reasoning": reasoning, "tool_calls": [calls[i] for i in sorted(calls)]}
