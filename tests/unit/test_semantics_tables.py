"""Effective-params tables and the sampling-parity statistics (a G-test with nothing left to compare is undetermined),
on hand-built values (no engines)."""

from __future__ import annotations

from collections import Counter

import pytest

from harness.compare.sampling_parity import END, described, g_test, judge_samples, prefixes
from harness.core.types import Effective, Result, Setting
from harness.scenario.spec import load
from harness.semantics.effective import describe_differences, differing_fields, table_rows

from helpers import write_scenario


def effective(**kwargs) -> Effective:
    return Effective(**{"decoding": "greedy", "repetition_penalty": 1.0, **kwargs})


def test_greedy_engines_do_not_differ_on_truncation_or_temperature() -> None:
    by_engine = {"a": effective(temperature=0.7, top_k=50), "b": effective(temperature=1.0)}
    assert differing_fields(by_engine) == []


def test_an_engine_without_a_penalty_knob_counts_as_neutral() -> None:
    by_engine = {"a": effective(frequency_penalty=0.0), "b": effective()}
    assert "frequency_penalty" not in differing_fields(by_engine)
    penalised = {"a": effective(repetition_penalty=1.1, sources={"repetition_penalty": "generation_config.json"}),
                 "b": effective()}
    assert describe_differences(penalised) == "repetition_penalty: a 1.1 (generation_config.json), b 1"


def test_a_setting_one_engine_applies_and_another_cannot_is_a_difference_named_by_file_and_key() -> None:
    source = "generation_config.json: suppress_tokens"
    by_engine = {"hf": effective(extra={"suppress_tokens": Setting(value=3, applied="yes", source=source)}),
                 "vllm": effective(extra={"suppress_tokens": Setting(value=3, applied="no", source=source)}),
                 "server": effective(extra={"suppress_tokens": Setting(value=3, applied="unknown",
                                                                       source=source)})}
    assert differing_fields(by_engine) == ["suppress_tokens"]
    assert describe_differences(by_engine) == (
        "suppress_tokens (generation_config.json: suppress_tokens): hf applies 3, vllm not applied, "
        "server unknown (the server decides)")
    rows = {row[0]: row for row in table_rows(by_engine, everything=False)}
    label = f"suppress_tokens ({source})"
    assert rows[label][1] == ["applies 3", "not applied", "unknown (the server decides)"] and rows[label][2]


def test_a_canonical_param_one_engine_takes_from_the_models_file_and_another_lacks_is_a_difference() -> None:
    by_engine = {"hf": effective(no_repeat_ngram_size=3, sources={"no_repeat_ngram_size": "generation_config.json"}),
                 "vllm": effective()}
    assert differing_fields(by_engine) == ["no_repeat_ngram_size"]
    assert describe_differences(by_engine) == "no_repeat_ngram_size: hf 3 (generation_config.json), vllm n/a"


def test_settings_every_engine_treats_alike_are_still_shown() -> None:
    same = Setting(value=[2], applied="yes", source="generation_config.json: eos_token_id")
    by_engine = {"a": effective(extra={"eos_token_id": same}), "b": effective(extra={"eos_token_id": same})}
    rows = {row[0]: row for row in table_rows(by_engine, everything=False)}
    assert rows["eos_token_id (generation_config.json: eos_token_id)"] == (
        "eos_token_id (generation_config.json: eos_token_id)", ["applies 2", "applies 2"], False)


def test_rejected_engines_show_their_reason() -> None:
    rows = table_rows({"a": effective(), "b": Effective.refused("b", "temperature too high")}, everything=False)
    assert rows[-1] == ("rejected", ["-", "rejected by b: temperature too high"], True)


def test_prefixes_pad_ended_samples() -> None:
    assert prefixes([[5, 6], [5], [7, 8, 9]], 2) == Counter({(5, 6): 1, (5, END): 1, (7, 8): 1})


def test_g_test_agrees_on_the_same_distribution_and_pools_rare_categories() -> None:
    same = g_test(Counter({(1,): 500, (2,): 300, (3,): 200}), Counter({(1,): 510, (2,): 290, (3,): 200}))
    assert same["p"] > 0.5 and same["dof"] == 2
    moved = g_test(Counter({(1,): 500, (2,): 500}), Counter({(1,): 600, (2,): 400}))
    assert moved["p"] < 1e-4 and moved["worst"] in ((1,), (2,))
    rare = g_test(Counter({(1,): 990, (2,): 2, (3,): 1}), Counter({(1,): 985, (2,): 3, (4,): 2}))
    assert rare["categories"] == 2  # (1,) and the pooled rare prefixes


@pytest.mark.parametrize("counts", [Counter({(1,): 10}), Counter()])
def test_g_test_with_one_category_is_no_evidence(counts) -> None:
    assert g_test(counts or Counter({(1,): 3}), Counter({(1,): 10}))["p"] == 1.0


SAMPLED = """\
model: tiny-llama
engines:
  ref: {engine: hf, reference: true}
  other: {engine: vllm}
prompts: [{id: a, text: "x"}]
params: {do_sample: true, temperature: 1.0, seed: 1}
sampling: {samples: 60, steps: 2, alpha: 0.01}
"""


def test_a_g_test_whose_prefixes_all_pool_into_one_is_undetermined_never_a_match(tmp_path) -> None:
    """60 samples a side, every two-token prefix drawn once: pooling leaves one column, and a p-value of 1 there
    would call any two distributions the same."""
    spread = Counter({(i, i): 1 for i in range(60)})
    undetermined = g_test(spread, Counter({(i, 100 + i): 1 for i in range(60)}))
    assert undetermined["p"] is None and "undetermined (120 prefixes" in described(undetermined)

    scenario = load(write_scenario(tmp_path / "s.yaml", SAMPLED))
    first = [[7, i] for i in range(60)]  # the first token always 7: that test is decided; the second never repeats
    results = {(name, "a"): Result(case_id="a", engine=name, status="ok", samples=[[s[0], s[1] + shift] for s in first])
               for name, shift in (("ref", 0), ("other", 100))}
    row = judge_samples(scenario, results, str).iloc[0]
    assert row.verdict == "undetermined" and not row.expected, row.explanation
    assert row.explanation.startswith("sampling distributions undetermined in the first 2 token(s) (60 vs 60 samples)")
    assert "first 1 token(s): G=0, dof 0, p=1; first 2 token(s): undetermined (120 prefixes" in row.explanation
