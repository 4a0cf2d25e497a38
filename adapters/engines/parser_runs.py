"""An engine's own tool-call and reasoning parsers, run without a model on a generated answer the way its server
runs them: given whole, or cut into streamed chunks at token boundaries.

A split is {"content": str, "reasoning": str | None, "tool_calls": [{"name", "arguments"}]}: content "" where there
is none, each call's arguments as the text the parser produced (streamed: its deltas joined per call index). Each
engine family's runner (vllm_parsers, lmdeploy_parsers) gives `whole` and `streamed` over its own parser classes;
adapters.engines.engine_parsers picks it from the engine's type."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

Split = dict[str, Any]


class ParserOptions(BaseModel):
    """The parsers an engine uses (its options): the server starts with them, and offline engines' answers are parsed
    with them. A plugin is a Python file that registers parsers under its own names (vLLM)."""

    model_config = ConfigDict(extra="forbid")

    tool_parser: str | None = None  # vLLM: --enable-auto-tool-choice --tool-call-parser NAME
    reasoning_parser: str | None = None  # --reasoning-parser NAME
    tool_parser_plugin: str | None = None  # --tool-parser-plugin FILE
    reasoning_parser_plugin: str | None = None  # --reasoning-parser-plugin FILE


class Parsing(Protocol):
    """One engine's parsers over one chat request."""

    def decode(self, ids: list[int]) -> str: ...

    def whole(self, text: str, ids: list[int], prompt_ids: list[int]) -> Split: ...

    def streamed(self, chunks: list[list[int]], prompt_ids: list[int]) -> Split: ...


def parsers_named(options: dict[str, Any]) -> ParserOptions | None:
    """The parsers an engine's options name (None: none)."""
    fields = {k: options[k] for k in ParserOptions.model_fields if options.get(k)}
    return ParserOptions(**fields) if fields.get("tool_parser") or fields.get("reasoning_parser") else None


def join_call_delta(calls: dict[int, dict[str, str]], index: int, name: str | None, arguments: str | None) -> None:
    """Fold one streamed tool-call delta into the calls joined so far, as a client joins them."""
    joined = calls.setdefault(index, {"name": "", "arguments": ""})
    joined["name"] += name or ""
    joined["arguments"] += arguments or ""


def chunk_texts(decode: Callable[[list[int]], str], chunks: list[list[int]]) -> list[str]:
    """Each chunk's text as a server's incremental detokeniser gives it: the decoding of the ids so far, less that of
    the ids before."""
    texts: list[str] = []
    done: list[int] = []
    before = ""
    for chunk in chunks:
        done = done + chunk
        now = decode(done)
        texts.append(now[len(before):])
        before = now
    return texts


def chunkings(ids: list[int], seeds: int = 3) -> dict[str, list[list[int]]]:
    """The ways an answer's ids are cut into streamed chunks: whole in one chunk, one token per chunk, and `seeds`
    seeded random cuts at token boundaries (chunks of 1-4 tokens)."""
    ways = {"one chunk": [list(ids)], "token by token": [[t] for t in ids]}
    for seed in range(seeds):
        draw, cut, at = random.Random(seed), [], 0
        while at < len(ids):
            size = draw.randint(1, 4)
            cut.append(list(ids[at:at + size]))
            at += size
        ways[f"random cuts (seed {seed})"] = cut
    return ways


def split_differences(parsing: Parsing, text: str, ids: list[int], prompt_ids: list[int],
                      compare: Callable[[Split, Split], str | None]) -> dict[str, str]:
    """Each chunking whose streamed split differs from the unstreamed one -> how (compare's words, or the error the
    parser raised)."""
    whole = parsing.whole(text, ids, prompt_ids)
    found = {}
    for way, chunks in chunkings(ids).items():
        try:
            difference = compare(whole, parsing.streamed(chunks, prompt_ids))
        except Exception as exc:  # a parser's own bug, raised on these chunks: a finding, not a crash of the run
            difference = f"the parser raised {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        if difference:
            found[way] = difference
    return found
