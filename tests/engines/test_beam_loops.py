"""The oracle and the engines' beam-search loops in this process, on the tiny random Llama (seconds): the oracle's
logits are a pure function of the sequence and agree with a plain forward pass; HF's loop fed the oracle returns
what HF's generate returns with the model itself; vLLM's offline and server loops, fed the same oracle, agree."""

from __future__ import annotations

import pytest

from adapters.engines.hf import translate
from adapters.engines.hf_beams import generate_beams
from adapters.sampling import hf as hf_sampling
from adapters.sampling import vllm_beams
from adapters.sampling.oracle import Oracle
from harness import models
from harness.core.vocabulary import SamplingParams

pytestmark = pytest.mark.engines

PROMPT = [1, 504, 3458, 282, 4649, 314]
PARAMS = SamplingParams(temperature=0, max_new_tokens=8, num_beams=3, length_penalty=0.0)


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    oracle = Oracle(models.resolve("tiny-llama", "float32"), "float32")
    oracle.start(PROMPT)
    return oracle


def test_the_oracle_answers_the_same_row_however_it_is_reached(oracle: Oracle) -> None:
    import torch

    sequence = [*PROMPT, 17, 42, 99]
    first = oracle.logits(sequence).clone()
    oracle.start([2, 3])  # another prompt: memoised rows and caches dropped
    oracle.start(PROMPT)
    again = oracle.logits(sequence)
    assert torch.equal(first, again)  # recomputed along the same path: the same bits
    with torch.inference_mode():
        plain = oracle.forward(input_ids=torch.tensor([sequence])).logits[0, -1]
    assert torch.allclose(first, plain, atol=1e-4)
    assert oracle.steps()[3] == [[17, 42, 99]]
    assert oracle.logprobs_of([17, 42])[1] == pytest.approx(float(oracle.logits([*PROMPT, 17]).log_softmax(-1)[42]))


def test_hf_loop_on_the_oracle_returns_hf_generates_beams(oracle: Oracle) -> None:
    from transformers import AutoTokenizer

    path = models.resolve("tiny-llama", "float32")
    tokenizer = AutoTokenizer.from_pretrained(path)
    oracle.start(PROMPT)
    looped = hf_sampling.beam_search(path, PARAMS, PROMPT, oracle)
    real = generate_beams(oracle.model, PROMPT, translate(PARAMS).native_params, tokenizer.pad_token_id, {2},
                          tokenizer)
    assert [b.token_ids for b in looped] == [b.token_ids for b in real]
    assert [b.score for b in looped] == pytest.approx([b.score for b in real], abs=1e-4)
    assert oracle.steps()[1]  # the loop's live beams were logged step by step
    assert "forward" not in oracle.model.__dict__  # the model's own forward is back


def test_vllm_offline_and_server_loops_agree_on_the_same_numbers(oracle: Oracle) -> None:
    path = models.resolve("tiny-llama", "float32")
    oracle.start(PROMPT)
    offline = vllm_beams.beam_search(path, PARAMS, PROMPT, oracle, mode="offline")
    oracle.start(PROMPT)
    served = vllm_beams.beam_search(path, PARAMS, PROMPT, oracle, mode="server")
    assert len(offline) == 3
    assert [b.token_ids for b in offline] == [b.token_ids for b in served]
    assert [b.cum_logprob for b in offline] == pytest.approx([b.cum_logprob for b in served])
