"""A model folder saved in shards (model.safetensors.index.json and its files, how most published models ship) works
wherever the harness reads weights (issue 75, item 3): the tiny Llama saved by HF's save_pretrained in two shards,
run by HF with its LoRA adapter (the preflight reads the shards' shapes), merged with that adapter into a model of
its own (`<folder>+<adapter>`, merged shard by shard) and written as an f32 GGUF for llama.cpp with the adapter:
every engine gives HF's tokens, and the GGUF holds the same tensors as the one written from the unsharded folder.

The run uses a cache of its own (LLM_PARITY_CACHE), so the merged model and the GGUF files of a temporary folder are
not left in the shared one; smollm2-135m is linked in, the named model whose GGUF tokenizer the writer takes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from harness import models
from harness.models.catalog import CACHE_ENV, adapter_folder
from harness.models.weight_files import INDEX

from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines


def sharded_copy(source: Path, target: Path) -> Path:
    """The model in `source` as save_pretrained writes it in shards of at most 8 MB (two for the tiny Llama: its
    embedding alone, then every other tensor), with the source's tokenizer and generation config."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(source).save_pretrained(target, max_shard_size="8MB")
    for item in source.iterdir():
        if not (target / item.name).exists() and item.name not in ("model.safetensors", "source.json"):
            shutil.copy2(item, target / item.name)
    return target


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the sharded folder, the adapter's folder, a cache of the test's own)."""
    tmp = tmp_path_factory.mktemp("sharded")
    folder = sharded_copy(models.resolve("tiny-llama", "float32"), tmp / "tiny-llama-sharded")
    cache = tmp / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "smollm2-135m").symlink_to(models.resolve("smollm2-135m", "float32").parent)
    return folder, adapter_folder("lora-tiny-llama"), cache


@pytest.fixture(scope="module")
def run(sharded, tmp_path_factory) -> ParityRun:
    folder, adapter, cache = sharded
    tmp = tmp_path_factory.mktemp("sharded-run")
    scenario = write_scenario(tmp / "sharded.yaml", f"""\
name: sharded
model: {folder}
lora: {adapter}
engines:
  hf: {{engine: hf, reference: true}}
  merged: {{engine: hf, model: "{folder}+{adapter}"}}
  llama.cpp: {{engine: llama.cpp, options: {{gguf: f32}}}}
prompts:
  - {{id: story, text: "Once upon a time, in a small village by the sea,"}}
params: {{temperature: 0, max_new_tokens: 8, ignore_eos: true}}
""")
    return parity("run", str(scenario), out=tmp / "out", env={CACHE_ENV: str(cache)})


def test_a_sharded_base_runs_with_its_adapter_merged_and_as_gguf(sharded, run: ParityRun) -> None:
    folder = sharded[0]
    assert len(list(folder.glob("model-*-of-*.safetensors"))) == 2 and (folder / INDEX).exists()
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = run.verdicts.set_index("engine").verdict
    assert verdicts["merged"] == "match" and verdicts["llama.cpp"] == "match", verdicts.to_dict()
    merged = next((sharded[2] / "models" / "merged").glob("tiny-llama-sharded+lora-tiny-llama-*"))
    assert (merged / "float32" / INDEX).exists()  # merged shard by shard, kept in shards


def test_the_gguf_of_a_sharded_folder_holds_the_unsharded_folders_tensors(sharded, run: ParityRun) -> None:
    from gguf import GGUFReader

    from adapters.engines import llamacpp_gguf

    written = next((sharded[2] / "gguf").glob("tiny-llama-sharded-*/f32.gguf"))
    single = llamacpp_gguf.ensure(models.resolve("tiny-llama", "float32"), "f32")
    ours, theirs = ({t.name: np.asarray(t.data) for t in GGUFReader(str(path)).tensors} for path in (written, single))
    assert sorted(ours) == sorted(theirs) and len(ours) > 10
    assert all(np.array_equal(ours[name], theirs[name]) for name in ours)
