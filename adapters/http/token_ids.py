"""Token ids for servers that answer with token text: exact where the server encodes ids, otherwise mapped back
with the model's tokenizer and marked as inferred; text that maps to several ids is reported, never guessed."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids


class TokenTable:
    """token text -> the ids it stands for, built on first use: the vocabulary's own pieces ('Ġtimes', what some
    servers return) map to their one id; decoded text (' times', what others return) to every id that decodes to
    it (one decode per vocabulary entry)."""

    def __init__(self, load_tokenizer: Callable[[], Any]):
        self.load_tokenizer = load_tokenizer
        self._tables: tuple[dict[str, list[int]], dict[str, int]] | None = None  # (by text, by piece)
        self._lock = threading.Lock()

    def _build(self) -> tuple[dict[str, list[int]], dict[str, int]]:
        tokenizer = self.load_tokenizer()
        table: dict[str, list[int]] = defaultdict(list)
        for token_id in range(len(tokenizer)):
            table[tokenizer.decode([token_id])].append(token_id)
        return dict(table), dict(tokenizer.get_vocab())

    def _built(self) -> tuple[dict[str, list[int]], dict[str, int]]:
        with self._lock:  # requests run in threads: build once
            if self._tables is None:
                self._tables = self._build()
            return self._tables

    def __call__(self) -> dict[str, list[int]]:
        return self._built()[0]

    def piece(self, token: str) -> int | None:
        return self._built()[1].get(token)


@dataclass
class TokenResolver:
    table: TokenTable
    empty_token_id: int | None = None  # the id '' stands for, for a server that writes special tokens as ''
    ambiguous: dict[str, list[int]] = field(default_factory=dict)
    unmapped: set[str] = field(default_factory=set)
    inferred: bool = False
    empty_taken: bool = False

    def resolve(self, token: str) -> int | None:
        """The id of a token as a server wrote it; None (and a warning) when no id has that text."""
        if token.startswith(TOKEN_ID_PREFIX):
            return int(token[len(TOKEN_ID_PREFIX):])
        self.inferred = True
        if token == "" and self.empty_token_id is not None:
            self.empty_taken = True
            return self.empty_token_id
        piece = self.table.piece(token)
        if piece is not None:  # a vocabulary piece is exact
            return piece
        candidates = self.table().get(token, [])
        if not candidates:
            self.unmapped.add(token)
            return None
        if len(candidates) > 1:
            self.ambiguous[token] = candidates
        return candidates[0]

    def warnings(self) -> list[str]:
        notes = []
        if self.inferred:
            notes.append("token ids inferred from token text with the model tokenizer (the server returns no ids)")
        for text, ids in self.ambiguous.items():
            notes.append(f"ambiguous token text {text!r}: ids {ids[:5]} decode to it; took {ids[0]}")
        if self.empty_taken:
            notes.append(f"token text '' taken as the EOS (id {self.empty_token_id}): the server writes special "
                         "tokens as empty text (a partial UTF-8 piece would read the same)")
        if self.unmapped:
            notes.append(f"token text with no matching id (dropped from the top-k lists): {sorted(self.unmapped)[:5]}")
        return notes
