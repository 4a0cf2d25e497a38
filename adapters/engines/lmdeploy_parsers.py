"""lmdeploy's tool-call and reasoning parsers, run without a model the way its api_server runs them (lmdeploy 0.18:
lmdeploy/serve/openai/api_server.py set_parsers, lmdeploy/serve/core/chat_runner.py).

The server configures one response-parser class at start (its `default` parser with the reasoning and tool parsers
named by --reasoning-parser and --tool-call-parser, and the model's tokenizer), makes an instance per request from the
chat request, and calls `parse_complete(text, ids)` on an unstreamed answer, `stream_chunk(delta_text, delta_ids,
final=...)` on each streamed chunk. The class holds its configuration as class attributes, so each configuration here
gets a subclass of its own (two engines with other parsers do not share one)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from adapters.engines.parser_runs import ParserOptions, Split, chunk_texts, join_call_delta


@lru_cache(maxsize=4)
def tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@lru_cache(maxsize=8)
def parser_class(tool_parser: str | None, reasoning_parser: str | None, model_path: str) -> Any:
    """The server's response-parser class, configured as its set_parsers configures it."""
    from lmdeploy.serve.parsers import ResponseParserManager

    configured: Any = type("ConfiguredResponseParser", (ResponseParserManager.get("default"),), {})
    configured.set_parsers(reasoning_parser_name=reasoning_parser, tool_parser_name=tool_parser,
                           tokenizer=tokenizer(model_path))
    return configured


class LmdeployParsing:
    """One lmdeploy-server engine's parsers over one chat request."""

    def __init__(self, options: ParserOptions, model_path: Path, request: dict[str, Any]):
        from lmdeploy.serve.openai.protocol import ChatCompletionRequest

        self.cls = parser_class(options.tool_parser, options.reasoning_parser, str(model_path))
        self.tokenizer = tokenizer(str(model_path))
        self.request = ChatCompletionRequest(model="parity", **request)
        self.decoded: dict[tuple[int, ...], str] = {}

    def decode(self, ids: list[int]) -> str:
        """The ids' text, each prefix decoded once for every chunking of an answer."""
        key = tuple(ids)
        if key not in self.decoded:
            self.decoded[key] = self.tokenizer.decode(ids)
        return self.decoded[key]

    def whole(self, text: str, ids: list[int], prompt_ids: list[int]) -> Split:
        content, calls, reasoning = self.cls(self.request).parse_complete(text, list(ids))
        return {"content": content or "", "reasoning": reasoning,
                "tool_calls": [{"name": c.function.name, "arguments": c.function.arguments} for c in calls or []]}

    def streamed(self, chunks: list[list[int]], prompt_ids: list[int]) -> Split:
        parser = self.cls(self.request)
        content, reasoning = "", None
        calls: dict[int, dict[str, str]] = {}
        for n, (chunk, text) in enumerate(zip(chunks, chunk_texts(self.decode, chunks), strict=True)):
            for delta, _ in parser.stream_chunk(text, list(chunk), final=n == len(chunks) - 1):
                content += delta.content or ""
                if delta.reasoning_content is not None:
                    reasoning = (reasoning or "") + delta.reasoning_content
                for call in delta.tool_calls or []:
                    function = call.function
                    join_call_delta(calls, call.index, function.name if function else None,
                                    function.arguments if function else None)
        return {"content": content, "reasoning": reasoning, "tool_calls": [calls[i] for i in sorted(calls)]}
