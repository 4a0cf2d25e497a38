"""LoRA preflight (issue 59, item 3): every adapter a scenario gives an engine is checked where the file is read,
before any engine loads, each refusal one line naming the file, the key, the engine's own rule and the fix. The
adapters and the base model here are small safetensors folders written by the test (no engine, no model build)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from harness.core.errors import ConfigError
from harness.models import catalog, lora, merged
from harness.scenario.spec import load

from helpers import write_scenario

HIDDEN, VOCAB = 16, 32
Q, DOWN, EMBED = "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.embed_tokens"


def base_model(folder: Path, shards: int = 1, tied: bool = False) -> Path:
    """A model folder whose weights the shape check reads: config.json and model.safetensors, or (shards 2) its
    tensors in two files named by model.safetensors.index.json, as save_pretrained shards a model. Tied: lm_head
    tied to the input embedding, so only model.embed_tokens.weight is saved; q_proj has a bias."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                    "tie_word_embeddings": tied}))
    tensors = {"model.layers.0.self_attn.q_proj.weight": np.zeros((HIDDEN, HIDDEN), np.float32),
               "model.layers.0.mlp.down_proj.weight": np.zeros((HIDDEN, 2 * HIDDEN), np.float32)}
    if tied:
        tensors |= {EMBED + ".weight": np.arange(VOCAB * HIDDEN, dtype=np.float32).reshape(VOCAB, HIDDEN),
                    Q + ".bias": np.ones(HIDDEN, np.float32)}
    else:
        tensors["lm_head.weight"] = np.zeros((VOCAB, HIDDEN), np.float32)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    names = [f"model-0000{i + 1}-of-0000{shards}.safetensors" for i in range(shards)]
    where = {key: names[i % shards] for i, key in enumerate(tensors)}
    for name in names:
        save_file({k: v for k, v in tensors.items() if where[k] == name}, str(folder / name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": where}))
    return folder


def adapter(folder: Path, rank: int = 4, modules: dict[str, tuple[int, int]] | None = None,
            extra: dict[str, np.ndarray] | None = None, **config) -> Path:
    """A PEFT folder adapting these modules ({module path: (out, in)}; an embedding's as (vocab, hidden), stored as
    PEFT stores it: lora_embedding_A [r, vocab], lora_embedding_B [hidden, r]), with `extra` tensors beside."""
    folder.mkdir(parents=True)
    tensors = dict(extra or {})
    for name, (out, inp) in (modules or {Q: (HIDDEN, HIDDEN)}).items():
        prefix = f"base_model.model.{name}"
        if name == EMBED:
            tensors[f"{prefix}.lora_embedding_A"] = np.ones((rank, out), np.float32)
            tensors[f"{prefix}.lora_embedding_B"] = np.full((inp, rank), 0.5, np.float32)
            continue
        tensors[f"{prefix}.lora_A.weight"] = np.ones((rank, inp), np.float32)
        tensors[f"{prefix}.lora_B.weight"] = np.ones((out, rank), np.float32)
    save_file(tensors, str(folder / lora.WEIGHTS))
    (folder / lora.CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, **config}))
    return folder


def scenario(tmp_path: Path, model: Path, engine: str, lora_value: str) -> Path:
    return write_scenario(tmp_path / "s.yaml", f"""\
model: {model}
lora: {lora_value}
engines:
  hf: {{engine: hf, reference: true}}
  other: {{engine: {engine}}}
prompts: ["hi"]
params: {{temperature: 0, max_new_tokens: 2}}
""")


def refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = caught.value.message
    assert "\n" not in message.strip() and str(path) in message, message
    return message


def test_a_fitting_adapter_passes_and_names_its_scale(tmp_path: Path) -> None:
    model = base_model(tmp_path / "base")
    folder = adapter(tmp_path / "ok")
    load(scenario(tmp_path, model, "vllm", str(folder)))
    info = lora.read(folder)
    assert (info.rank, info.scale, info.targets) == (4, 2.0, ("q_proj",))


def test_a_missing_folder_is_named_with_the_fix(tmp_path: Path) -> None:
    message = refusal(scenario(tmp_path, base_model(tmp_path / "base"), "vllm", str(tmp_path / "nowhere")))
    assert "lora:" in message and "is not a folder" in message and "lora-smollm2" in message


