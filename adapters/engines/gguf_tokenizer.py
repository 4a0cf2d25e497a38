"""The tokenizer of a GGUF file written here: the tokenizer.* fields of a GGUF shipped with a named model, taken only
where its vocabulary is the model folder's, id for id, or the folder's vocabulary is it plus tokens added at its end
(tiny-agent's think and tool tokens: written as llama.cpp's user-defined tokens, or control tokens where special);
the chat template is the folder's own, where it has one."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import cast

from adapters.engines.gguf_cache import named_model
from harness.models import gguf_header


def tokenizer_sources(model_path: Path) -> Iterator[Path]:
    """GGUF files whose tokenizer the folder may have: its own named model's source or the one it borrows its
    tokenizer from (tiny-llama: SmolLM2's), then those of the other prepared named models."""
    from harness.models.catalog import MODELS

    own = named_model(model_path)
    for source in (own.source_gguf, own.tokenizer_gguf) if own is not None else ():
        if source is not None:
            yield source()
    for model in MODELS.values():
        if model is not own and model.source_gguf is not None and model.prepared():
            yield model.source_gguf()


def hf_pieces(model: str, tokens: list[str]) -> list[str]:
    """A GGUF vocabulary as HF spells it: a SentencePiece one ("llama") holds user-defined tokens with spaces where HF
    (and SentencePiece) write the word-boundary mark \u2581 (Gemma's runs of spaces, ids 138-167)."""
    return [t.replace(" ", "\u2581") for t in tokens] if model == "llama" else tokens


@lru_cache(maxsize=2)
def tokenizer_fields(model_path: Path, vocab_size: int) -> list[tuple[str, gguf_header.Value]]:
    """The tokenizer.* fields of the first source GGUF whose vocabulary is the model folder's, id for id. Its token
    count must be the model's vocab_size: llama.cpp's logits have one entry per token (its converter trims
    token_embd to them), so fewer tokens would leave its logits shorter than HF's."""
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(model_path).get_vocab()
    tried = []
    for source in tokenizer_sources(model_path):
        fields = {key: value for key, value in gguf_header.read(source)[0].items() if key.startswith("tokenizer.")}
        tokens = hf_pieces(str(fields["tokenizer.ggml.model"].value),
                           cast(list[str], fields["tokenizer.ggml.tokens"].value))
        tried.append(source.name)
        if len(vocab) >= len(tokens) and all(vocab.get(piece) == i for i, piece in enumerate(tokens)):
            fields = _with_added_tokens(fields, model_path, vocab, len(tokens))
            if len(vocab) != vocab_size:
                raise RuntimeError(f"gguf: {source.name} has {len(vocab)} tokens, the model {vocab_size} logits: "
                                   "llama.cpp would trim token_embd and its logits would not line up with HF's")
            return list({**fields, **_own_template(model_path)}.items())
    raise RuntimeError(f"gguf: the tokenizer of {model_path} is not that of any GGUF shipped here (tried: "
                       f"{', '.join(tried) or 'none'}): give the engine a GGUF file (option gguf: PATH)")


USER_DEFINED, CONTROL = 4, 3  # llama.cpp's token types


def _with_added_tokens(fields: dict[str, gguf_header.Value], model_path: Path, vocab: dict[str, int],
                       shipped: int) -> dict[str, gguf_header.Value]:
    """The source's fields with the folder's tokens past its vocabulary appended (their ids follow on)."""
    if len(vocab) == shipped:
        return fields
    from tokenizers import Tokenizer

    added = {t.content: t.special for t in Tokenizer.from_file(str(model_path / "tokenizer.json"))
             .get_added_tokens_decoder().values()}
    extra = sorted((i, piece) for piece, i in vocab.items() if i >= shipped)
    if [i for i, _ in extra] != list(range(shipped, len(vocab))) or any(p not in added for _, p in extra):
        raise RuntimeError(f"gguf: {model_path}'s tokens past the shipped vocabulary are not added tokens with "
                           "consecutive ids: give the engine a GGUF file (option gguf: PATH)")
    grown = dict(fields)
    for key, values in (("tokenizer.ggml.tokens", [p for _, p in extra]),
                        ("tokenizer.ggml.token_type", [CONTROL if added[p] else USER_DEFINED for _, p in extra]),
                        ("tokenizer.ggml.scores", [0.0] * len(extra))):
        if key in grown:
            grown[key] = grown[key]._replace(value=[*cast(list, grown[key].value), *values])
    return grown


def _own_template(model_path: Path) -> dict[str, gguf_header.Value]:
    """The folder's chat template as tokenizer.chat_template (what llama.cpp renders chat requests with)."""
    own = model_path / "chat_template.jinja"
    return {"tokenizer.chat_template": gguf_header.Value((gguf_header.STRING,), own.read_text())} \
        if own.exists() else {}
