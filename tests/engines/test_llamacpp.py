"""llama.cpp for real: the in-process engine and llama-cpp-python's server on GGUF variants of the bundled SmolLM2
(F32 from HF's own weights, Q8_0 and Q4_K_M from llama.cpp's quantiser, the shipped Q4_1), against HF: token
verdicts, quantisation drift verdicts, per-layer localisation through cb_eval, the server's defects (repeat_penalty
default, EOS not returned, '' token text, explain for an untraced engine), its dialect checked against the live
server, and llama.cpp's sampler chain in params and transplant."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from adapters.engines import llamacpp_gguf
from adapters.engines.gguf_rope import rope_layout
from adapters.engines.llamacpp_server import Engine as LlamaCppServer
from adapters.http import dialect_check
from adapters.http.dialects import DIALECTS
from harness import models
from harness.core.types import EngineSetup
from harness.report import html

from helpers import SCENARIOS, ParityRun, gguf_tensors, parity, write_scenario

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def explained(tmp_path_factory) -> ParityRun:
    """The shipped scenario on one case: run (token and drift verdicts, the server started by the harness), then
    explain (every llama.cpp variant traced against HF, the server scored through its echo)."""
    return parity("explain", str(SCENARIOS / "llamacpp.yaml"), "--case", "story",
                  out=tmp_path_factory.mktemp("llamacpp"))


def _localisations(run: ParityRun) -> dict[str, dict]:
    data = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    return {loc["engine"]: loc for loc in data["localisations"]}


def test_llama_cpp_f32_and_its_server_match_hf_token_for_token(explained: ParityRun) -> None:
    assert explained.code == 0, explained.stdout[-3000:]
    verdicts = explained.verdicts.set_index("engine")
    for engine in ("llama.cpp-f32", "llama.cpp-server"):
        assert verdicts.loc[engine, "verdict"] == "match", verdicts.loc[engine, "explanation"]
        assert verdicts.loc[engine, "max_abs_logprob_delta"] < 1e-3
    results = explained.results.set_index("engine")
    assert list(results.loc["llama.cpp-f32", "token_ids"]) == list(results.loc["hf", "token_ids"])
    engines = explained.meta["engines"]
    assert engines["llama.cpp-f32"]["versions"]["weights"].endswith("all F32")
    assert "Q8_0" in engines["llama.cpp-q8_0"]["versions"]["weights"]
    assert engines["llama.cpp-f32"]["versions"]["llama-cpp-python"] == "0.3.36"


def test_quantised_variants_get_drift_verdicts(explained: ParityRun) -> None:
    drift = pd.read_parquet(explained.run_dir / "drift.parquet").set_index("engine")
    assert set(drift.status) == {"ok"} and drift.expected.all()
    assert drift.loc["llama.cpp-f32", "against"] == "hf" and drift.loc["llama.cpp-f32", "mean_kld"] < 1e-6
    for engine in ("llama.cpp-q8_0", "llama.cpp-q4_k_m"):
        assert drift.loc[engine, "against"] == "llama.cpp-f32"
        assert 1e-4 < drift.loc[engine, "mean_kld"] <= drift.loc[engine, "p99_kld"]  # quantisation is visible
    assert drift.loc["llama.cpp-q8_0", "mean_kld"] < drift.loc["llama.cpp-q4_k_m", "mean_kld"]
    # what each variant really holds: SmolLM2's 576-wide rows take no k-quant, so "q4_k_m" is mostly Q5_0 and Q8_0
    weights = drift.groupby(level=0)["weights"].first()
    assert weights["llama.cpp-q8_0"].startswith("Q8_0 100.0%") and weights["llama.cpp-f32"].startswith("F32 100.0%")
    assert weights["llama.cpp-q4_k_m"].startswith("Q5_0 ") and "Q4_K" in weights["llama.cpp-q4_k_m"]
    assert "tensors fell back (q4_K -> q5_0 and q6_K -> q8_0): their rows are 576 wide, not a multiple of 256" in \
        weights["llama.cpp-q4_k_m"]
    assert weights["llama.cpp-q4_1"].startswith("Q4_1 ")
    assert explained.meta["engines"]["llama.cpp-q4_k_m"]["versions"]["tensor_types"] == weights["llama.cpp-q4_k_m"]
    assert "576 wide" in (explained.run_dir / "summary.md").read_text()
    tokens = pd.read_parquet(explained.run_dir / "drift_tokens.parquet")
    assert len(tokens[tokens.engine == "llama.cpp-q8_0"]) == drift.loc["llama.cpp-q8_0", "tokens"] == 32
    assert "## Quantisation drift" in (explained.run_dir / "summary.md").read_text()
    assert "quantisation drift (llama.cpp's perplexity --kl-divergence measures)" in explained.stdout
    page, _ = html.build(explained.run_dir)
    assert "<h2 id='drift'>" in page and "per-token KLD over all cases, sorted (distribution)" in page


def test_localisation_names_a_layer_for_llama_cpp(explained: ParityRun) -> None:
    located = _localisations(explained)
    f32 = located["llama.cpp-f32"]
    assert f32["cause"] == "none" and "every capture point stays below the threshold (10x the floor" in f32["verdict"]
    assert len(f32["curve"]) == 30  # the residual stream of all 30 layers was captured and compared
    for engine in ("llama.cpp-q8_0", "llama.cpp-q4_k_m"):
        out = located[engine]["out_of_floor"]
        assert located[engine]["cause"] == "component" and out["layer"] == 0 and out["point"] == "layers.0.q"
    points = pd.read_parquet(explained.run_dir / "explain" / "points.parquet")
    f32_points = points[points.engine == "llama.cpp-f32"]
    assert len(f32_points) == 393 and not f32_points.leaves_floor.any()  # q/k un-permuted: within the floor
    server = located["llama.cpp-server"]
    assert server["cause"] == "none" and server["verdict"].startswith("not traced")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One llama-cpp-python server on the F32 GGUF, started by the llama.cpp-server engine itself."""
    setup = EngineSetup(name="fixture", model_path=models.resolve("smollm2-135m", "float32"), dtype="float32",
                        options={"gguf": "f32"}, workdir=tmp_path_factory.mktemp("server"), max_context=256)
    engine = LlamaCppServer(setup)
    yield engine
    process = engine.server
    engine.close()
    assert process.gone()


