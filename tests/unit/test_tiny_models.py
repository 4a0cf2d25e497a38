"""The tiny family models are built the same on every machine, keep what makes each family different, and have
no bias or norm weight at its neutral init (where a map reading the wrong module would go unnoticed)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from harness.models.tiny import FAMILIES, build, routers


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
    assert not configs["glm4_moe"].tie_word_embeddings  # vLLM never ties GLM-4.5's head (vllm#22460)
    assert configs["qwen2_moe"].shared_expert_intermediate_size and not configs["qwen2_moe"].norm_topk_prob
    for kind in ("linear", "llama3", "yarn", "longrope"):  # read back from the config transformers builds
        assert configs[f"llama-rope-{kind}"].rope_parameters["rope_type"] == kind


@pytest.mark.parametrize("family", sorted(name for name, family in FAMILIES.items() if family.experts))
def test_routers_hold_near_ties_and_wide_margins_at_the_top_2_boundary(family: str, tokenizer) -> None:
    """On a test prompt, every router has positions where the 2nd and 3rd expert scores are near-tied (under 0.1) and
    positions where they are far apart (over 1), as the families' router draw intends."""
    model = build(FAMILIES[family], tokenizer)
    found = routers(model, FAMILIES[family].experts)
    assert len(found) == model.config.num_hidden_layers
    scores: list[torch.Tensor] = []
    for router in found:
        router.register_forward_hook(lambda module, args, out: scores.append(
            next(t for t in (out if isinstance(out, tuple) else (out,)) if t.shape[-1] == 4)))
    prompt = tokenizer("The capital of France is a city of art, history and food. Once upon a time",
                       return_tensors="pt").input_ids
    with torch.no_grad():
        model(prompt)
    for layer, logits in enumerate(scores):
        ranked = logits.reshape(-1, 4).sort(-1, descending=True).values
        margin = ranked[:, 1] - ranked[:, 2]
        assert (margin < 0.1).any() and (margin > 1.0).any(), (layer, margin)
