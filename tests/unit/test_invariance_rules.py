"""Invariance verdicts on hand-built pairs (no engines): identical, tokens identical with drift, a near-tie flip vs
a real difference, the G-test for sampled knobs, and negative controls."""

from __future__ import annotations

import random
from pathlib import Path

from harness.compare.invariance_rules import InvarianceRow, KnobNoise, control_expected, judge_pair, judge_samples
from harness.core.types import Result
from harness.plan.invariance_checks import _config_name
from harness.scenario.spec import load
from harness.verdicts.invariance import _expected

from helpers import write_scenario


def result(case: str, ids: list[int], chosen: list[float], tops: list[list[int]], lps: list[list[float]],
           samples: list[list[int]] | None = None) -> Result:
    return Result(case_id=case, engine="e", status="ok", prompt_ids=[1], token_ids=ids, chosen_logprobs=chosen,
                  top_ids=tops, top_logprobs=lps, samples=samples or [])


BASE = [result("a", [5, 6, 7], [-0.1, -0.7, -0.2], [[5, 9], [6, 8], [7, 3]],
               [[-0.1, -3], [-0.7, -0.7008], [-0.2, -3]]),
        result("b", [4, 4], [-0.3, -0.4], [[4, 2], [4, 2]], [[-0.3, -2], [-0.4, -2]])]


def test_bitwise_equal_is_identical() -> None:
    verdict = judge_pair(BASE, [r.model_copy() for r in BASE], str)
    assert verdict["verdict"] == "identical" and verdict["max_abs_logprob_delta"] == 0.0


def test_equal_tokens_with_moved_logprobs_is_tokens_identical_with_the_drift() -> None:
    moved = [r.model_copy(update={"chosen_logprobs": [v - 1e-5 for v in r.chosen_logprobs]}) for r in BASE]
    verdict = judge_pair(BASE, moved, str)
    assert verdict["verdict"] == "tokens_identical" and abs(verdict["max_abs_logprob_delta"] - 1e-5) < 1e-12


def test_a_flip_within_the_drift_is_a_near_tie_and_beyond_it_a_real_difference() -> None:
    flipped = result("a", [5, 8, 7], [-0.1005, -0.703, -0.2], [[5, 9], [8, 6], [7, 3]],
                     [[-0.1005, -3], [-0.703, -0.704], [-0.2, -3]])
    repeat = KnobNoise((0.0005, 0.0005, "its repeat knob's drift"))  # the engine's own noise, apart from the knob
    near = judge_pair(BASE, [flipped, BASE[1]], str, repeat)
    assert near["verdict"] == "diverged" and near["first_divergence"] == 1 and near["case_id"] == "a"
    assert near["near_tie"] and "a near-tie flip" in near["explanation"]  # margin 0.0008 within 2 x 0.0005
    far = result("b", [4, 2], [-0.3, -2.0], [[4, 2], [2, 4]], [[-0.3, -2], [-2.0, -2.1]])
    real = judge_pair(BASE, [BASE[0], far], str, repeat)
    assert real["verdict"] == "diverged" and "a real difference" in real["explanation"]


def test_a_variants_own_drift_never_widens_its_near_tie_band() -> None:
    """A prefix cache reading a stale block moves every logprob: its drift (0.8 nats here) must not excuse its
    flips; without noise measured apart from the knob only exact ties are near-ties."""
    stale = [r.model_copy(update={"chosen_logprobs": [v - 0.8 for v in r.chosen_logprobs]}) for r in BASE]
    flipped = result("a", [5, 8, 7], [-0.9, -0.703, -0.2], [[5, 9], [8, 6], [7, 3]],
                     [[-0.9, -3], [-0.703, -0.704], [-0.2, -3]])
    unmeasured = judge_pair(BASE, [flipped, stale[1]], str)
    assert unmeasured["verdict"] == "diverged" and "a real difference" in unmeasured["explanation"]
    assert "no noise measured apart from the knob" in unmeasured["explanation"]
    repeat = judge_pair(BASE, [flipped, stale[1]], str, KnobNoise((0.0005, 0.0005, "its repeat knob's drift")))
    assert "a real difference" in repeat["explanation"] and "but the variant drifts by 0.8" in repeat["explanation"]
def test_a_real_difference_is_never_passed_for_the_words_in_its_explanation() -> None:
    """The explanation holds the case id: a prompt named with the words "near-tie" must not pass a divergence."""
    named = [BASE[0], BASE[1].model_copy(update={"case_id": "near-tie-prompt"})]
    far = result("near-tie-prompt", [4, 2], [-0.3, -2.0], [[4, 2], [2, 4]], [[-0.3, -2], [-2.0, -2.1]])
    fields = judge_pair(named, [BASE[0], far], str)
    assert "near-tie" in fields["explanation"] and "a real difference" in fields["explanation"]
    row = InvarianceRow(engine="e", knob="batch", baseline="", variant="", **fields)
    assert row.near_tie is False and not _expected(row, [])