def test_dialect_matches_the_live_servers_request_schema(server) -> None:
    dialect, http = DIALECTS["llama-cpp-python"], httpx.Client()
    assert dialect_check.check(dialect, server.base_url, {}, http) == []
    wrong = replace(dialect, defaults={**dialect.defaults, "repetition_penalty": 1.0})
    assert dialect_check.check(wrong, server.base_url, {}, http) == [
        "the llama-cpp-python dialect documents repetition_penalty (field repeat_penalty) defaulting to 1.0, the "
        "live server's request schema to 1.1"]
    with pytest.raises(dialect_check.DialectMismatch, match=r"no field for ignore_eos \(sent as ignore_eos\)"):
        dialect_check.check(replace(dialect, extra_fields={**dialect.extra_fields, "ignore_eos": "ignore_eos"}),
                            server.base_url, {}, http)


DEFECTS = """\
model: smollm2-135m
engines:
  hf: {{engine: hf, reference: true}}
  neutral: {{engine: llama.cpp-server, options: {{url: "{url}"}}, invariance: [stream]}}
  server-defaults: {{engine: llama.cpp-server, options: {{url: "{url}", defaults: engine}}, params: {{temperature: 0}},
                    expect: {{tokens: any}}}}
prompts:
  - {{id: capital, text: "The capital of France is"}}
  - {{id: math, messages: [{{role: user, content: "What is 12 times 7? Answer briefly."}}]}}
params: {{temperature: 0, max_new_tokens: 16}}
"""


@pytest.fixture(scope="module")
def defects(server, tmp_path_factory) -> ParityRun:
    """The four defects the generic openai engine showed against llama_cpp.server, on its own engine, attached."""
    tmp = tmp_path_factory.mktemp("defects")
    scenario = write_scenario(tmp / "defects.yaml", DEFECTS.format(url=server.base_url))
    return parity("explain", str(scenario), out=tmp / "reports")


