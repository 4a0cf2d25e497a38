"""The harness's own prompt tokenisation gives exactly the ids transformers gives (text and chat template)."""

from __future__ import annotations

import json
import shutil
from html import escape

from harness import models
from harness.scenario.prompts import load_tokenizer, tokenize_prompts
from harness.scenario.spec import PromptSpec

from helpers import parity, write_scenario

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


IDENTITY = """\
name: prompt-identity
model: {model}
engines:
  hf: {{engine: hf, reference: true}}
  hf-strict: {{engine: hf, expect: {{prompt: strict}}}}
prompts:
  - {{id: plain, text: "The quick brown fox"}}
  - {{id: doubled, text: "<|im_start|><|im_start|>The quick brown fox"}}
  - {{id: chat, messages: [{{role: user, content: "Hi there"}}]}}
params: {{temperature: 0, max_new_tokens: 4}}
"""


def test_prompts_whose_ids_are_not_what_the_model_expects_warn_and_fail_under_strict(tmp_path) -> None:
    """A copy of tiny-llama whose tokenizer config says a BOS is added (add_bos_token: true) while its tokenizer.json
    adds none, the slip transformers' GGUF conversion makes on Gemma 3: the text prompt lacks the BOS, a text that
    writes BOS twice doubles it; the chat prompt, which the template starts with BOS, is fine. Each warned case says
    so in the console, summary and HTML report; `expect: {prompt: strict}` fails it."""
    folder = tmp_path / "bos-model"
    shutil.copytree(models.resolve("tiny-llama", "float32"), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    run = parity("run", str(write_scenario(tmp_path / "identity.yaml", IDENTITY.format(model=folder))),
                 out=tmp_path / "reports")
    assert run.code == 1, run.stdout[-2000:] + run.stderr[-2000:]
    verdicts = run.verdicts.set_index("case_id")
    assert set(verdicts.verdict) == {"match"}
    assert list(verdicts[~verdicts.expected].index) == ["plain", "doubled"]  # hf-strict only
    assert verdicts.expected.sum() == 1 and verdicts.loc["chat", "expected"]
    missing = "missing BOS: the model expects <|im_start|> (id 1) first (tokenizer_config.json: add_bos_token true)"
    assert missing in verdicts.loc["plain", "explanation"]
    assert "doubled BOS" in verdicts.loc["doubled", "explanation"]
    assert "special token(s) <|im_start|>" in verdicts.loc["doubled", "explanation"]
    console = " ".join(run.stdout.split())
    assert f"prompt plain: {missing}" in console and "prompt doubled: doubled BOS" in console
    assert "prompt chat" not in console
    assert missing in (run.run_dir / "summary.md").read_text()
    report = parity("report", str(run.run_dir))
    assert report.code == 0 and escape(missing) in (run.run_dir / "report.html").read_text()
