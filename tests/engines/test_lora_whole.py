"""Adapters applied whole (issue 75, item 4), with real engines on the tiny Llama:

- an adapter saved with use_rslora (scale alpha / sqrt(r)) gives HF+PEFT's tokens in vLLM, in llama.cpp (its GGUF
  adapter written with alpha x sqrt(r), as llama.cpp scales by alpha / r) and as the merged model, while the same
  weights read at alpha / r answer otherwise: every engine applied the rsLoRA scale;
- an adapter PEFT saves for q_proj, v_proj, the input embedding and the lm_head that the tiny Llama ties to it
  (lora_embedding_A/B, the embedding layers' own weights saved beside) gives HF+PEFT's tokens as the merged model,
  which unties lm_head; without the adapter HF answers otherwise.

The second run uses a cache of its own (LLM_PARITY_CACHE, tiny-llama linked in), so the merged model of a temporary
adapter is not left in the shared one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import models
from harness.models.catalog import CACHE_ENV, adapter_folder
from harness.models.lora import CONFIG, WEIGHTS

from helpers import ParityRun, parity, write_scenario

# PEFT's own notes on the adapter the test saves, which the merge answers (it unties lm_head)
pytestmark = [pytest.mark.engines,
              pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning"),
              pytest.mark.filterwarnings("ignore:Setting `save_embedding_layers`:UserWarning")]

PROMPTS = """\
prompts:
  - {id: story, text: "Once upon a time, in a small village by the sea,"}
  - {id: chat, messages: [{role: user, content: "What is 12 times 7? Answer briefly."}]}
params: {temperature: 0, max_new_tokens: 12, ignore_eos: true}
"""


def without_rslora(source: Path, target: Path) -> Path:
    """The adapter's weights with use_rslora false: read at alpha / r, the scale an engine ignoring it applies."""
    target.mkdir()
    shutil.copy2(source / WEIGHTS, target / WEIGHTS)
    config = json.loads((source / CONFIG).read_text())
    (target / CONFIG).write_text(json.dumps({**config, "use_rslora": False}))
    return target


@pytest.fixture(scope="module")
def rslora(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("rslora")
    plain = without_rslora(adapter_folder("lora-tiny-llama-rslora"), tmp / "alpha-over-r")
    scenario = write_scenario(tmp / "rslora.yaml", f"""\
name: lora-rslora
model: tiny-llama
lora: lora-tiny-llama-rslora
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
  llama.cpp: {{engine: llama.cpp, options: {{gguf: f32}}}}
  merged: {{engine: hf, model: tiny-llama+lora-tiny-llama-rslora}}
  alpha-over-r: {{engine: hf, lora: {plain}, expect: {{tokens: any}}}}
{PROMPTS}""")
    return parity("run", str(scenario), out=tmp / "out")


def test_an_rslora_adapter_gives_the_same_tokens_in_every_engine(rslora: ParityRun) -> None:
    assert rslora.code == 0, rslora.stdout[-3000:] + rslora.stderr[-2000:]
    assert json.loads((adapter_folder("lora-tiny-llama-rslora") / CONFIG).read_text())["use_rslora"] is True
    verdicts = rslora.verdicts.set_index(["engine", "case_id"]).verdict
    for engine in ("vllm", "llama.cpp", "merged"):
        assert set(verdicts[engine]) == {"match"}, (engine, verdicts[engine].to_dict())
    assert "match" not in set(verdicts["alpha-over-r"])  # the scale matters: alpha / r answers otherwise


def peft_adapter(base: Path, out: Path) -> Path:
    """A LoRA adapter as PEFT saves one for q_proj, v_proj, embed_tokens and lm_head (rank 8, alpha 16, rsLoRA),
    its A and B drawn (init_lora_weights false; PEFT would start B at zero), seeded."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"],
                        use_rslora=True, init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[ParityRun, Path]:
    tmp = tmp_path_factory.mktemp("whole")
    tiny = models.resolve("tiny-llama", "float32")
    adapter = peft_adapter(tiny, tmp / "whole")
    cache = tmp / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "tiny-llama").symlink_to(tiny.parent)
    scenario = write_scenario(tmp / "whole.yaml", f"""\
name: lora-whole
model: tiny-llama
lora: {adapter}
engines:
  hf: {{engine: hf, reference: true}}
  merged: {{engine: hf, model: "tiny-llama+{adapter}"}}
  base: {{engine: hf, lora: none, expect: {{tokens: any}}}}
{PROMPTS}""")
    return parity("run", str(scenario), out=tmp / "out", env={CACHE_ENV: str(cache)}), cache


def test_embeddings_and_a_tied_lm_head_merge_as_peft_applies_them(whole: tuple[ParityRun, Path]) -> None:
    run, cache = whole
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = run.verdicts.set_index(["engine", "case_id"]).verdict
    assert set(verdicts["merged"]) == {"match"}, verdicts.to_dict()
    assert set(verdicts["base"]) == {"diverged"}
    merged = next((cache / "models" / "merged").glob("tiny-llama+whole-*"))
    assert json.loads((merged / "float32" / "config.json").read_text())["tie_word_embeddings"] is False