def test_greedy_requests_neutralise_the_servers_repeat_penalty(defects: ParityRun) -> None:
    verdicts = defects.verdicts.set_index(["engine", "case_id"])
    results = defects.results.set_index(["engine", "case_id"])
    assert set(verdicts.loc["neutral"].verdict) == {"match"}, verdicts.loc["neutral"].explanation.tolist()
    assert json.loads(results.loc[("neutral", "capital"), "native_params"])["repeat_penalty"] == 1.0
    left_out = verdicts.loc[("server-defaults", "capital")]  # the server's own 1.1 applies: named, not numerics
    assert left_out.verdict == "diverged"
    assert "server-defaults 1.1 (server default (llama_cpp.server's request model))" in left_out.explanation
    assert "although its own raw logits rank" in left_out.explanation
    assert "sampler or penalty semantics, not numerics" in left_out.explanation


def test_an_eos_the_server_did_not_return_is_not_a_divergence(defects: ParityRun) -> None:
    results = defects.results.set_index(["engine", "case_id"])
    math = results.loc[("neutral", "math")]
    assert math.ended_by == "eos_not_returned" and math.finish_reason == "stop"
    assert 2 not in list(math.token_ids) and list(results.loc[("hf", "math"), "token_ids"])[-1] == 2
    assert defects.verdicts.set_index(["engine", "case_id"]).loc[("neutral", "math")].verdict == "match"


def test_the_stream_knob_runs_on_llama_cpps_server(defects: ParityRun) -> None:
    stream = pd.read_parquet(defects.run_dir / "invariance.parquet").set_index("knob").loc["stream"]
    assert stream.verdict in ("identical", "tokens_identical"), stream.explanation
    text = pd.read_parquet(defects.run_dir / "text.parquet").set_index(["engine", "case_id"])
    assert text.loc[("neutral", "math")].expected, text.loc[("neutral", "math")].explanation


def test_empty_token_text_never_becomes_id_minus_one(defects: ParityRun) -> None:
    steps = pd.read_parquet(defects.run_dir / "steps.parquet")
    ids = np.concatenate([np.asarray(t) for t in steps.top_ids])
    assert (ids >= 0).all()
    served = steps[steps.engine == "neutral"]
    assert any(2 in list(t) for t in served.top_ids)  # '' in a top list: the EOS, mapped
    warnings = defects.results.set_index("engine").loc["neutral"].warnings.explode()
    assert warnings.str.startswith("token text '' taken as the EOS (id 2)").any()


def test_explain_reasons_per_case_for_the_untraced_server(defects: ParityRun) -> None:
    located = {(loc["engine"], loc["case_id"]): loc for loc in json.loads(
        (defects.run_dir / "explain" / "localisation.json").read_text())["localisations"]}
    capital = located[("server-defaults", "capital")]
    assert capital["cause"] == "sampler"
    assert "teacher-forced on the reference's tokens, at step 3 server-defaults ranks '\\n' first" in capital["verdict"]
    assert "given the same tokens it agrees with the reference" in capital["verdict"]
    assert ("server-defaults", "math") in located and ("neutral", "capital") in located  # a line per case
    assert "capital [server-defaults vs hf]: sampler" in defects.stdout


