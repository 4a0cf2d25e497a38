"""The tools verdict's rules: two splits of an answer (content, reasoning, calls) compared as a client reads them, and
where two prompts' ids part, in the words of the chat template's parts.

Calls are compared by count, names and arguments as JSON values (`{"a":1}` and `{"a": 1}` are one call); content and
reasoning as text, a difference in surrounding whitespace only is said but not a finding (a parser that keeps the
blank line between a think block and a call in one path and not the other)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Split = dict[str, Any]
THINK_MARKERS = ("<think>", "</think>")  # markup a reasoning parser must not leave in the answer
CALL_MARKERS = ("<tool_call>", "</tool_call>")  # markup a tool-call parser must not leave there


@dataclass(frozen=True)
class SplitDifference:
    part: str  # calls | reasoning | content
    words: str

    @property
    def kind(self) -> str:
        return "calls" if self.part == "calls" else "reasoning-split"


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return _NotJson(text)


@dataclass(frozen=True)
class _NotJson:
    text: str


def call_difference(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> str | None:
    """How two call lists differ, or None: count, then each call's name and arguments (as JSON values)."""
    if len(ours) != len(theirs):
        return f"{len(theirs)} call(s) where {len(ours)} expected ({_names(theirs)} against {_names(ours)})"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a.get("name") != b.get("name"):
            return f"call {i} is {b.get('name')!r} where {a.get('name')!r} expected"
        args_a, args_b = _arguments(a.get("arguments")), _arguments(b.get("arguments"))
        if isinstance(args_b, _NotJson) and not isinstance(args_a, _NotJson):
            return f"call {i} ({b.get('name')}): arguments {args_b.text!r} are not JSON (expected " \
                   f"{a.get('arguments')!r})"
        if args_a != args_b:
            return f"call {i} ({b.get('name')}): arguments {b.get('arguments')!r} where {a.get('arguments')!r} " \
                   "expected"
    return None


def _names(calls: list[dict[str, Any]]) -> str:
    return "[" + ", ".join(str(c.get("name")) for c in calls) + "]"


def split_difference(expected: Split, got: Split) -> SplitDifference | None:
    """The first way `got` differs from `expected`: calls, then reasoning, then content (None: the same)."""
    calls = call_difference(expected.get("tool_calls") or [], got.get("tool_calls") or [])
    if calls:
        return SplitDifference("calls", calls)
    for part in ("reasoning", "content"):
        a, b = expected.get(part) or "", got.get(part) or ""
        if a.strip() != b.strip():
            return SplitDifference(part, f"{part} {_clip(b)} where {_clip(a)} expected")
    return None


def whitespace_notes(expected: Split, got: Split) -> list[str]:
    """Parts that differ in surrounding whitespace only (said, not a finding)."""
    return [f"{part} differs in whitespace only ({_clip(got.get(part) or '')} against "
            f"{_clip(expected.get(part) or '')})" for part in ("reasoning", "content")
            if (expected.get(part) or "") != (got.get(part) or "")
            and (expected.get(part) or "").strip() == (got.get(part) or "").strip()]


def leaked_markup(split: Split, markers: tuple[str, ...] = THINK_MARKERS + CALL_MARKERS) -> str | None:
    """Markup a parser should have consumed that its content or reasoning still holds (a bare </think> in content)."""
    for part in ("content", "reasoning"):
        found = [m for m in markers if m in (split.get(part) or "")]
        if found:
            return f"{part} holds {', '.join(found)}: the parser left its markup in the answer"
    return None


def _clip(text: str, width: int = 48) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 4] + "...'"


@dataclass(frozen=True)
class Span:
    name: str
    start: int  # character offsets in the rendered prompt
    end: int


def changed_span(with_part: str, without_part: str, name: str) -> Span | None:
    """The span of `with_part` that the part adds or changes: what lies between the two renders' common prefix and
    common suffix (None where the part changes nothing)."""
    if with_part == without_part:
        return None
    prefix = 0
    while prefix < min(len(with_part), len(without_part)) and with_part[prefix] == without_part[prefix]:
        prefix += 1
    suffix = 0
    while (suffix < min(len(with_part), len(without_part)) - prefix
           and with_part[-1 - suffix] == without_part[-1 - suffix]):
        suffix += 1
    return Span(name, prefix, len(with_part) - suffix)


def template_spans(render: Callable[..., str], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   template_kwargs: dict[str, Any]) -> list[Span]:
    """The parts of a rendered prompt, found by rendering without each one: the tools block, the template switches
    (a thinking switch), each message, and the generation prompt. render(messages, tools, kwargs, generation)."""
    full = render(messages, tools, template_kwargs, True)
    spans = []
    if tools:
        spans.append(changed_span(full, render(messages, None, template_kwargs, True), "the tools block"))
    if template_kwargs:
        spans.append(changed_span(full, render(messages, tools, {}, True),
                                  f"what the template switches change ({', '.join(sorted(template_kwargs))})"))
    spans.append(changed_span(full, render(messages, tools, template_kwargs, False), "the generation prompt"))
    for i, message in enumerate(messages):
        try:
            shorter = render(messages[:i] + messages[i + 1:], tools, template_kwargs, True)
        except Exception:  # a template that refuses the order without this message: no span for it
            continue
        spans.append(changed_span(full, shorter, f"message {i} ({message.get('role')})"))
    return [s for s in spans if s is not None and s.end > s.start]


def where_prompts_part(offset: int, spans: list[Span]) -> str:
    """The narrowest template part holding a character offset of the reference's rendered prompt."""
    holding = [s for s in spans if s.start <= offset < s.end]
    return min(holding, key=lambda s: s.end - s.start).name if holding else "outside the parts the template renders"