def test_an_engine_without_adapters_is_named(tmp_path: Path) -> None:
    message = refusal(scenario(tmp_path, base_model(tmp_path / "base"), "lmdeploy, dtype: bfloat16",
                               str(adapter(tmp_path / "a"))))
    assert "cannot apply a LoRA adapter" in message and "lora: none" in message


def test_a_rank_over_the_engines_limit_quotes_its_rule(tmp_path: Path) -> None:
    message = refusal(scenario(tmp_path, base_model(tmp_path / "base"), "vllm",
                               str(adapter(tmp_path / "big", rank=600))))
    assert "rank 600" in message and "max_lora_rank" in message and "512" in message


def test_a_module_the_engine_cannot_adapt_quotes_its_rule(tmp_path: Path) -> None:
    head = adapter(tmp_path / "head", modules={Q: (HIDDEN, HIDDEN), "lm_head": (32, HIDDEN)})
    message = refusal(scenario(tmp_path, base_model(tmp_path / "base"), "vllm", str(head)))
    assert "adapts lm_head, which vllm cannot adapt" in message


def test_an_adapter_of_another_model_is_refused_by_its_shapes(tmp_path: Path) -> None:
    other = adapter(tmp_path / "other", modules={Q: (2 * HIDDEN, 2 * HIDDEN)},
                    base_model_name_or_path="some/other-model")
    message = refusal(scenario(tmp_path, base_model(tmp_path / "base"), "vllm", str(other)))
    assert "[32, 32] weight" in message and "[16, 16]" in message and "some/other-model" in message


def test_a_named_adapter_of_another_base_is_refused(tmp_path: Path) -> None:
    message = refusal(scenario(tmp_path, base_model(tmp_path / "base"), "vllm", "lora-smollm2"))
    assert "lora-smollm2 is an adapter of smollm2-135m" in message


def test_merged_model_names_split_and_merge_in_float64(tmp_path: Path) -> None:
    assert merged.split("tiny-llama+lora-tiny-llama") == ("tiny-llama", "lora-tiny-llama")
    assert merged.split("tiny-llama") is None
    assert catalog.model_problem("tiny-llama+nowhere").startswith("nowhere is not a folder")
    model = base_model(tmp_path / "base")
    folder = adapter(tmp_path / "a", modules={DOWN: (HIDDEN, 2 * HIDDEN)})
    merged.merge(model, folder, tmp_path / "out")
    from safetensors.numpy import load_file

    down = load_file(str(tmp_path / "out" / "float32" / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    assert np.allclose(down, 2.0 * 4)  # scale (alpha / r = 2) x B A (ones: rank 4)
    assert json.loads((tmp_path / "out" / "bfloat16" / "config.json").read_text()).get("dtype") == "bfloat16"


def test_a_merged_model_of_an_adapter_and_another_base_is_refused(tmp_path: Path) -> None:
    assert catalog.model_problem("tiny-llama+lora-smollm2") == "lora-smollm2 is an adapter of smollm2-135m, not of " \
                                                              "tiny-llama"
    other = adapter(tmp_path / "other", modules={Q: (2 * HIDDEN, 2 * HIDDEN)})
    problem = catalog.model_problem(f"{base_model(tmp_path / 'base')}+{other}")
    assert problem and "an adapter of another model" in problem


@pytest.mark.parametrize("config, words", [({"use_dora": True}, "use_dora set"),
                                           ({"modules_to_save": ["lm_head"]}, "modules_to_save set")])
def test_what_goes_beyond_plain_lora_is_refused(tmp_path: Path, config: dict, words: str) -> None:
    folder = adapter(tmp_path / "a", **config)
    assert words in lora.folder_problem(folder)


def test_weights_that_are_not_safetensors_are_named(tmp_path: Path) -> None:
    folder = adapter(tmp_path / "a")
    (folder / lora.WEIGHTS).write_bytes(b"not a safetensors file")
    assert "is not a readable safetensors file" in lora.folder_problem(folder)


def test_a_sharded_base_is_read_for_the_adapter_shape_check(tmp_path: Path) -> None:
    """Issue 75 item 3: the weights of a base saved in two shards are read, not skipped."""
    other = adapter(tmp_path / "other", modules={Q: (2 * HIDDEN, 2 * HIDDEN)})
    message = refusal(scenario(tmp_path, base_model(tmp_path / "base", shards=2), "vllm", str(other)))
    assert "[32, 32] weight" in message and "[16, 16]" in message
    load(scenario(tmp_path, tmp_path / "base", "vllm", str(adapter(tmp_path / "fits"))))


def test_a_sharded_base_merges_shard_by_shard(tmp_path: Path, monkeypatch) -> None:
    """`<sharded base>+<adapter>` builds: each shard merged and kept a shard, the index written for each dtype."""
    from safetensors.numpy import load_file

    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path / "cache"))
    base = base_model(tmp_path / "base", shards=2)
    folder = adapter(tmp_path / "a", modules={DOWN: (HIDDEN, 2 * HIDDEN)})
    out = catalog.resolve(f"{base}+{folder}", "float32")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    shard = out / index["weight_map"]["model.layers.0.mlp.down_proj.weight"]
    assert np.allclose(load_file(str(shard))["model.layers.0.mlp.down_proj.weight"], 2.0 * 4)
    assert not (out / "model.safetensors").exists()
    halves = json.loads((out.parent / "bfloat16" / "model.safetensors.index.json").read_text())["metadata"]
    assert 2 * halves["total_size"] == index["metadata"]["total_size"] == 4 * (16 * 16 + 16 * 32 + 32 * 16)


