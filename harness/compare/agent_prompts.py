"""Where an engine's chat prompt parts from the reference's render, for the tools verdicts: the prompt ids a server
returned, or, for a server that returns none but renders with a GGUF's embedded template (llama.cpp), that template
rendered here on the same messages, tools and switches (llama.cpp#15110: an embedded template that renders another
prompt than the tokenizer's). The difference is named by the template part it starts in (harness.compare.tool_rules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.compare import tool_rules
from harness.core.errors import ConfigError
from harness.core.prompt_notes import CHAT_TEMPLATE, made_by
from harness.scenario.prompts import PromptTokenizer

SAME = "same"


def gguf_template(versions: dict[str, str]) -> str | None:
    """The chat template embedded in the GGUF a llama.cpp server serves (its versions name the file), or None."""
    from harness.models import gguf_header

    served = versions.get("served_model", "")
    if not served.endswith(".gguf") or not Path(served).is_file():
        return None
    value = gguf_header.metadata(Path(served), ("tokenizer.chat_template",)).get("tokenizer.chat_template")
    return value if isinstance(value, str) else None


def first_apart(ours: list[int], theirs: list[int]) -> int | None:
    if ours == theirs:
        return None
    return next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))


def prompt_reading(tokenizer: PromptTokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   kwargs: dict[str, Any], reference_ids: list[int], engine_ids: list[int], warnings: list[str],
                   versions: dict[str, str], server_kwargs: dict[str, Any] | None) -> tuple[str, str | None]:
    """(reading, finding): SAME or where the engine's prompt parts from the reference's, and the finding's words
    (None: none). server_kwargs: the switches a server that takes them only at start was started with."""
    by = "its prompt ids"
    if made_by(warnings) == CHAT_TEMPLATE:  # the server rendered the messages and returned no ids
        template = gguf_template(versions)
        if template is None:
            return "not returned by the server", None
        by = "its GGUF's embedded template, rendered here"
        try:
            engine_ids = tokenizer.with_template(template).apply_chat_template(
                messages, tools, kwargs if server_kwargs is None else server_kwargs)
        except ConfigError as exc:
            return "its GGUF's embedded template refuses the messages", f"its GGUF's embedded template: {exc.message}"
    at = first_apart(reference_ids, engine_ids)
    if at is None:
        return SAME if by == "its prompt ids" else f"{SAME} ({by})", None
    spans = tool_rules.template_spans(lambda m, t, k, g: tokenizer.render(m, t, k, g), messages, tools, kwargs)
    part = tool_rules.where_prompts_part(len(tokenizer.decode(reference_ids[:at])), spans)
    reading = f"at token {at} of {len(reference_ids)} ({part})"
    return reading, f"{by} part from the reference's render {reading}"
