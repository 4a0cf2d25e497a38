"""Raw against processed logprobs: a difference in kind where a case's params make them differ, none where nothing
processes the logits, and logits never read as logprobs."""

from __future__ import annotations

from adapters.contract import RAW_LOGPROBS, LogprobMeaning
from harness.compare.logprob_kinds import kinds_apart, processing
from harness.core.vocabulary import SamplingParams

PROCESSED = LogprobMeaning("processed_logprobs", "after the sampler")
LOGITS = LogprobMeaning("raw_logits", "the logits")
UNKNOWN = LogprobMeaning("unknown", "as the server computes them")


def test_what_a_sampler_applies_is_listed_from_the_params() -> None:
    assert processing(SamplingParams(temperature=0, max_new_tokens=8)) == []
    assert processing(SamplingParams(temperature=0, repetition_penalty=1.3, top_k=5)) == ["repetition_penalty=1.3"]
    sampled = SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.0, max_new_tokens=8)
    assert processing(sampled) == ["temperature=0.7", "top_p=0.9"]
    assert processing(SamplingParams(temperature=1.0, do_sample=True)) == []  # temperature 1 changes nothing


def test_raw_against_processed_is_a_difference_in_kind_only_where_params_process() -> None:
    penalised = SamplingParams(temperature=0, repetition_penalty=1.3)
    said = kinds_apart("hf", RAW_LOGPROBS, "vllm", PROCESSED, penalised)
    assert said.startswith("logprobs differ in kind, not numerics: vllm returns processed_logprobs, hf raw_logprobs")
    assert "repetition_penalty=1.3 make raw and processed differ" in said
    assert kinds_apart("hf", RAW_LOGPROBS, "vllm", PROCESSED, SamplingParams(temperature=0)) == ""
    assert kinds_apart("hf", RAW_LOGPROBS, "vllm", RAW_LOGPROBS, penalised) == ""
    assert kinds_apart("hf", RAW_LOGPROBS, "server", UNKNOWN, penalised) == ""


def test_logits_are_never_compared_as_logprobs() -> None:
    said = kinds_apart("hf", RAW_LOGPROBS, "vllm", LOGITS, SamplingParams(temperature=0))
    assert "logits are no logprobs" in said


def test_a_server_returning_logits_does_not_score() -> None:
    from adapters.engines.vllm_scoring import logits_refusal

    assert logits_refusal("raw_logprobs") == "" and logits_refusal("processed_logprobs") == ""
    assert "logprobs_mode raw_logits, so its prompt logprobs are logits too" in logits_refusal("raw_logits")
