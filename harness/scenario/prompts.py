"""Turn scenario prompts into token ids once, in the harness, so every engine sees the same ids.

Chat messages get the model's chat template (with the generation prompt); text is tokenised as is. Uses the
`tokenizers` library and jinja2 directly on the model folder's tokenizer.json and chat template (0.2 s), not
transformers (7 s to import on a 2-core machine); tests check both give the same ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from harness.core.agent_requests import template_messages
from harness.core.errors import ConfigError
from harness.scenario.spec import PromptSpec

# HF's clean_up_tokenization_spaces: the spaces a word-level decoder leaves before punctuation and contractions
CLEAN_UP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]


class PromptTokenizer:
    def __init__(self, model_path: Path):
        import jinja2.sandbox
        from tokenizers import Tokenizer

        if not (model_path / "tokenizer.json").exists():
            raise ConfigError(f"{model_path}: no tokenizer.json: save the model's tokenizer with a fast "
                              "(tokenizers) backend")
        self.tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        config_path = model_path / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template_file = model_path / "chat_template.jinja"
        template = template_file.read_text() if template_file.exists() else self.config.get("chat_template")
        self.environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.environment.globals.update(raise_exception=self._raise,
                                        strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self.environment.filters["tojson"] = _tojson
        self.template = self.environment.from_string(template) if template else None

    def with_template(self, template: str) -> PromptTokenizer:
        """A copy that renders chat prompts with another template (a GGUF's embedded one)."""
        import copy

        other = copy.copy(self)
        other.template = self.environment.from_string(template)
        return other

    @staticmethod
    def _raise(message: str):
        raise ConfigError(f"chat template: {message}")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            template_kwargs: dict[str, Any] | None = None) -> list[int]:
        return self.tokenizer.encode(self.render(messages, tools, template_kwargs), add_special_tokens=False).ids

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               template_kwargs: dict[str, Any] | None = None, generation: bool = True) -> str:
        """The chat template's text for messages, as transformers' apply_chat_template renders it: the tools (None
        where there are none) and the template's own switches as variables, the generation prompt added."""
        if self.template is None:
            raise ConfigError("the model has no chat template (a base model?): give it text prompts")
        special = {k: self.config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return self.template.render(**{**special, **(template_kwargs or {})}, messages=messages, tools=tools or None,
                                    add_generation_prompt=generation)

    def bos(self) -> tuple[int, str] | None:
        """The model's BOS token (id, text), from tokenizer_config.json's bos_token; None if it names none."""
        token = self.config.get("bos_token")
        token = token.get("content") if isinstance(token, dict) else token
        token_id = self.tokenizer.token_to_id(token) if token else None
        return (token_id, token) if token_id is not None else None

    def bos_rule(self) -> str | None:
        """Where it says the model's prompts start with BOS, or None: tokenizer_config.json's add_bos_token (prepared
        folders record the GGUF's rule there) or, where that is unset, the tokenizer's own post-processor."""
        bos = self.bos()
        if bos is None or self.config.get("add_bos_token") is False:
            return None
        if self.config.get("add_bos_token"):
            return "tokenizer_config.json: add_bos_token true"
        added = self.tokenizer.encode("a", add_special_tokens=True).ids
        return "its tokenizer.json adds it" if added[:1] == [bos[0]] else None

    @cached_property
    def special_pattern(self) -> re.Pattern | None:
        """Matches the text of any special token (BOS, EOS, chat markers, ...), longest first; None if none."""
        tokens = {t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special and t.content}
        return re.compile("|".join(map(re.escape, sorted(tokens, key=len, reverse=True)))) if tokens else None

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of ids as HF's decode() writes it: with or without special tokens, and with HF's clean-up of
        spaces before punctuation where tokenizer_config.json asks for it (transformers 5's default: none)."""
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if self.config.get("clean_up_tokenization_spaces"):
            for spaced, tight in CLEAN_UP:
                text = text.replace(spaced, tight)
        return text


@lru_cache(maxsize=4)
def load_tokenizer(model_path: Path) -> PromptTokenizer:
    """The model folder's tokenizer, read once per command: a run, its report and explain's pass share it (Gemma 3's
    33 MB tokenizer.json takes 3-4 s of CPU to read on a 2-core machine)."""
    return PromptTokenizer(model_path)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' tojson filter (plain json.dumps, non-ASCII kept), not jinja2's HTML-safe one, which writes < > &
    and ' as \\u escapes: a tools block with `<` in a description would render other ids than transformers'."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def tokenize_prompts(tokenizer: PromptTokenizer, prompts: list[PromptSpec], origin: str = "",
                     tools: list[dict[str, Any]] | None = None,
                     template_kwargs: Callable[[PromptSpec], dict[str, Any]] = lambda prompt: {}
                     ) -> dict[str, list[int]]:
    """Each prompt's token ids (chat prompts rendered with the tools and each prompt's template switches); a prompt
    that cannot be tokenised is a ConfigError naming origin (the scenario file) and the prompt."""
    where = f"{origin}: " if origin else ""
    ids: dict[str, list[int]] = {}
    for prompt in prompts:
        if prompt.token_ids is not None:
            ids[prompt.id] = list(prompt.token_ids)
        elif prompt.messages is not None:
            try:
                ids[prompt.id] = tokenizer.apply_chat_template(template_messages(prompt.messages), tools,
                                                               template_kwargs(prompt))
            except ConfigError as exc:
                raise ConfigError(f"{where}prompt {prompt.id}: {exc.message}") from None
        else:
            ids[prompt.id] = tokenizer.encode(prompt.text)
        if not ids[prompt.id]:
            raise ConfigError(f"{where}prompt {prompt.id}: tokenises to no tokens: give it some text")
    return ids