def test_a_base_without_readable_safetensors_is_named_before_merging(tmp_path: Path) -> None:
    folder = str(adapter(tmp_path / "a"))
    base = base_model(tmp_path / "base", shards=2)
    (base / "model-00002-of-00002.safetensors").unlink()
    problem = catalog.model_problem(f"{base}+{folder}")
    assert "weight_map names model-00002-of-00002.safetensors" in problem and "\n" not in problem
    (base / "model.safetensors.index.json").write_text("{")
    assert "model.safetensors.index.json is not readable JSON" in catalog.model_problem(f"{base}+{folder}")
    (base / "model.safetensors.index.json").unlink()
    assert "has no model.safetensors or model.safetensors.index.json" in catalog.model_problem(f"{base}+{folder}")


BIAS = {f"base_model.model.{Q}.lora_B.bias": np.full(HIDDEN, 3.0, np.float32)}


@pytest.mark.parametrize("engine, words", [
    ("vllm", "has a lora_B.bias (q_proj; PEFT's lora_bias), which vllm does not apply (vLLM 0.32's"),
    ("llama.cpp", "has a lora_B.bias (q_proj; PEFT's lora_bias), which llama.cpp does not apply (llama.cpp's"),
])
def test_a_lora_b_bias_is_refused_where_the_engine_does_not_apply_it(tmp_path: Path, engine: str, words: str) -> None:
    """Issue 75 item 4: the bias was dropped without a word (only A and B were read)."""
    biased = adapter(tmp_path / "biased", extra=BIAS, lora_bias=True)
    assert words in refusal(scenario(tmp_path, base_model(tmp_path / "base"), engine, str(biased)))
    load(scenario(tmp_path, tmp_path / "base", "hf, dtype: float32", str(biased)))  # PEFT applies it
    assert lora.read(biased).biased == ("q_proj",)


def test_an_embedding_adapter_is_read_and_refused_where_the_engine_cannot_adapt_it(tmp_path: Path) -> None:
    embedding = adapter(tmp_path / "embed", modules={Q: (HIDDEN, HIDDEN), EMBED: (VOCAB, HIDDEN)})
    base = base_model(tmp_path / "base", tied=True)
    assert lora.read(embedding).targets == ("embed_tokens", "q_proj")
    assert "adapts embed_tokens, which vllm cannot adapt" in refusal(scenario(tmp_path, base, "vllm", str(embedding)))
    load(scenario(tmp_path, base, "hf, dtype: float32", str(embedding)))


