"""Verdict rules on hand-built results (no engines): how a generation ended, the measured tie margin, the shared
"emitted token is not the engine's own top-1" check, the silent-wrong-token hazard, expectations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.compare.ending import Ending, as_compared, read_ending
from harness.compare.own_top1 import off_top1, top_probability
from harness.compare.tie_noise import CaseNoise, LayerCheck, TieEvidence
from harness.compare.token_rules import COLUMNS, Verdict, judge
from harness.core.prompt_notes import CHAT_TEMPLATE, TOKENIZER, prompt_ids_unknown
from harness.core.types import Result
from harness.core.vocabulary import SamplingParams
from harness.scenario.spec import load

from helpers import write_scenario

EOS = 2
SCENARIO = """\
model: tiny-llama
engines:
  ref: {engine: hf, reference: true}
  other: {engine: hf, params: PARAMS, expect: {tokens: EXPECT}}
prompts: [{id: a, text: "x"}]
params: {temperature: 0, max_new_tokens: 4}
"""
WORDS = {1: "<s>", 2: "</s>", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def ended_by(answer: Result, params: SamplingParams, eos_ids: set[int]) -> str:
    return read_ending(answer, params, eos_ids, None).how


def decode(token: int) -> str:
    return WORDS.get(int(token), f"#{token}")


def result(engine: str, ids: list[int], chosen: list[float], tops: list[list[int]], top_lps: list[list[float]],
           finish: str = "length", status: str = "ok") -> Result:
    return Result(case_id="a", engine=engine, status=status, prompt_ids=[1], token_ids=ids, chosen_logprobs=chosen,
                  top_ids=tops, top_logprobs=top_lps, finish_reason=finish)


def scenario(tmp_path: Path, params: str = "{}", expect: str = "exact"):
    return load(write_scenario(tmp_path / "s.yaml", SCENARIO.replace("PARAMS", params).replace("EXPECT", expect)))


def verdict(tmp_path: Path, ref: Result, other: Result, ties: TieEvidence | None = None, **kwargs) -> Verdict:
    frame = judge(scenario(tmp_path, **kwargs), {("ref", "a"): ref, ("other", "a"): other}, decode, ties)
    assert list(frame.columns) == COLUMNS
    row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in frame.iloc[0].to_dict().items()}
    return Verdict.model_validate(row)


REF = result("ref", [5, 6, EOS], [-0.1, -0.5, -0.2], [[5, 9], [6, 8], [EOS, 7]], [[-0.1, -3], [-0.5, -1.5], [-0.2, -3]],
             finish="stop")


def test_an_eos_the_engine_did_not_return_is_not_a_divergence(tmp_path: Path) -> None:
    params = SamplingParams(temperature=0, max_new_tokens=4)
    dropped = result("other", [5, 6], [-0.1, -0.5], [[5, 9], [6, 8]], [[-0.1, -3], [-0.5, -1.5]], finish="stop")
    assert ended_by(REF, params, {EOS}) == "eos"
    assert ended_by(dropped, params, {EOS}) == "eos_not_returned"
    compared = as_compared(dropped, "eos_not_returned", EOS)
    assert compared.token_ids == [5, 6, EOS] and math.isnan(compared.chosen_logprobs[-1])
    row = verdict(tmp_path, REF, compared)
    assert row.verdict == "match" and row.max_abs_logprob_delta == 0.0
    # without the normalisation the same answer diverges at the last step
    assert verdict(tmp_path, REF, dropped).verdict == "diverged"


def test_how_a_generation_ended() -> None:
    params = SamplingParams(temperature=0, max_new_tokens=2, stop=["six"])
    full = result("x", [5, 6], [-0.1, -0.5], [[5], [6]], [[-0.1], [-0.5]], finish="length")
    assert ended_by(full, params, {EOS}) == "length"
    stopped = full.model_copy(update={"text": "five six", "finish_reason": "stop", "token_ids": [5]})
    assert ended_by(stopped, params, {EOS}) == "stop_string"
    ignoring = SamplingParams(max_new_tokens=3, ignore_eos=True)
    assert ended_by(REF, ignoring, {EOS}) == "length"
    assert ended_by(result("x", [], [], [], [], status="error"), params, {EOS}) == ""


def test_runner_up_within_the_measured_noise_is_a_benign_tie(tmp_path: Path) -> None:
    ref = result("ref", [5, 6, 7], [-0.1, -0.70, -0.2], [[5, 9], [6, 8], [7, 3]], [[-0.1, -3], [-0.70, -0.72],
                                                                                   [-0.2, -3]])
    tie = result("other", [5, 8, 7], [-0.09, -0.71, -0.2], [[5, 9], [8, 6], [7, 3]], [[-0.09, -3], [-0.71, -0.715],
                                                                                        [-0.2, -3]])
    noise = TieEvidence(noise={"a": CaseNoise(0.011, 0.01, 3, "bfloat16", "float32")})
    row = verdict(tmp_path, ref, tie, noise, expect="benign_ties")
    assert row.verdict == "benign_tie" and row.expected  # margin 0.02 <= 2 x 0.011, the reference's own noise
    assert ("near-tie: reference top-2 margin 0.02 <= tie margin 0.022 nats (twice the reference's own rounding "
            "noise on this case: its top-k margins move by up to 0.011 nats between bfloat16 and float32") in \
        row.explanation
    assert verdict(tmp_path, ref, tie, noise, expect="exact").expected is False
    # without measured noise only exact ties are near-ties, and the pair's own drift (0.01) widens nothing
    alone = verdict(tmp_path, ref, tie, expect="benign_ties")
    assert alone.verdict == "diverged" and "not a near-tie: the margin is beyond the tie margin 0 nats" in \
        alone.explanation


def test_a_near_tie_the_layer_check_or_the_drift_rules_out_is_a_divergence(tmp_path: Path) -> None:
    """A margin within the measured noise is not enough: a pair drifting beyond twice the reference's own chosen-token
    noise is another computation (a model without its adapter), and a component out of its floor is a fault."""
    ref = result("ref", [5, 6, 7], [-0.1, -0.70, -0.2], [[5, 9], [6, 8], [7, 3]], [[-0.1, -3], [-0.70, -0.72],
                                                                                   [-0.2, -3]])
    drifting = result("other", [5, 8, 7], [-0.6, -0.71, -0.2], [[5, 9], [8, 6], [7, 3]],
                      [[-0.6, -3], [-0.71, -0.715], [-0.2, -3]])
    noise = {"a": CaseNoise(0.011, 0.01, 3, "bfloat16", "float32")}
    row = verdict(tmp_path, ref, drifting, TieEvidence(noise=noise), expect="benign_ties")
    assert row.verdict == "diverged" and "drift apart by 0.5 nats on the steps they share, beyond 0.02" in \
        row.explanation
    close = drifting.model_copy(update={"chosen_logprobs": [-0.09, -0.71, -0.2]})
    faulty = TieEvidence(noise=noise, layers={("other", "a"): LayerCheck(
        clean=False, point="layers.15.mlp", component="MLP", ratio=2.9, k=2.0, sensitivity=0.03)})
    row = verdict(tmp_path, ref, close, faulty, expect="benign_ties")
    assert row.verdict == "diverged" and "not a near-tie: layer 15 mlp leaves its noise floor at 2.9x it (threshold " \
        "2x; MLP)" in row.explanation
    clean = TieEvidence(noise=noise, layers={("other", "a"): LayerCheck(clean=True, k=2.0, sensitivity=0.031)})
    row = verdict(tmp_path, ref, close, clean, expect="benign_ties")
    assert row.verdict == "benign_tie" and "no component leaves its noise floor, none above 3.1%" in row.explanation


def test_a_three_way_tie_names_the_rank_the_engines_token_had(tmp_path: Path) -> None:
    ref = result("ref", [5, 6, 7], [-0.1, -1.0, -0.2], [[5, 9, 3], [6, 8, 9], [7, 3, 4]],
                 [[-0.1, -3, -4], [-1.0, -1.0, -1.0], [-0.2, -3, -4]])
    third = result("other", [5, 9, 7], [-0.09, -0.9, -0.2], [[5, 9, 3], [9, 6, 8], [7, 3, 4]],
                   [[-0.09, -3, -4], [-0.9, -1.0, -1.1], [-0.2, -3, -4]])
    row = verdict(tmp_path, ref, third, TieEvidence(noise={"a": CaseNoise(0.01, 0.1, 3, "bfloat16", "float32")}),
                  expect="benign_ties")
    assert row.verdict == "benign_tie" and row.expected
    assert "(other's token, the reference's #3, ties with its runner-up)" in row.explanation


def test_a_greedy_token_that_is_not_the_engines_own_top1_names_sampler_semantics(tmp_path: Path) -> None:
    # the other engine's own raw logits rank 'six' first, yet it emitted 'eight': chosen after the logits
    other = result("other", [5, 8, EOS], [-0.1, -1.5, -0.2], [[5, 9], [6, 8], [EOS, 7]],
                   [[-0.1, -3], [-0.5, -1.5], [-0.2, -3]], finish="stop")
    row = verdict(tmp_path, REF, other, params="{repetition_penalty: 1.3}")
    assert row.verdict == "diverged" and row.first_divergence == 1
    assert "other emitted 'eight' although its own raw logits rank 'six' first (1 nats higher)" in row.explanation
    assert "sampler or penalty semantics, not numerics" in row.explanation
    assert "repetition_penalty: unset vs 1.3" in row.explanation


def test_a_near_certain_token_not_emitted_is_a_silent_wrong_token_hazard(tmp_path: Path) -> None:
    """fp16 logits / temperature 3e-4 on CUDA: lmdeploy's kernel returned its first candidate (',') where its own
    distribution puts '.' at probability ~1. It fails the case even where any tokens are accepted."""
    params = "{do_sample: true, temperature: 0.0003, seed: 0}"
    ref = result("ref", [5, 6], [-0.1, -0.5], [[5, 9], [6, 8]], [[-0.1, -3], [-0.5, -1.78]])
    other = result("other", [5, 8], [-0.1, -1.78], [[5, 9], [6, 8]], [[-0.1, -3], [-0.5, -1.78]])
    row = verdict(tmp_path, ref, other, params=params, expect="any")
    assert row.verdict == "hazard" and not row.expected
    assert row.explanation.startswith("hazard: silent wrong token: at step 1 other's own raw logprobs put 'six' first")
    # at temperature 1 the same step is an ordinary sample, not a hazard
    assert verdict(tmp_path, ref, other, params="{do_sample: true, temperature: 1.0, seed: 0}",
                   expect="any").verdict == "diverged"


def test_top_probability_after_temperature_is_a_lower_bound() -> None:
    import numpy as np

    top = np.array([[-0.5, -1.78, -4.0]])
    assert top_probability(top, 3e-4)[0] > 1 - 1e-12
    assert top_probability(top, 1.0)[0] < 0.8
    found = off_top1(result("x", [8], [-1.78], [[6, 8]], [[-0.5, -1.78]]), None)
    assert len(found) == 1 and found[0].certain and found[0].top1 == 6 and found[0].emitted == 8


def test_engine_errors_are_verdicts_with_the_error(tmp_path: Path) -> None:
    failed = Result.engine_error("a", "other", "engine error: worker killed by signal 9 (SIGKILL)")
    row = verdict(tmp_path, REF, failed)
    assert row.verdict == "engine_error" and not row.expected and "SIGKILL" in row.explanation


@pytest.mark.parametrize("expect, ok", [("exact", False), ("any", True)])
def test_expectations(tmp_path: Path, expect: str, ok: bool) -> None:
    other = result("other", [5, 7, EOS], [-0.1, -2.0, -0.2], [[5, 9], [7, 6], [EOS, 7]], [[-0.1, -3], [-2.0, -2.1],
                                                                                          [-0.2, -3]])
    assert verdict(tmp_path, REF, other, expect=expect).expected is ok


@pytest.mark.parametrize("made_by, named, unnamed", [
    (TOKENIZER, "its own tokenizer and BOS rule", "chat template"),
    (CHAT_TEMPLATE, "its own chat template and BOS rule", "tokenizer"),
])
def test_a_first_step_divergence_on_a_self_tokenised_prompt_leads_with_the_prompt(
        tmp_path: Path, made_by: str, named: str, unnamed: str) -> None:
    """A server that tokenised the prompt itself and returned no ids parts from the reference at step 0: the prompt
    is the likely cause and is said first, naming only what made the ids; the param differences follow as `also`."""
    server = result("other", [9, 6, EOS], [-0.2, -0.5, -0.2], [[9, 5], [6, 8], [EOS, 7]],
                    [[-0.2, -2.0], [-0.5, -1.5], [-0.2, -3]], finish="stop")
    server = server.model_copy(update={"warnings": [prompt_ids_unknown(made_by)]})
    found = verdict(tmp_path, REF, server, params="{repetition_penalty: 1.1}")
    assert found.verdict == "diverged" and found.first_divergence == 0
    reading = found.explanation.split("; ", 1)[1]
    assert reading.startswith(f"most likely a prompt difference, not numerics: other tokenised this prompt itself "
                              f"({named}) without returning the ids"), found.explanation
    assert "; also: the engines were given different sampling params (repetition_penalty" in found.explanation
    assert unnamed not in found.explanation


def test_a_divergence_where_one_side_ended_says_so(tmp_path: Path) -> None:
    """The reference ended at step 2 (a stop string) where the other engine went on: no top-2 margin exists there,
    and no sentence may print one as 'nan'."""
    ref = result("ref", [5, 6], [-0.1, -0.5], [[5, 9], [6, 8]], [[-0.1, -3], [-0.5, -1.5]], finish="stop")
    longer = result("other", [5, 6, 7, 8], [-0.1, -0.5, -0.3, -0.4], [[5, 9], [6, 8], [7, 3], [8, 3]],
                    [[-0.1, -3], [-0.5, -1.5], [-0.3, -2], [-0.4, -2]])
    went_on = verdict(tmp_path, ref, longer)
    assert went_on.explanation.startswith("diverged at step 2: the reference ended there, other went on with "
                                          "'seven'"), went_on.explanation
    shorter = ref.model_copy(update={"engine": "other"})
    ended = verdict(tmp_path, REF.model_copy(update={"token_ids": [5, 6, 7]}), shorter)
    assert ended.explanation.startswith("diverged at step 2: other ended there, the reference went on with 'seven' "
                                        "(top-2 margin 2.8)"), ended.explanation
    assert "nan" not in went_on.explanation + ended.explanation


def test_an_engine_that_went_past_its_stop_string_leads_with_that_and_no_unrelated_params(tmp_path: Path) -> None:
    """Where one side stopped and the other went on, the text family's finding of how the answer ended leads the
    token verdict's explanation, with only the params that decide an ending; no effective-param list."""
    ref = result("ref", [5, 6], [-0.1, -0.5], [[5, 9], [6, 8]], [[-0.1, -3], [-0.5, -1.5]], finish="stop")
    longer = result("other", [5, 6, 7, 8], [-0.1, -0.5, -0.3, -0.4], [[5, 9], [6, 8], [7, 3], [8, 3]],
                    [[-0.1, -3], [-0.5, -1.5], [-0.3, -2], [-0.4, -2]]).model_copy(update={
                        "effective": {"decoding": "greedy", "top_k": 40}})
    ref = ref.model_copy(update={"effective": {"decoding": "greedy", "top_k": 1}})
    past = Ending("length", "length", "", None, True, ("generated 2 tokens past the stop string 'six'",))
    frame = judge(scenario(tmp_path, params="{stop: [six], repetition_penalty: 1.1}"),
                  {("ref", "a"): ref, ("other", "a"): longer}, decode, None, {("other", "a"): past})
    explanation = frame.iloc[0]["explanation"]
    assert explanation.startswith("other: generated 2 tokens past the stop string 'six'; diverged at step 2: the "
                                  "reference ended there"), explanation
    assert "effective params" not in explanation and "repetition_penalty" not in explanation


def test_max_logprob_delta_does_not_pass_a_divergence_it_could_not_read(tmp_path: Path) -> None:
    """A first-step divergence where the engine's top-k lacks the reference's token has no drift to hold against
    max_logprob_delta: the bound fails rather than passing unread (any tokens allowed)."""
    other = result("other", [9, 6, EOS], [-0.2, -0.5, -0.2], [[9, 7], [6, 8], [EOS, 7]],
                   [[-0.2, -3], [-0.5, -1.5], [-0.2, -3]], finish="stop")
    row = verdict(tmp_path, REF, other, expect="any, max_logprob_delta: 0.5")
    assert row.verdict == "diverged" and row.max_abs_logprob_delta is None and not row.expected
