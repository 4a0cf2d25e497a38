"""The commands besides run and explain on gemma3-270m: `parity params` and `parity transplant` show Gemma 3's
settings in every engine's own code, lmdeploy's CPU-usable parts included (bfloat16: lmdeploy runs no float32 and
Gemma 3 overflows float16)."""

from __future__ import annotations

import json

import pytest

from helpers import parity, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: gemma3-sampling-code
model: gemma3-270m
dtype: bfloat16
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm}
  lmdeploy: {engine: lmdeploy}
  lmdeploy-server: {engine: lmdeploy-server}
prompts: ["The capital of France is"]
params: {temperature: 0.7, top_k: 64, top_p: 0.95, repetition_penalty: 1.2, max_new_tokens: 8}
"""


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return write_scenario(tmp_path_factory.mktemp("gemma3-commands") / "gemma3.yaml", SCENARIO)


def test_params_show_each_engines_gemma3_settings(scenario) -> None:
    run = parity("params", str(scenario))
    assert run.code == 0, run.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in run.stdout.splitlines() if line.startswith("| ")}
    header = rows["param"]
    assert header[:4] == ["hf (hf)", "vllm (vllm)", "lmdeploy (lmdeploy)", "lmdeploy-server (lmdeploy-server)"]
    assert rows["repetition_scope"][:4] == ["prompt and output tokens"] * 2 + ["generated tokens only"] * 2
    eos = next(v for k, v in rows.items() if k.startswith("eos_token_id"))
    assert eos[:4] == ["applies 1"] * 4  # Gemma's EOS from its generation config, in every engine's own code
    assert "lmdeploy: temperature divides the bfloat16 logits as they are" in run.stdout


def test_transplant_runs_every_sampler_on_gemma3_logits(scenario, tmp_path) -> None:
    run = parity("transplant", str(scenario), out=tmp_path)
    verdicts = json.loads((run.run_dir / "transplant" / "verdicts.json").read_text())
    assert {v["engine"] for v in verdicts} == {"vllm", "lmdeploy", "lmdeploy-server"}
    assert all(v["cause"] in ("agree", "sampler", "hazard") for v in verdicts), verdicts
    assert all(v["reference"] == "hf" and v["verdict"] in run.stdout for v in verdicts)
    assert run.code == (0 if all(v["cause"] == "agree" for v in verdicts) else 1), run.stderr[-2000:]