def test_an_lm_head_adapter_on_a_tied_base_is_not_an_adapter_of_another_model(tmp_path: Path) -> None:
    """The tied base saves no lm_head.weight: its lm_head is the input embedding, [vocab, hidden]."""
    head = adapter(tmp_path / "head", modules={"lm_head": (VOCAB, HIDDEN)})
    base = base_model(tmp_path / "base", tied=True)
    load(scenario(tmp_path, base, "hf, dtype: float32", str(head)))
    assert "adapts lm_head, which vllm cannot adapt" in refusal(scenario(tmp_path, base, "vllm", str(head)))
    wrong = adapter(tmp_path / "wrong", modules={"lm_head": (VOCAB + 1, HIDDEN)})
    assert "adapts lm_head as a [33, 16] weight" in catalog.model_problem(f"{base}+{wrong}")


@pytest.mark.parametrize("name", ["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
                                  "base_model.model.lm_head.weight", f"base_model.model.{DOWN}.lora_A.weight"])
def test_a_tensor_the_harness_would_not_apply_refuses_the_adapter(tmp_path: Path, name: str) -> None:
    """DoRA's magnitude, a modules_to_save copy, half a pair: applied in part, the adapter would not be itself."""
    folder = adapter(tmp_path / "a", extra={name: np.ones((HIDDEN, 1), np.float32)})
    problem = lora.folder_problem(folder)
    assert f"{name} is not a LoRA tensor the harness applies" in problem and "whole or not at all" in problem


def merged_weights(tmp_path: Path, base: Path, folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    from safetensors.numpy import load_file

    merged.merge(base, folder, tmp_path / "out")
    out = tmp_path / "out" / "float32"
    return load_file(str(out / "model.safetensors")), json.loads((out / "config.json").read_text())


def test_merging_into_a_tied_base_unties_what_the_adapter_changes(tmp_path: Path) -> None:
    """PEFT adapts lm_head and the input embedding each on its own: the merged model keeps its own lm_head (the
    embedding plus lm_head's update) beside the embedding (plus its update, B A transposed), untied."""
    base = base_model(tmp_path / "base", tied=True)
    folder = adapter(tmp_path / "a", modules={"lm_head": (VOCAB, HIDDEN), EMBED: (VOCAB, HIDDEN)})
    weights, config = merged_weights(tmp_path, base, folder)
    embedding = np.arange(VOCAB * HIDDEN, dtype=np.float32).reshape(VOCAB, HIDDEN)
    np.testing.assert_array_equal(weights["lm_head.weight"], embedding + 2.0 * 4)  # scale 2 x B A (ones, rank 4)
    np.testing.assert_array_equal(weights[EMBED + ".weight"], embedding + 2.0 * 4 * 0.5)  # (B A)^T: 0.5 x rank 4
    assert config["tie_word_embeddings"] is False


def test_a_saved_base_layer_weight_is_where_the_merged_update_starts(tmp_path: Path) -> None:
    """PEFT saves an adapted lm_head's own weight with the adapter and loads it in place of the base model's."""
    saved = {"base_model.model.lm_head.base_layer.weight": np.full((VOCAB, HIDDEN), 7.0, np.float32)}
    folder = adapter(tmp_path / "a", modules={"lm_head": (VOCAB, HIDDEN)}, extra=saved)
    weights, _ = merged_weights(tmp_path, base_model(tmp_path / "base", tied=True), folder)
    np.testing.assert_array_equal(weights["lm_head.weight"], 7.0 + 2.0 * 4)


def test_a_lora_b_bias_merges_into_the_base_bias_and_is_refused_where_there_is_none(tmp_path: Path) -> None:
    folder = adapter(tmp_path / "a", extra=BIAS, lora_bias=True)
    weights, config = merged_weights(tmp_path, base_model(tmp_path / "tied", tied=True), folder)
    np.testing.assert_array_equal(weights[Q + ".bias"], 1.0 + 2.0 * 3.0)  # base 1 + scale 2 x bias 3
    assert config["tie_word_embeddings"] is True  # neither lm_head nor the embedding was adapted
    problem = catalog.model_problem(f"{base_model(tmp_path / 'plain')}+{folder}")
    assert problem.startswith(f"{folder} has a lora_B.bias for {Q}, which has no bias in") and "`lora:`" in problem
