"""Token ids for servers that answer with token text: exact where the server encodes ids, otherwise mapped back
with the model's tokenizer and marked as inferred; text that maps to several ids is reported, never guessed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids


@dataclass
class TokenResolver:
    tokenizer: object
    _by_text: dict[str, list[int]] | None = None
    ambiguous: dict[str, list[int]] = field(default_factory=dict)
    unmapped: set[str] = field(default_factory=set)
    inferred: bool = False

    def _table(self) -> dict[str, list[int]]:
        if self._by_text is None:
            table: dict[str, list[int]] = defaultdict(list)
            for token_id in range(len(self.tokenizer)):
                table[self.tokenizer.decode([token_id])].append(token_id)
            self._by_text = dict(table)
        return self._by_text

    def resolve(self, token: str) -> int:
        if token.startswith(TOKEN_ID_PREFIX):
            return int(token[len(TOKEN_ID_PREFIX):])
        self.inferred = True
        candidates = self._table().get(token, [])
        if not candidates:
            self.unmapped.add(token)
            return -1
        if len(candidates) > 1:
            self.ambiguous[token] = candidates
        return candidates[0]

    def warnings(self) -> list[str]:
        notes = []
        if self.inferred:
            notes.append("token ids inferred from token text with the model tokenizer (the server returns no ids)")
        for text, ids in self.ambiguous.items():
            notes.append(f"ambiguous token text {text!r}: ids {ids[:5]} decode to it; took {ids[0]}")
        if self.unmapped:
            notes.append(f"token text with no matching id (recorded as -1): {sorted(self.unmapped)[:5]}")
        return notes
