"""Adapters on the tiny random Llama: HF one-by-one vs batched vs vLLM, param translation and warnings."""

from __future__ import annotations

import json

import pytest

from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

TINY = """\
name: tiny
model: tiny-llama
engines:
  hf: {engine: hf, reference: true, batch_size: 3}
  hf-batched: {engine: hf, options: {batched: true, attn_implementation: eager}}
  vllm: {engine: vllm}
  vllm-frequency: {engine: vllm, params: {frequency_penalty: 0.5}}
  hf-warned: {engine: hf, params: {presence_penalty: 0.4, top_k: 5}}
prompts:
  - "Hello world, this is"
  - {id: chat, messages: [{role: user, content: "Hi there"}]}
  - {id: ids, token_ids: [1, 2, 3, 4, 5, 6]}
params: {max_new_tokens: 12, ignore_eos: true}
grid: {repetition_penalty: [1.0, 1.3]}
expect: {tokens: exact, max_logprob_delta: 0.001}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("tiny")
    return parity("run", str(write_scenario(tmp / "tiny.yaml", TINY)), out=tmp / "reports")


def test_hf_batched_and_vllm_match_hf_on_every_case(tiny: ParityRun) -> None:
    verdicts = tiny.verdicts.set_index(["engine", "case_id"])
    for engine in ("hf-batched", "vllm"):
        assert set(verdicts.loc[engine].verdict) == {"match"}, verdicts.loc[engine].explanation.tolist()
    assert len(tiny.verdicts) == 6 * 4
    results = tiny.results
    assert results.token_ids.map(len).eq(12).all()  # ignore_eos: every case runs to max_new_tokens
    assert set(results.finish_reason) == {"length"}


def test_native_params_show_each_translation(tiny: ParityRun) -> None:
    results = tiny.results.set_index(["engine", "case_id"])
    hf = json.loads(results.loc[("hf", "chat[repetition_penalty=1.3]")].native_params)
    vllm = json.loads(results.loc[("vllm", "chat[repetition_penalty=1.3]")].native_params)
    assert hf["do_sample"] is False and hf["repetition_penalty"] == 1.3
    assert hf["min_new_tokens"] == 12  # HF has no ignore_eos: EOS is forbidden until max_new_tokens instead
    assert vllm["temperature"] == 0.0 and vllm["repetition_penalty"] == 1.3 and vllm["ignore_eos"] is True


def test_engine_only_param_is_sent_and_explained(tiny: ParityRun) -> None:
    results = tiny.results.set_index(["engine", "case_id"])
    native = json.loads(results.loc[("vllm-frequency", "p0[repetition_penalty=1.0]")].native_params)
    assert native["frequency_penalty"] == 0.5
    verdicts = tiny.verdicts[tiny.verdicts.engine == "vllm-frequency"]
    diverged = verdicts[verdicts.verdict == "diverged"]
    assert len(diverged) >= 1
    assert all("frequency_penalty: unset vs 0.5" in text for text in diverged.explanation)
    assert tiny.code == 1


def test_unexpressible_param_is_a_warning_not_silence(tiny: ParityRun) -> None:
    warnings = tiny.results.set_index("engine").loc["hf-warned"].warnings.iloc[0].tolist()
    assert any("presence_penalty=0.4 NOT APPLIED" in w for w in warnings)
    assert any("top_k has no effect" in w for w in warnings)
    assert "presence_penalty=0.4 NOT APPLIED" in tiny.stdout
    assert "presence_penalty=0.4 NOT APPLIED" in (tiny.run_dir / "summary.md").read_text()
    verdicts = tiny.verdicts.set_index(["engine", "case_id"])
    assert set(verdicts.loc["hf-warned"].verdict) == {"match"}  # neither param changes HF's greedy tokens


REUSED = """\
name: reused
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  twin: {engine: hf}
  patched-a: {engine: hf, options: {patch: "adapters.tracing.patches:hf_eager_attention"}, expect: {tokens: any}}
  patched-b: {engine: hf, options: {patch: "adapters.tracing.patches:hf_eager_attention"}, expect: {tokens: any}}
  vllm: {engine: vllm, expect: {tokens: any}}
  vllm-twin: {engine: vllm, options: {prefix_caching: false}, expect: {tokens: any}}
prompts: ["Hello world, this is", "Once upon a time"]
params: {do_sample: true, temperature: 1.0, seed: 7, max_new_tokens: 8, ignore_eos: true}
"""


def test_a_reused_worker_gives_what_a_fresh_one_gives(tmp_path) -> None:
    """One engine at a time: each twin loads in the worker process of the engine of its kind before it, without its
    process start and imports, and samples that engine's tokens from the same seed (vLLM: in another configuration);
    a patched engine may take a worker but no engine loads in one after it, so the second patched engine gets a
    process of its own; each engine keeps its own log."""
    run = parity("run", str(write_scenario(tmp_path / "reused.yaml", REUSED)), "--parallel", "1",
                 out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-2000:] + run.stderr[-2000:]
    engines = {name: json.loads((run.run_dir / "engines" / name / "engine.json").read_text())
               for name in ("hf", "twin", "patched-a", "patched-b", "vllm", "vllm-twin")}
    pids = {name: tuple(engine["worker_pids"]) for name, engine in engines.items()}
    assert pids["hf"] == pids["twin"] and pids["vllm"] == pids["vllm-twin"], pids
    assert len(set(pids.values())) == 3, pids  # patched-a took a worker, patched-b one of its own
    for twin in ("twin", "vllm-twin"):
        assert engines[twin]["phases"]["process_start_s"] == 0.0 and engines[twin]["phases"]["imports_s"] < 0.5
        assert (run.run_dir / "engines" / twin / "worker.log").exists()
    verdicts = run.verdicts.set_index(["engine", "case_id"])
    assert set(verdicts.loc["twin"].verdict) == {"match"}, verdicts.loc["twin"].explanation.tolist()
    tokens = run.results.set_index(["engine", "case_id"]).token_ids
    assert all(list(tokens.loc[("vllm", case)]) == list(tokens.loc[("vllm-twin", case)])
               for case in run.results.case_id.unique())
