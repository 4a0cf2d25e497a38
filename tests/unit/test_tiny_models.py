"""The tiny family models are built the same on every machine, keep what makes each family different, and have
no bias or norm weight at its neutral init (where a map reading the wrong module would go unnoticed)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from harness.models.tiny import FAMILIES, build


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    from harness.models.catalog import MODELS, prepare

    prepare("smollm2-135m")
    return AutoTokenizer.from_pretrained(MODELS["smollm2-135m"].folder("float32"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_is_built_of_its_own_type_and_seeded(family: str, tokenizer) -> None:
    model = build(FAMILIES[family], tokenizer)
    again = build(FAMILIES[family], tokenizer)
    assert model.config.model_type == FAMILIES[family].model_type
    for (name, param), (_, other) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(param, other), name
        if param.dim() == 1:
            assert not torch.all(param == 0) and not torch.all(param == 1), name


def test_what_each_family_adds_is_switched_on(tokenizer) -> None:
    configs = {name: build(family, tokenizer).config for name, family in FAMILIES.items()}
    assert configs["mistral"].sliding_window == 16 and configs["gemma2"].sliding_window == 16
    assert configs["gemma2"].final_logit_softcapping and configs["gemma2"].attn_logit_softcapping
    assert configs["glm4"].attention_bias
    assert all(getattr(c, "head_dim", 32) == 32 for c in configs.values())