def test_sampled_knobs_compare_distributions() -> None:
    rng = random.Random(0)
    draw = lambda weights: [[rng.choices([5, 6, 7], weights)[0]] for _ in range(600)]  # noqa: E731
    same = judge_samples([result("a", [5], [], [], [], draw([5, 3, 2]))],
                         [result("a", [5], [], [], [], draw([5, 3, 2]))], 1, 0.01)
    assert same["verdict"] == "distribution_match"
    moved = judge_samples([result("a", [5], [], [], [], draw([5, 3, 2]))],
                          [result("a", [5], [], [], [], draw([2, 3, 5]))], 1, 0.01)
    assert moved["verdict"] == "distribution_diverged" and "smallest p=" in moved["explanation"]


def test_a_sampled_knob_whose_prefixes_are_all_rare_is_undetermined_and_fails() -> None:
    """Long prefixes of few samples: every one drawn once, pooled into one column; a p-value of 1 would pass it."""
    spread = [result("a", [5], [], [], [], [[i, i] for i in range(50)])]
    moved = [result("a", [5], [], [], [], [[i, 50 + i] for i in range(50)])]
    verdict = judge_samples(spread, moved, 2, 0.01)
    assert verdict["verdict"] == "distribution_undetermined" and "1 case(s) undetermined, first a" in \
        verdict["explanation"]
    row = InvarianceRow(engine="e", knob="speculative", baseline="", variant="", **verdict)
    assert not _expected(row, [])
    # beside a case the test decides, the undetermined one decides nothing and is named
    rng = random.Random(0)
    draws = [[rng.choices([5, 6], [3, 1])[0], 7] for _ in range(50)]  # two common prefixes: a test decides
    both = judge_samples([*spread, result("b", [5], [], [], [], draws)],
                         [*moved, result("b", [5], [], [], [], draws[::-1])], 2, 0.01)
    assert both["verdict"] == "distribution_match" and both["case_id"] == "b", both["explanation"]
    assert "1 case(s) undetermined, first a: undetermined (100 prefixes" in both["explanation"]


def test_expectations_controls_and_identical_knobs() -> None:
    row = InvarianceRow(engine="e", knob="batch", baseline="", variant="", verdict="tokens_identical")
    assert _expected(row, []) and not _expected(row, ["batch"])
    assert not _expected(row.model_copy(update={"verdict": "diverged", "near_tie": False}), [])
    assert _expected(row.model_copy(update={"verdict": "diverged", "near_tie": True}), [])
    assert not _expected(row.model_copy(update={"verdict": "text_diverged"}), [])  # the client reads another answer
    control = row.model_copy(update={"knob": "control", "control": True})
    assert not _expected(control, []) and control_expected("diverged") and not control_expected("identical")


def test_configuration_names_and_per_engine_knobs(tmp_path: Path) -> None:
    assert _config_name("vllm", {}) == "vllm"
    assert _config_name("vllm", {"speculative": {"method": "ngram"}}) == "vllm~speculative=ngram"
    scenario = load(write_scenario(tmp_path / "s.yaml", """\
model: tiny-llama
engines:
  a: {engine: hf, reference: true, invariance: [batch]}
  b: {engine: vllm}
  c: {engine: vllm}
prompts: ["x"]
invariance: {knobs: [repeat, order], engines: [b], identical: [repeat]}
"""))
    assert [scenario.spec.invariance_knobs(n) for n in "abc"] == [["batch"], ["repeat", "order"], []]


def test_a_baseline_that_repeats_the_comparisons_calls_is_judged_on_its_results(tmp_path: Path) -> None:
    from harness.plan import invariance_checks
    from harness.plan.requests import plan_engines

    scenario = load(write_scenario(tmp_path / "s.yaml", """\
model: tiny-llama
engines:
  a: {engine: hf, reference: true, invariance: [repeat, order, batch, prefix_cache]}
  b: {engine: vllm, invariance: [repeat, prefix_cache]}
prompts: ["x", "y", "z"]
params: {temperature: 0, max_new_tokens: 4}
"""))
    scenario = scenario.with_resolved(resolve=lambda *_: tmp_path)
    ids = {c.prompt.id: [1, 2 + i] for i, c in enumerate(scenario.cases)}
    base = plan_engines(scenario, tmp_path, ids)
    plans, checks = invariance_checks.plan(scenario, base, tmp_path, [7, 7, 7])
    sides = {(c.engine, c.knob): c for c in checks if not c.unsupported}
    cases = [r.case_id for r in base[0].requests]
    # repeat, order and the control send the cases in one call, as the comparison does: the comparison's results
    for knob in ("repeat", "order", "control"):
        check = sides[("a", knob)]
        assert [r.case_id for r in check.baseline.requests] == cases and not check.baseline.groups
        assert {r.case_id.split("#")[1] for r in check.variant.requests} == {f"{knob}.variant"}
    # one case per call, a shared prefix, another configuration: sent as planned
    assert sides[("a", "batch")].baseline.requests[0].case_id == f"{cases[0]}#batch.base"
    assert sides[("b", "prefix_cache")].baseline.requests[0].case_id == f"{cases[0]}#prefix_cache.base"
    sent = {p.name: [r.case_id for r in p.requests] for p in plans}
    assert not [c for c in sent["a"] if c.endswith(("repeat.base", "order.base", "control.base"))]
    assert f"{cases[0]}#repeat.variant" in sent["a"] and f"{cases[0]}#batch.base" in sent["a"]
    assert sent["b~prefix_caching=False"][0] == f"{cases[0]}#prefix_cache.base"


