"""Beam verdicts (best beam, beam set, scores, first divergent step), beams.parquet, and the rules-vs-numerics
decision of `parity explain` for beams, on hand-built beams. No engine runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.compare.beam_rules import compare_beams, first_difference, judge_all, judge_beams
from harness.compare.token_rules import judge
from harness.core.types import Beam, Result
from harness.explain.beam_causes import LoopRun, explain_case, first_live_difference, last_alive
from harness.rundir.tables import BEAM_COLUMNS, beams_frame
from harness.scenario.spec import load

from helpers import write_scenario

SCENARIO = """\
model: tiny-llama
engines:
  ref: {engine: hf, reference: true}
  other: {engine: vllm}
prompts: [{id: a, text: "x"}]
params: {temperature: 0, max_new_tokens: 4, num_beams: 3}
"""
EOS = 2


def beam(ids: list[int], cum: float, score: float | None = None) -> Beam:
    return Beam(token_ids=ids, logprobs=[cum / len(ids)] * len(ids), cum_logprob=cum,
                score=cum if score is None else score, finish_reason="stop" if ids[-1] == EOS else "length",
                text="".join(f"<{t}>" for t in ids))


def result(engine: str, beams: list[Beam], case: str = "a") -> Result:
    return Result(case_id=case, engine=engine, status="ok", prompt_ids=[1], token_ids=beams[0].token_ids,
                  beams=beams)


REF = [beam([5, 6, 7, 8], -1.0), beam([5, 6, 9, 8], -1.5), beam([5, EOS], -2.0)]


@pytest.fixture
def scenario(tmp_path: Path):
    return load(write_scenario(tmp_path / "s.yaml", SCENARIO))


def verdict(scenario, other: list[Beam]):
    results = {("ref", "a"): result("ref", REF), ("other", "a"): result("other", other)}
    return judge_beams(scenario, results, lambda t: f"<{t}>").iloc[0]


def test_identical_beams_match(scenario) -> None:
    row = verdict(scenario, [b.model_copy(update={"cum_logprob": b.cum_logprob + 1e-5}) for b in REF])
    assert row.verdict == "match" and row.expected
    assert row.best_beam_identical and row.beam_set_identical and row.beam_scores_within
    assert row.first_divergence == -1 and row.max_abs_logprob_delta == pytest.approx(1e-5)
    assert "identical best beam (4 tokens); same 3 beams" in row.explanation


def test_the_same_beams_in_another_order_keep_the_set_but_not_the_best(scenario) -> None:
    row = verdict(scenario, [REF[1], REF[0], REF[2]])
    assert row.verdict == "diverged" and not row.expected
    assert not row.best_beam_identical and row.beam_set_identical
    assert row.first_divergence == 2 and row.ref_token == 7 and row.engine_token == 9
    assert "best beams differ from step 2" in row.explanation


def test_a_beam_only_one_side_returned_is_named(scenario) -> None:
    other = [REF[0], REF[1], beam([5, 6, 7, EOS], -1.9)]
    row = verdict(scenario, other)
    assert row.best_beam_identical and not row.beam_set_identical and row.beams_compared == 3
    assert "2 of 3 beams shared; only the reference's: #2 '<5><2>'; only other's: #2 '<5><6><7><2>'" in \
        row.explanation


def test_same_beams_scored_differently_fail_the_score_check(scenario) -> None:
    other = [b.model_copy(update={"score": b.cum_logprob / 10}) for b in REF]  # another length rule
    row = verdict(scenario, other)
    assert row.verdict == "diverged" and row.best_beam_identical and row.beam_set_identical
    assert not row.beam_scores_within and row.max_beam_score_delta == pytest.approx(1.8)
    assert "final score max |delta| 1.8" in row.explanation


def test_a_missing_score_compares_the_cumulative_logprob_only() -> None:
    c = compare_beams(REF, [b.model_copy(update={"score": None}) for b in REF], 3)
    assert c.score_deltas == [] and c.scores_within(1e-3) and c.max_cum_delta == 0


def test_fewer_returned_beams_compare_over_what_both_returned() -> None:
    c = compare_beams(REF, REF[:2], 3)
    assert c.compared == 2 and c.set_identical and c.best_identical


def test_first_difference_counts_a_shorter_beam_ending() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) == -1
    assert first_difference([1, 2, 3], [1, 4, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_an_engine_error_is_a_verdict_not_a_crash(scenario) -> None:
    results = {("ref", "a"): result("ref", REF), ("other", "a"): Result.engine_error("a", "other", "boom")}
    row = judge_beams(scenario, results, str).iloc[0]
    assert row.verdict == "engine_error" and "other: boom" in row.explanation


def test_judge_all_gives_token_cases_and_beam_cases_their_own_verdicts(tmp_path: Path) -> None:
    text = SCENARIO.replace("params: {temperature: 0, max_new_tokens: 4, num_beams: 3}",
                            "params: {temperature: 0, max_new_tokens: 4}\ngrid: {num_beams: [null, 3]}")
    scenario = load(write_scenario(tmp_path / "mixed.yaml", text))
    greedy, beams = (c.case_id for c in scenario.cases)
    plain = Result(case_id=greedy, engine="ref", status="ok", prompt_ids=[1], token_ids=[5], chosen_logprobs=[-0.1],
                   top_ids=[[5, 6]], top_logprobs=[[-0.1, -2.0]])
    results = {("ref", greedy): plain, ("other", greedy): plain.model_copy(update={"engine": "other"}),
               ("ref", beams): result("ref", REF, beams), ("other", beams): result("other", REF, beams)}
    table = judge_all(judge, scenario, results, str).set_index("case_id")
    assert table.loc[greedy].verdict == "match" and pd.isna(table.loc[greedy].best_beam_identical)
    assert table.loc[beams].verdict == "match" and table.loc[beams].beam_set_identical


def test_beams_parquet_has_one_row_per_beam_with_its_rank() -> None:
    frame = beams_frame([result("ref", REF), result("other", REF[:2]), Result.engine_error("a", "x", "boom")])
    assert list(frame.columns) == BEAM_COLUMNS
    assert list(frame["rank"]) == [0, 1, 2, 0, 1] and list(frame.engine) == ["ref"] * 3 + ["other"] * 2
    assert list(frame.token_ids[2]) == [5, EOS] and frame.score[0] == -1.0


# rules vs numerics: loops are run on the same numbers (the oracle); steps are the beams each kept alive per step
STEPS = [[[]], [[5]], [[5, 6]], [[5, 6, 7], [5, 6, 9]]]
HF_LOOP = LoopRun(REF, STEPS, [[-0.25] * 4, [-0.375] * 4, [-1.0] * 2])
EOS_BEAM = beam([5, 6, EOS], -1.2)  # a finished beam one loop keeps and the other does not
OTHER_RULES = [REF[0], EOS_BEAM, REF[1]]
RULE = {"tolerance": 1e-3, "length_penalty": 1.0}  # the run's default beam tolerance; HF's and vLLM's default penalty


def decode(ids: list[int]) -> str:
    return "".join(f"<{t}>" for t in ids)


def test_rules_when_the_other_loop_on_the_same_numbers_reproduces_its_real_beams() -> None:
    loop = LoopRun(OTHER_RULES, STEPS, [[-0.25] * 4, [-0.4] * 3, [-0.375] * 4])
    e = explain_case("a", "hf", "vllm", REF, OTHER_RULES, HF_LOOP, loop, 3, decode, **RULE,
                     rules="beam_length: hf x, vllm y")
    assert e.cause == "rules" and e.reproduces == {"hf": True, "vllm": True}
    assert e.step == 1  # the first finished beam only one loop returns ends there; the live beams never differ
    assert "keep the same beams alive at every step" in e.verdict
    assert "vllm's loop returns #1 '<5><6><2>' (3 tokens, ends by EOS, cum logprob -1.2, score -1.2), which hf's " \
           "loop had as a candidate (its first 2 tokens alive at step 2) and did not return" in e.verdict
    assert "hf's loop returns #2 '<5><2>' (2 tokens, ends by EOS, cum logprob -2, score -2), which vllm's loop had " \
           "as a candidate (its first 1 tokens alive at step 1) and did not return" in e.verdict
    assert "their search settings differ (beam_length: hf x, vllm y)" in e.verdict


def test_numerics_when_both_loops_on_the_same_numbers_agree() -> None:
    drifted = [beam([5, 6, 9, 8], -1.4), beam([5, 6, 7, 8], -1.45), REF[2]]
    loop = LoopRun(REF, STEPS, [[-0.5] * 4, [-0.25] * 4, [-1.0] * 2])
    e = explain_case("a", "hf", "vllm", REF, drifted, HF_LOOP, loop, 3, decode, **RULE)
    assert e.cause == "numerics" and e.step == 2 and e.reproduces["vllm"] is False
    assert "return the same beams, so their rules do not part them here" in e.verdict
    assert "differ from the reference model's by up to 0.15" in e.verdict  # |-0.35 - -0.5|
    assert "leaves the one its loop finds on the reference model's numbers at step 2" in e.verdict


def test_both_when_neither_alone_explains_it() -> None:
    real = [beam([5, 6, 9, 8], -1.4), EOS_BEAM, REF[0]]
    loop = LoopRun(OTHER_RULES, STEPS, [[-0.3] * 4, [-0.4] * 3, [-0.25] * 4])
    e = explain_case("a", "hf", "vllm", REF, real, HF_LOOP, loop, 3, decode, **RULE)
    assert e.cause == "both" and "neither alone" in e.verdict and "disagree too" in e.verdict


def test_no_cause_when_the_beams_agree() -> None:
    assert explain_case("a", "hf", "vllm", REF, REF, HF_LOOP, HF_LOOP, 3, decode, **RULE).cause == "none"


def rescored(beams: list[Beam], length: int, cum_shift: float = 0.0) -> list[Beam]:
    """The same beams, their cumulative logprobs shifted and their scores divided by `length` more tokens (vLLM's
    prompt + generated length against HF's generated length)."""
    return [b.model_copy(update={"cum_logprob": b.cum_logprob + cum_shift,
                                 "score": (b.cum_logprob + cum_shift) / (len(b.token_ids) + length)}) for b in beams]


HF_SCORED = [b.model_copy(update={"score": b.cum_logprob / len(b.token_ids)}) for b in REF]


def test_same_beams_scored_by_another_length_are_the_rules_with_both_numbers() -> None:
    vllm = rescored(REF, 5)
    e = explain_case("a", "hf", "vllm", HF_SCORED, vllm, HF_LOOP, HF_LOOP, 3, decode, **RULE,
                     rules="beam_length: hf generated, vllm prompt + generated")
    assert e.cause == "rules", e.verdict
    assert "the same 3 beams in the same order with the same cumulative logprobs" in e.verdict
    assert "'<5><2>' scores -1 in hf and -0.285714 in vllm, both from cumulative logprob -2" in e.verdict
    assert "hf divides its cumulative logprob by 2 ** 1, vllm by 7 ** 1" in e.verdict
    assert "their search settings differ (beam_length: hf generated, vllm prompt + generated)" in e.verdict


def test_same_beams_whose_cumulative_logprobs_differ_are_the_numbers() -> None:
    e = explain_case("a", "hf", "vllm", HF_SCORED, rescored(REF, 0, cum_shift=0.01), HF_LOOP, HF_LOOP, 3, decode,
                     **RULE)
    assert e.cause == "numerics" and "cumulative logprobs differ by up to 0.01" in e.verdict, e.verdict


@pytest.mark.parametrize("other", [REF, rescored(REF, 0, 1e-5), rescored(REF, 5), rescored(REF, 0, 0.01),
                                   OTHER_RULES, [REF[1], REF[0], REF[2]], REF[:1] + [EOS_BEAM, REF[1]]],
                         ids=["same", "within", "length", "cum", "set", "order", "best-kept"])
def test_explain_names_a_cause_exactly_when_the_run_judges_the_beams_apart(scenario, other: list[Beam]) -> None:
    """The run's verdict and explain's cause come from one rule: `none` for a match, a cause for every divergence."""
    ref = HF_SCORED if other[0].score != other[0].cum_logprob else REF
    run = judge_beams(scenario, {("ref", "a"): result("ref", ref), ("other", "a"): result("other", other)},
                      lambda t: f"<{t}>").iloc[0]
    e = explain_case("a", "ref", "other", ref, other, HF_LOOP, LoopRun(other, STEPS), 3, decode, **RULE)
    assert (run.verdict == "match") == (e.cause == "none"), (run.explanation, e.verdict)


def test_where_the_loops_live_beams_part() -> None:
    other = [[[]], [[5]], [[5, 4]], [[5, 4, 7]]]
    assert first_live_difference(STEPS, other) == 2
    assert first_live_difference(STEPS, STEPS[:2]) is None  # a loop that stopped early is not a difference
    assert last_alive(STEPS, [5, 6, 9, 8]) == 3 and last_alive(STEPS, [5, 4, 1]) == 1
