"""Turn scenario prompts into token ids once, in the harness, so every engine sees the same ids.

Chat messages get the model's chat template (with the generation prompt); text is tokenised as is.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import ConfigError
from harness.scenario import PromptSpec


def load_tokenizer(model_path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def tokenize_prompts(tokenizer, prompts: list[PromptSpec]) -> dict[str, list[int]]:
    ids: dict[str, list[int]] = {}
    for prompt in prompts:
        if prompt.token_ids is not None:
            ids[prompt.id] = list(prompt.token_ids)
        elif prompt.messages is not None:
            if not tokenizer.chat_template:
                raise ConfigError(f"prompt {prompt.id}: the model has no chat template: "
                                  "use text prompts")
            encoded = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
            ids[prompt.id] = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        else:
            ids[prompt.id] = tokenizer(prompt.text)["input_ids"]
        if not ids[prompt.id]:
            raise ConfigError(f"prompt {prompt.id}: tokenises to no tokens: give it some text")
    return ids