def test_a_sampled_baseline_that_drew_below_its_top_1_is_never_a_near_tie() -> None:
    # The baseline sampled token 9 (its second choice); the variant, with another seed, drew the top-1 token 5. The
    # gap is measured from the token the baseline chose, so this is a real difference even with no drift at all.
    drawn = result("a", [9], [-3.0], [[5, 9]], [[-0.1, -3.0]])
    top = result("a", [5], [-0.1], [[5, 9]], [[-0.1, -3.0]])
    verdict = judge_pair([drawn], [top], str)
    assert verdict["verdict"] == "diverged" and "a real difference" in verdict["explanation"]
    assert "2.9 nats above the token it drew" in verdict["explanation"]


def test_a_warning_only_the_variant_carries_is_named_as_a_likely_cause() -> None:
    dropped = "min_p=0.1 NOT APPLIED: vLLM ignores min_p when speculative decoding is on"
    variant = [r.model_copy(update={"warnings": [dropped]}) for r in BASE]
    verdict = judge_pair(BASE, variant, str)
    assert verdict["verdict"] == "identical" and verdict["explanation"].endswith(f"only the variant warns: {dropped}")
    rng = random.Random(1)
    draws = [[rng.choice([5, 6])] for _ in range(200)]
    sampled = judge_samples([result("a", [5], [], [], [], draws)],
                            [result("a", [5], [], [], [], draws).model_copy(update={"warnings": [dropped]})], 1, 0.01)
    assert sampled["explanation"].endswith(f"only the variant warns: {dropped}")


def test_vllm_drops_min_p_under_speculative_decoding_and_says_so() -> None:
    from adapters.engines.vllm_offline import NGRAM, speculative_not_applied
    from harness.scenario.spec import SamplingParams

    sampled = SamplingParams(temperature=1.0, min_p=0.1)
    assert speculative_not_applied(sampled, NGRAM) == [
        "min_p=0.1 NOT APPLIED: vLLM ignores min_p when speculative decoding is on"]
    assert speculative_not_applied(sampled, None) == []
    assert speculative_not_applied(SamplingParams(temperature=0, min_p=0.1), NGRAM) == []  # greedy: min_p moot


def test_a_knob_side_the_scenario_already_configures_runs_on_the_engines_own_configuration(tmp_path: Path) -> None:
    """vLLM with prefix caching and chunked prefill already off: both knobs' baselines are that configuration, so
    they share the engine's load (and its results) instead of loading the same engine twice more."""
    from harness.plan import invariance_checks
    from harness.plan.requests import plan_engines

    scenario = load(write_scenario(tmp_path / "s.yaml", """\
model: tiny-llama
engines:
  a: {engine: hf, reference: true}
  b: {engine: vllm, options: {prefix_caching: false, chunked_prefill: false},
      invariance: [prefix_cache, chunked_prefill]}
prompts: ["x", "y"]
params: {temperature: 0, max_new_tokens: 4}
"""))
    scenario = scenario.with_resolved(resolve=lambda *_: tmp_path)
    ids = {c.prompt.id: [1, 2 + i] for i, c in enumerate(scenario.cases)}
    base = plan_engines(scenario, tmp_path, ids)
    plans, checks = invariance_checks.plan(scenario, base, tmp_path, [7, 7, 7])
    sides = {c.knob: c for c in checks if not c.unsupported}
    assert sides["prefix_cache"].baseline.config == sides["chunked_prefill"].baseline.config == "b"
    assert sides["prefix_cache"].variant.config == "b~prefix_caching=True"
    assert sorted(p.name for p in plans) == ["a", "b", "b~chunked_prefill=True,max_num_batched_tokens=32",
                                             "b~prefix_caching=True"]


def test_a_cases_measured_rounding_noise_makes_its_band() -> None:
    """Where the run's noise pass measured a case (the reference against itself in higher precision), that noise is
    the case's band: a bfloat16 batching flip within it is a near-tie even where the engine repeats bitwise."""
    flipped = result("a", [5, 8, 7], [-0.1005, -0.703, -0.2], [[5, 9], [8, 6], [7, 3]],
                     [[-0.1005, -3], [-0.703, -0.704], [-0.2, -3]])
    bitwise = KnobNoise((0.0, 0.0, "its repeat knob's drift"))
    assert "a real difference" in judge_pair(BASE, [flipped, BASE[1]], str, bitwise)["explanation"]
    measured = KnobNoise(bitwise.default, {"a": (0.3, 0.1, "the reference's own rounding noise on this case")})
    near = judge_pair(BASE, [flipped, BASE[1]], str, measured)
    assert near["near_tie"] and "the reference's own rounding noise on this case" in near["explanation"]
