"""The harness's own prompt tokenisation gives exactly the ids transformers gives (text and chat template)."""

from __future__ import annotations

from harness import models
from harness.scenario.prompts import load_tokenizer, tokenize_prompts
from harness.scenario.spec import PromptSpec

PROMPTS = [PromptSpec(id="text", text="The capital of France is"),
           PromptSpec(id="unicode", text="Ünïcödé — 日本語 🙂 and\ttabs\n\nnewlines"),
           PromptSpec(id="chat", messages=[{"role": "user", "content": "What is 12 times 7?"}]),
           PromptSpec(id="system", messages=[{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello!"},
                                             {"role": "user", "content": "Bye"}])]


def test_same_ids_as_transformers() -> None:
    from transformers import AutoTokenizer

    path = models.resolve("smollm2-135m", "float32")
    reference = AutoTokenizer.from_pretrained(path)
    ours = tokenize_prompts(load_tokenizer(path), PROMPTS)
    assert ours["text"] == reference("The capital of France is")["input_ids"]
    assert ours["unicode"] == reference(PROMPTS[1].text)["input_ids"]
    for prompt in PROMPTS[2:]:
        expected = reference.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert ours[prompt.id] == list(expected), prompt.id
    assert load_tokenizer(path).decode(ours["unicode"]) == reference.decode(ours["unicode"])
