"""The hf adapter's translated params as HF calls take them: generate() kwargs built with the model's EOS ids and
tokenizer, and the decode() arguments of the text it reports. Shared by the hf engine, its beam search and HF's
sampling code (effective params, transplant)."""

from __future__ import annotations

from typing import Any


def as_list(value: Any) -> list[int]:
    """A generation config's token id field (None, an id or a list) as a list."""
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


DECODE_KEYS = ("skip_special_tokens",)  # translate()'s keys that are decode() arguments, not generate() ones


def generate_kwargs(native: dict[str, Any], eos_ids: set[int] | list[int], tokenizer: Any) -> dict[str, Any]:
    """translate()'s params as generate() kwargs: stop_token_ids join the model's EOS ids (HF's eos_token_id list
    replaces them), bad_words become token sequences, the seed and decode arguments are left out; a tokenizer is
    passed where stop strings need it."""
    kwargs = {k: v for k, v in native.items()
              if k not in ("torch_manual_seed", "stop_token_ids", "bad_words", *DECODE_KEYS)}
    if native.get("stop_token_ids"):
        kwargs["eos_token_id"] = sorted(set(eos_ids)) + [t for t in native["stop_token_ids"] if t not in eos_ids]
    if native.get("bad_words"):
        kwargs["bad_words_ids"] = bad_word_ids(tokenizer, native["bad_words"])
    if "stop_strings" in kwargs:
        kwargs["tokenizer"] = tokenizer
    return kwargs


def bad_word_ids(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """The token sequences HF bans for bad words: each word as written and after a space (mid-text words carry
    their space in most tokenizers), as vLLM bans them (SamplingParams.update_from_tokenizer)."""
    sequences: list[list[int]] = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences


def decode_text(tokenizer: Any, ids: list[int], native: dict[str, Any]) -> str:
    """The text of generated ids, decoded as the case asks (HF's pipeline skips special tokens by default)."""
    return tokenizer.decode(ids, skip_special_tokens=native.get("skip_special_tokens", True))
