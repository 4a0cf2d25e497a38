"""LoRA adapters at serving time (issue 59, items 1 and 2) with real engines: the named tiny adapter on tiny-llama
applied by HF through PEFT, vLLM offline, the vLLM server, llama.cpp and its server (the adapter written as a GGUF
adapter here) gives HF's tokens, so does the model with the adapter
merged into its weights (run by vLLM through its own model:), and the same engine without the adapter does not: the
adapter changes the answers, and each engine really applied it. `parity explain` traces HF and vLLM with the adapter
applied, keeps them inside the noise floor with the updates they hold equal, and names three faults planted in HF
copies (scenarios/lora-faults.yaml): rsLoRA's scale, v_proj left unadapted, the adapter applied one layer off."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: lora-tiny
model: tiny-llama
lora: lora-tiny-llama
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm, invariance: [compile]}
  vllm-server: {engine: vllm-server}
  llama.cpp: {engine: llama.cpp, options: {gguf: f32}}
  # the server returns text, not ids: a byte piece the random model emits is read as its EOS (the chat case)
  llama.cpp-server: {engine: llama.cpp-server, options: {gguf: f32}, expect: {tokens: any}}
  merged: {engine: vllm, model: tiny-llama+lora-tiny-llama}
  base: {engine: vllm, lora: none, expect: {tokens: any}}
prompts:
  - {id: story, text: "Once upon a time, in a small village by the sea,"}
  - {id: chat, messages: [{role: user, content: "What is 12 times 7? Answer briefly."}]}
params: {temperature: 0, max_new_tokens: 12, ignore_eos: true}
"""
FAULTS = {"rslora": "scale", "unadapted_v": "unadapted", "shifted_layers": "layer_shift"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("lora")
    return parity("run", str(write_scenario(tmp / "lora.yaml", SCENARIO)), out=tmp / "out")


def test_every_engine_applies_the_adapter_and_matches_hf_and_the_merged_model(run: ParityRun) -> None:
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = run.verdicts.set_index(["engine", "case_id"]).verdict
    for engine in ("vllm", "vllm-server", "llama.cpp", "merged"):
        assert set(verdicts[engine]) == {"match"}, (engine, verdicts[engine].to_dict())
    assert verdicts[("llama.cpp-server", "story")] == "match"
    assert set(verdicts["base"]) == {"diverged"}  # without the adapter the answers are other ones


def test_a_compile_knob_vllm_will_not_turn_with_an_adapter_is_unsupported_not_identical(run: ParityRun) -> None:
    """vLLM's CPU platform compiles no graph for a LoRA configuration: the knob's compiled side ran eager, as its
    run.json says, and the knob reads unsupported with that reason."""
    invariance = pd.read_parquet(run.run_dir / "invariance.parquet").set_index(["engine", "knob"])
    row = invariance.loc[("vllm", "compile")]
    assert row.verdict == "unsupported" and row.expected, row.explanation
    assert "both sides ran with compilation NONE" in row.explanation and "LoRA adapter" in row.explanation
    assert run.meta["engines"]["vllm~enforce_eager=False"]["versions"]["compilation"] == "NONE"


def test_the_run_records_which_engine_applied_which_adapter(run: ParityRun) -> None:
    engines = json.loads((run.run_dir / "run.json").read_text())["engines"]
    for name in ("hf", "vllm", "vllm-server", "llama.cpp", "llama.cpp-server"):
        assert engines[name]["lora"].endswith("lora-tiny-llama"), name
    assert engines["merged"]["lora"] == "" and "tiny-llama+lora-tiny-llama" in engines["merged"]["model_path"]
    assert engines["base"]["lora"] == ""
    server_log = (run.run_dir / "engines" / "vllm-server" / "server.log").read_text()
    assert "lora-tiny-llama" in server_log  # the server registered it under its served name


@pytest.fixture(scope="module")
def explained(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("lora-explain")
    run = parity("explain", str(SCENARIOS / "lora-faults.yaml"), out=tmp / "out")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


def located(run: ParityRun) -> dict[str, dict]:
    return {loc["engine"]: loc for loc in json.loads(
        (run.run_dir / "explain" / "localisation.json").read_text())["localisations"]}


def test_explain_traces_the_adapted_engines_inside_the_floor(explained: ParityRun) -> None:
    clean = located(explained)["vllm"]
    assert clean["cause"] == "none", clean["verdict"]
    assert clean["adapter"]["kind"] == "same", clean["verdict"]  # the updates vLLM holds are PEFT's


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_planted_adapter_fault_is_named(explained: ParityRun, fault: str) -> None:
    found = located(explained)[fault]
    assert found["cause"] == "component", found["verdict"]
    assert found["out_of_floor"]["adapter"] == FAULTS[fault], found["verdict"]
    assert found["out_of_floor"]["layer"] == 0, found["verdict"]
    words = {"rslora": "alpha / sqrt(r) (rsLoRA) where the adapter says alpha / r (r = 8)",
             "unadapted_v": "leaves v_proj unadapted", "shifted_layers": "the adapter applied at the wrong layer"}
    assert words[fault] in found["verdict"], found["verdict"]
