"""Prompt identity, on tokenizers built here: a missing BOS where the tokenizer config or the tokenizer itself adds
one, a doubled BOS, special tokens inside text or chat messages; and the verdicts a warned case gets (a note, or a
failure under `expect: {prompt: strict}`)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from harness.compare.prompt_verdicts import mark_verdicts
from harness.scenario.prompt_identity import check_engine_prompts, check_prompts, prompt_warnings
from harness.scenario.prompts import load_tokenizer
from harness.scenario.spec import PromptSpec, load

WORDS = ["<bos>", "<eos>", "<|user|>", "the", "cat", "sat", "<unk>"]


def folder(tmp_path: Path, add_bos_token: bool | None, post_processor_adds: bool) -> Path:
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<bos>", "<eos>", "<|user|>"])
    if post_processor_adds:
        tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<bos>", "eos_token": "<eos>"}
    if add_bos_token is not None:
        config["add_bos_token"] = add_bos_token
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def warnings_for(path: Path, prompt: PromptSpec) -> list[str]:
    tokenizer = load_tokenizer(path)
    ids = prompt.token_ids if prompt.token_ids is not None else tokenizer.encode(prompt.text)
    return prompt_warnings(tokenizer, prompt, ids)


@pytest.mark.parametrize("add_bos_token, adds, rule", [
    (True, True, "tokenizer_config.json: add_bos_token true"), (None, True, "its tokenizer.json adds it")])
def test_ids_without_the_bos_the_model_expects_are_warned(tmp_path, add_bos_token, adds, rule) -> None:
    path = folder(tmp_path, add_bos_token, adds)
    assert warnings_for(path, PromptSpec(id="ok", text="the cat sat")) == []
    assert warnings_for(path, PromptSpec(id="ids", token_ids=[3, 4, 5])) == [
        f"missing BOS: the model expects <bos> (id 0) first ({rule}), these ids start with 3"]


def test_no_bos_rule_no_warning(tmp_path) -> None:
    path = folder(tmp_path, None, False)
    assert warnings_for(path, PromptSpec(id="ids", token_ids=[3, 4, 5])) == []
    assert warnings_for(folder(tmp_path, False, True), PromptSpec(id="ids", token_ids=[3, 4])) == []


def test_a_bos_written_into_text_the_tokenizer_also_adds_is_doubled(tmp_path) -> None:
    found = warnings_for(folder(tmp_path, True, True), PromptSpec(id="doubled", text="<bos> the cat"))
    assert found == ["doubled BOS: the ids start with <bos> (id 0) twice",
                     "special token(s) <bos> written inside the prompt's text: they tokenise as control tokens, not "
                     "as the text they spell"]


def test_special_tokens_inside_chat_messages_are_warned(tmp_path) -> None:
    tokenizer = load_tokenizer(folder(tmp_path, None, False))
    prompt = PromptSpec(id="chat", messages=[{"role": "user", "content": "<|user|> the <eos> cat"}])
    assert check_prompts(tokenizer, [prompt], {"chat": [3]}) == {"chat": [
        "special token(s) <eos>, <|user|> written inside the prompt's text: they tokenise as control tokens, not as "
        "the text they spell"]}


SCENARIO = """\
model: {model}
engines:
  ref: {{engine: hf, reference: true}}
  loose: {{engine: hf}}
  strict: {{engine: hf, expect: {{prompt: strict}}}}
prompts: ["the cat", "the cat sat"]
"""


def test_a_warned_case_is_noted_everywhere_and_fails_only_under_strict(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    (tmp_path / "config.json").write_text("{}")  # a model folder, as validation asks
    scenario = load(path, text=SCENARIO.format(model=tmp_path))
    verdicts = pd.DataFrame({"case_id": ["p0", "p1", "p0", "p1"], "engine": ["loose", "loose", "strict", "strict"],
                             "verdict": "match", "expected": True, "explanation": "identical 2 tokens"})
    marked = mark_verdicts(verdicts, scenario, {"p0": ["doubled BOS: x"]}).set_index(["engine", "case_id"])
    assert marked.loc[("loose", "p0"), "expected"] and not marked.loc[("strict", "p0"), "expected"]
    assert marked.loc[("loose", "p0"), "explanation"] == "identical 2 tokens; prompt: doubled BOS: x"
    assert marked.loc[("strict", "p0"), "explanation"].endswith("(expect prompt: strict)")
    assert marked.loc[("strict", "p1"), "expected"] and marked.loc[("strict", "p1"), "explanation"] == \
        "identical 2 tokens"


def gguf_with_bos_rule(path: Path, add_bos: bool, bos_id: int) -> Path:
    """A GGUF file holding only the tokenizer's BOS metadata (what the check reads), written by the gguf package."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_bool("tokenizer.ggml.add_bos_token", add_bos)
    writer.add_uint32("tokenizer.ggml.bos_token_id", bos_id)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


USER_GGUF = """\
model: {model}
engines:
  ref: {{engine: hf, reference: true}}
  mine: {{engine: llama.cpp, options: {{gguf: {gguf}}}}}
prompts: ["the cat"]
"""


@pytest.mark.parametrize("add_bos, tokenizer_adds, words", [
    (True, False, "missing BOS for its own model file: tokenizer.ggml.add_bos_token true in user.gguf asks for id 0 "
                  "first, these ids start with 3"),
    (False, True, "a BOS its own model file does not ask for (tokenizer.ggml.add_bos_token false in user.gguf): "
                  "these ids start with id 0"),
    (True, True, None),
])
def test_a_users_gguf_is_held_to_its_own_bos_rule(tmp_path: Path, add_bos: bool, tokenizer_adds: bool,
                                                  words: str | None) -> None:
    """The harness's prompt ids (from the reference's tokenizer) against the BOS rule in the GGUF a llama.cpp engine
    was given: flagged for that engine's verdict rows only."""
    model = folder(tmp_path, None, tokenizer_adds)
    (model / "config.json").write_text("{}")
    user = gguf_with_bos_rule(tmp_path / "user.gguf", add_bos, 0)
    scenario = load(tmp_path / "s.yaml", text=USER_GGUF.format(model=model, gguf=user))
    prompts = [c.prompt for c in scenario.cases]
    ids = {"p0": load_tokenizer(model).encode("the cat")}
    found = check_engine_prompts(scenario, prompts, ids)
    assert found == ({"mine": {"p0": [words]}} if words else {})
    verdicts = pd.DataFrame({"case_id": ["p0"], "engine": ["mine"], "verdict": "match", "expected": True,
                             "explanation": "identical 2 tokens"})
    marked = mark_verdicts(verdicts, scenario, {}, found)
    assert marked.explanation.iloc[0] == "identical 2 tokens" + (f"; prompt: {words}" if words else "")
