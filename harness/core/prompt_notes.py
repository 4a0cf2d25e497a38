"""The warning a server engine gives when it tokenised a prompt itself and returned no ids: written by the adapter
(adapters.http.answers), read by the verdict rules (harness.compare.token_rules), so both use these words."""

from __future__ import annotations

from collections.abc import Iterable

PROMPT_IDS_UNKNOWN = "the server does not return prompt token ids"
_ASSUMED = ": assumed equal to the harness's, though "
_MADE = " made them"

CHAT_TEMPLATE = "its own chat template and BOS rule"  # a chat endpoint renders messages itself
TOKENIZER = "its own tokenizer and BOS rule"  # a completions endpoint given text: no chat template applies


def prompt_ids_unknown(made_by: str) -> str:
    """The warning: made_by is CHAT_TEMPLATE or TOKENIZER."""
    return f"{PROMPT_IDS_UNKNOWN}{_ASSUMED}{made_by}{_MADE}"


def made_by(warnings: Iterable[str]) -> str | None:
    """What made a server's own prompt ids (CHAT_TEMPLATE or TOKENIZER), from its result's warnings; None when it
    returned them or tokenised nothing."""
    for warning in warnings:
        if warning.startswith(PROMPT_IDS_UNKNOWN + _ASSUMED) and warning.endswith(_MADE):
            return warning[len(PROMPT_IDS_UNKNOWN + _ASSUMED):-len(_MADE)]
    return None