def test_gguf_variants_hold_the_hf_engines_weights(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    folder = models.resolve("smollm2-135m", "float32")
    f32 = gguf_tensors(llamacpp_gguf.ensure(folder, "f32"))
    hf = load_file(str(folder / "model.safetensors"))
    q = hf["model.layers.5.self_attn.q_proj.weight"]
    assert np.array_equal(np.asarray(f32["blk.5.attn_q.weight"].data).reshape(q.shape), rope_layout(q, 9))
    down = hf["model.layers.29.mlp.down_proj.weight"]
    assert np.array_equal(np.asarray(f32["blk.29.ffn_down.weight"].data).reshape(down.shape), down)
    q8 = gguf_tensors(llamacpp_gguf.ensure(folder, "q8_0"))
    assert q8["blk.5.attn_q.weight"].type == "Q8_0"
    run = parity("models", "prepare", "smollm2-135m")
    assert run.code == 0 and "llama.cpp: GGUF variants f32, f16, q8_0, q4_k_m in" in run.stdout


def test_params_and_transplant_cover_llama_cpps_sampler_chain(tmp_path: Path) -> None:
    params = parity("params", str(SCENARIOS / "penalty-semantics.yaml"), "--engines", "hf,llama.cpp")
    assert params.code == 0, params.stderr[-2000:]
    assert "llama.cpp: sampler chain (llama-cpp-python's Llama._init_sampler, names from llama.cpp): " \
           "penalties > greedy" in params.stdout
    assert "| repetition_scope | prompt and output tokens | the last 64 generated tokens | DIFFERS |" in params.stdout
    transplant = parity("transplant", str(SCENARIOS / "penalty-semantics.yaml"), "--case", "list", "--engines",
                        "hf,llama.cpp", out=tmp_path / "reports")
    assert transplant.code == 1, transplant.stderr[-2000:]
    verdict = {v["engine"]: v for v in json.loads(
        (transplant.run_dir / "transplant" / "verdicts.json").read_text())}["llama.cpp"]
    assert verdict["cause"] == "sampler" and verdict["params"] == ["repetition_penalty"]
    assert "hf counts prompt and output tokens, llama.cpp counts the last 64 generated tokens" in verdict["verdict"]


TINY = """\
name: tiny-drift
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  f32: {engine: llama.cpp}
  q8: {engine: llama.cpp, options: {gguf: q8_0}, expect: {tokens: any}, drift: {against: f32, max_mean_kld: 1.0e-12}}
prompts: [{id: chat, messages: [{role: user, content: "Hi there"}]}]
params: {temperature: 0, max_new_tokens: 12, ignore_eos: true}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[ParityRun, Path]:
    """The random 2-layer Llama (2 heads, 1 KV head, head_dim 32) with a drift threshold no quantisation meets."""
    tmp = tmp_path_factory.mktemp("tiny")
    scenario = write_scenario(tmp / "tiny.yaml", TINY)
    return parity("explain", str(scenario), out=tmp / "reports"), scenario


def test_a_drift_beyond_its_threshold_fails_the_run_and_the_gate(tiny, tmp_path: Path) -> None:
    run, scenario = tiny
    assert run.code == 1, run.stdout[-3000:]
    drift = pd.read_parquet(run.run_dir / "drift.parquet").set_index("engine").loc["q8"]
    assert not drift.expected
    assert drift.explanation.startswith("quantisation drift beyond the scenario's thresholds (mean KLD")
    assert run.verdicts.set_index("engine").loc["f32", "verdict"] == "match"
    f32 = _localisations(run)["f32"]  # another head layout (GQA 2:1, head_dim 32) un-permuted correctly
    assert f32["cause"] == "none" and len(f32["curve"]) == 2
    saved = parity("baseline", "save", str(run.run_dir), "--to", str(tmp_path / "baselines"))
    assert saved.code == 0
    gate = parity("gate", str(scenario), "--baseline", str(tmp_path / "baselines"), out=tmp_path / "reports")
    assert gate.code == 1 and "REGRESSION tiny-drift chat [q8]: out of expectation:" in gate.stdout
    assert "quantisation drift beyond the scenario's thresholds" in gate.stdout


@pytest.mark.parametrize("setting", ["on", "off"])
def test_the_server_takes_extra_buffers(tmp_path: Path, setting: str) -> None:
    """llama_cpp.server has no setting for llama.cpp's extra weight buffers; the engine's launcher sets them, as the
    in-process engine does: llama.cpp's own log shows the repacked buffer type considered only when they are on."""
    setup = EngineSetup(name="s", model_path=models.resolve("tiny-llama", "float32"), dtype="float32",
                        options={"gguf": "q4_k_m", "extra_buffers": setting}, workdir=tmp_path, max_context=64)
    engine = LlamaCppServer(setup)
    try:
        assert engine.versions()["extra_buffers"] == setting
    finally:
        engine.close()
    assert ("CPU_REPACK" in (tmp_path / "server.log").read_text()) == (setting == "on")
