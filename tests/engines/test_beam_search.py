"""Beam search through real engines: HF generate, vLLM's LLM.beam_search and the vLLM server (started on 127.0.0.1),
SmolLM2 fp32, on the shipped scenario's case where the engines' rules part them; and HF fp32 vs HF bf16, where only
the numbers do. Each module fixture is one `parity explain` (the run, then every engine's own beam-search loop on
the reference model's numbers) serving many assertions."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

RULES_CASE = "capital[length_penalty=1.0]"
EOS = 2


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> ParityRun:
    return parity("explain", str(SCENARIOS / "beam-search.yaml"), "--case", RULES_CASE,
                  out=tmp_path_factory.mktemp("beams"))


def _beams(run: ParityRun) -> pd.DataFrame:
    return pd.read_parquet(run.run_dir / "beams.parquet")


def _explained(run: ParityRun) -> dict[str, dict]:
    data = json.loads((run.run_dir / "explain" / "beams.json").read_text())
    return {e["engine"]: e for e in data["explanations"]}


def test_every_engine_returns_its_beams_in_rank_order(rules: ParityRun) -> None:
    assert rules.code == 1, rules.stdout[-3000:]  # the engines' beams differ: the scenario expects exact
    beams = _beams(rules)
    assert set(beams.engine) == {"hf", "vllm", "vllm-server"}
    for engine, group in beams.groupby("engine"):
        assert list(group["rank"]) == [0, 1, 2, 3], engine
        for row in group.itertuples():
            assert len(row.logprobs) == len(row.token_ids) and row.cum_logprob == pytest.approx(sum(row.logprobs))
    results = rules.results.set_index("engine")
    for engine in ("hf", "vllm", "vllm-server"):  # results.parquet keeps one row per engine and case: the best beam
        best = beams[(beams.engine == engine) & (beams["rank"] == 0)].iloc[0]
        assert list(results.loc[engine].token_ids) == list(best.token_ids)
    assert not (rules.run_dir / "steps.parquet").exists() or pd.read_parquet(rules.run_dir / "steps.parquet").empty


def test_each_engine_scores_by_its_own_length_rule(rules: ParityRun) -> None:
    """HF divides the cumulative logprob by the generated length with EOS; vLLM by prompt + generated without EOS
    (what the effective params say each engine's code does)."""
    beams = _beams(rules)
    prompt = len(rules.results.prompt_ids.iloc[0])
    for row in beams.itertuples():
        generated = len(row.token_ids)
        length = generated if row.engine == "hf" else prompt + generated - (row.token_ids[-1] == EOS)
        assert row.score == pytest.approx(row.cum_logprob / length, rel=1e-4), (row.engine, row.rank)
    effective = {r.engine: json.loads(r.effective) for r in rules.results.itertuples()}
    assert effective["hf"]["beam_length"] == "generated tokens incl. EOS"
    assert effective["vllm"]["beam_length"] == effective["vllm-server"]["beam_length"] == \
        "prompt + generated tokens excl. EOS"
    assert effective["hf"]["early_stopping"].startswith("false") and effective["hf"]["length_penalty"] == 1.0
    assert effective["vllm"]["early_stopping"].startswith("none")


def test_the_server_and_offline_vllm_return_the_same_beams(rules: ParityRun) -> None:
    beams = _beams(rules).set_index(["engine", "rank"])
    for rank in range(4):
        assert list(beams.loc[("vllm", rank)].token_ids) == list(beams.loc[("vllm-server", rank)].token_ids)
        assert beams.loc[("vllm", rank)].cum_logprob == pytest.approx(beams.loc[("vllm-server", rank)].cum_logprob,
                                                                       abs=1e-3)
    server = rules.results.set_index("engine").loc["vllm-server"]
    body = json.loads(server.native_params)
    assert body["use_beam_search"] is True and body["n"] == 4 and body["length_penalty"] == 1.0


def test_verdicts_name_the_four_facts(rules: ParityRun) -> None:
    verdicts = rules.verdicts.set_index("engine")
    for engine in ("vllm", "vllm-server"):
        row = verdicts.loc[engine]
        assert row.verdict == "diverged" and row.beams_compared == 4
        # the fp32 numbers agree: the shared beams' cumulative logprobs match, their final scores do not
        assert row.max_abs_logprob_delta < 1e-3 and row.max_beam_score_delta > 1e-3 and not row.beam_scores_within
        assert not (row.best_beam_identical and row.beam_set_identical)
        assert "beam_length: hf generated tokens incl. EOS" in row.explanation
    assert "FAIL: beam-search (exit 1)" in rules.stdout


def test_explain_names_the_rules_and_each_loop_reproduces_its_engines_real_beams(rules: ParityRun) -> None:
    """HF's generate, vLLM's offline loop and its server loop, fed the reference model's numbers, return exactly the
    beams each engine returned for real: the loops run as the engines run them."""
    explained = _explained(rules)
    beams = _beams(rules)
    for engine in ("vllm", "vllm-server"):
        e = explained[engine]
        assert e["cause"] == "rules", e["verdict"]
        assert e["reproduces"] == {"hf": True, engine: True}
        for name in ("hf", engine):
            real = [list(b) for b in beams[beams.engine == name].sort_values("rank").token_ids]
            assert e["loops"][name] == real, name
        assert "had as a candidate" in e["verdict"] and "their search settings differ" in e["verdict"]
        assert e["step"] is not None
    assert f"{RULES_CASE} [vllm vs hf]: rules" in rules.stdout
    assert "**rules**" in (rules.run_dir / "explain" / "beams.md").read_text()


NUMERICS = """\
name: beam-numerics
model: smollm2-135m
engines:
  hf: {engine: hf, reference: true}
  hf-bf16: {engine: hf, dtype: bfloat16}
prompts:
  - {id: capital, text: "The capital of France is"}
params: {temperature: 0, max_new_tokens: 16, num_beams: 4}
expect: {tokens: any}
"""


@pytest.fixture(scope="module")
def numerics(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("numerics")
    return parity("explain", str(write_scenario(tmp / "numerics.yaml", NUMERICS)), out=tmp / "reports")


def test_explain_names_numerics_when_both_loops_agree_on_the_same_numbers(numerics: ParityRun) -> None:
    assert numerics.code == 0, numerics.stdout[-3000:]
    verdict = numerics.verdicts.iloc[0]
    assert verdict.verdict == "diverged", verdict.explanation  # bf16's numbers move its beams
    e = _explained(numerics)["hf-bf16"]
    assert e["cause"] == "numerics", e["verdict"]
    assert e["loops"]["hf"] == e["loops"]["hf-bf16"]  # the same loop on the same numbers
    # bf16 moves the beams themselves on an AVX-512 machine; on an AVX2 one (AMD EPYC) only their scores (by 0.166)
    if e["reproduces"]["hf-bf16"]:  # its real beams are hf's: the scores part them
        assert "the engines return the same 4 beams" in e["verdict"] and "differ by up to" in e["verdict"], e
    else:
        assert "differ from the reference model's by up to" in e["verdict"], e["verdict"]
    assert e["reproduces"]["hf"], e
