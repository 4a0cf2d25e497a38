"""The architecture maps as data: every point a map names is canonical, HF's and vLLM's maps of a model type yield
the same points, widths come from any family's config, and a model type without a map gets a logits-only stand-in
that says which map is missing and where to learn to add one."""

from __future__ import annotations

import pytest
from transformers import GPT2Config, Qwen3Config

from adapters.tracing import hf_maps, vllm_maps
from adapters.tracing.arch_maps import ArchMap, arch_map, sizes
from harness.core.points import LAYER_POINTS


def points(arch: ArchMap) -> set[str]:
    per_layer = {p for t in arch.per_layer for p in t.points}
    return per_layer | ({"q_rope", "k_rope"} if arch.rope else set())


@pytest.mark.parametrize("model_type", sorted(hf_maps.MAPS))
def test_hf_and_vllm_maps_of_a_model_type_yield_the_same_canonical_points(model_type: str) -> None:
    hf, vllm = arch_map("hf", model_type), arch_map("vllm", model_type)
    assert points(hf) == points(vllm) and points(hf) <= set(LAYER_POINTS)
    assert {p for t in hf.before + hf.after for p in t.points} == {"embeddings", "final_norm"}
    assert {p for t in vllm.before + vllm.after for p in t.points} == {"embeddings", "final_norm", "logits"}


def test_the_engines_map_the_same_model_types() -> None:
    assert set(hf_maps.MAPS) == set(vllm_maps.MAPS)


def test_a_model_type_without_a_map_gets_a_logits_only_stand_in_naming_the_guide() -> None:
    arch = arch_map("hf", "phi3")
    assert arch.logits_only and not arch.per_layer
    assert arch.missing.startswith("no hf architecture map for model type 'phi3' (known: gemma2, gemma3_text, glm4")
    assert "docs/adding-an-architecture.md" in arch.missing
    assert arch_map("vllm", "phi3").after[-1].points == ("logits",)


def test_widths_come_from_each_family_s_own_config_names() -> None:
    assert sizes(GPT2Config(n_embd=64, n_head=2, n_inner=128)) == {"q": 64, "kv": 64, "ffn": 128, "head_dim": 32}
    assert sizes(GPT2Config(n_embd=64, n_head=2))["ffn"] == 256  # n_inner None: GPT-2's 4 x hidden
    qwen3 = Qwen3Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=48, intermediate_size=96)
    assert sizes(qwen3) == {"q": 96, "kv": 48, "ffn": 96, "head_dim": 48}
