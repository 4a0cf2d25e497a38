"""gemma3-270m as prepared: text prompts start with Gemma's BOS exactly as the shipped GGUF says, and the harness's
tokenisation, transformers' AutoTokenizer and llama.cpp's own tokenizer give the same ids; what this base model
cannot do (chat messages, float16) is refused with a one-line error before any engine starts."""

from __future__ import annotations

import json

import pytest

from harness import models
from harness.core.errors import EXIT_CONFIG
from harness.models.catalog import MODELS, gguf_metadata
from harness.scenario.prompts import load_tokenizer, tokenize_prompts
from harness.scenario.spec import PromptSpec

from helpers import parity, write_scenario

pytestmark = pytest.mark.engines

TEXTS = ["The capital of France is", "Ünïcödé — 日本語 🙂 and\ttabs\n\nnewlines", "  leading spaces", "<b>bold</b>"]


@pytest.fixture(scope="module")
def folder():
    return models.resolve("gemma3-270m", "float32")


def test_the_shipped_gguf_asks_for_a_bos_and_the_prepared_tokenizer_records_it(folder) -> None:
    source = MODELS["gemma3-270m"].source_gguf()
    meta = gguf_metadata(source, ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id"))
    assert meta == {"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 2}
    assert json.loads((folder / "tokenizer_config.json").read_text())["add_bos_token"] is True
    for dtype in ("float32", "bfloat16"):
        assert json.loads((MODELS["gemma3-270m"].folder(dtype) / "config.json").read_text())["model_type"] == \
            "gemma3_text"


def test_harness_transformers_and_llamacpp_tokenise_alike(folder) -> None:
    import llama_cpp
    from transformers import AutoTokenizer

    ours = tokenize_prompts(load_tokenizer(folder), [PromptSpec(id=str(i), text=t) for i, t in enumerate(TEXTS)])
    hf = AutoTokenizer.from_pretrained(folder)
    vocab = llama_cpp.Llama(model_path=str(MODELS["gemma3-270m"].source_gguf()), vocab_only=True, verbose=False)
    for i, text in enumerate(TEXTS):
        ids = ours[str(i)]
        assert ids[0] == 2 and ids[1] != 2, text  # one BOS, not two
        assert ids == hf(text)["input_ids"], text
        assert ids == vocab.tokenize(text.encode(), add_bos=True, special=False), text


def test_chat_messages_to_the_base_model_are_a_one_line_error(tmp_path) -> None:
    scenario = write_scenario(tmp_path / "chat.yaml", """\
model: gemma3-270m
engines: {hf: {engine: hf, reference: true}, again: {engine: hf}}
prompts: [{id: chat, messages: [{role: user, content: Hi}]}]
""")
    run = parity("run", str(scenario), out=tmp_path / "out")
    assert run.code == EXIT_CONFIG, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "chat.yaml: prompt chat: the model has no chat template" in lines[0]
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()


def test_float16_is_refused_with_the_reason(tmp_path) -> None:
    scenario = write_scenario(tmp_path / "fp16.yaml", """\
model: gemma3-270m
dtype: float16
engines: {hf: {engine: hf, reference: true}, vllm: {engine: vllm}}
prompts: ["Hi"]
""")
    run = parity("validate", str(scenario))
    assert run.code == EXIT_CONFIG
    assert "fp16.yaml:2: dtype: model type gemma3_text overflows float16" in run.stderr
    assert "use float32 or bfloat16" in run.stderr and len(run.stderr.strip().splitlines()) == 1
