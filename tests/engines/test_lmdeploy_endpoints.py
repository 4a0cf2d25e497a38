"""lmdeploy's api_server endpoints, checked against lmdeploy's own code (its request models, request checks and the
functions that build its answers) and against answers recorded from a real api_server on an H100: the native
/generate is the path for token-level comparison, /v1/completions (no logprobs in 0.18) is refused up front, the
chat path's byte-level pieces map back to ids, and an answer with text but no per-token logprobs is an engine error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from adapters.http.answers import to_result
from adapters.http.client import Completion, parse_payload, translate
from adapters.http.dialects import DIALECTS
from adapters.http.token_ids import TokenTable
from harness import models
from harness.core.types import Request, Translation
from harness.core.vocabulary import SamplingParams

from helpers import parity_in_process, write_scenario

LMDEPLOY = DIALECTS["lmdeploy"]
PARAMS = [SamplingParams(temperature=0, max_new_tokens=6),
          SamplingParams(do_sample=True, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                         seed=3, max_new_tokens=6)]
# /generate on lmdeploy 0.18.0, SmolLM2-135M bf16, H100 (shared/gpu_lmdeploy/results-20261123/server-probe.txt):
# input_ids for "The capital of France is", greedy, 6 tokens. The probe kept the first step's logprobs in full.
RECORDED = {"text": " Paris.\n\nThe answer", "output_ids": [7042, 30, 198, 198, 504, 2988],
            "meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.279296875, 7042]],
                          "output_top_logprobs": [[[-0.279296875, 7042], [-2.65625, 260], [-4.40625, 4528],
                                                   [-4.46875, 2250], [-4.59375, 1315]]]}}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.resolve("smollm2-135m", "float32"))


def request(params: SamplingParams = PARAMS[0], top: int = 3) -> Request:
    return Request(case_id="capital", prompt_ids=[504, 3575, 282, 4649, 314], params=params, top_logprobs=top)


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "sampling"])
def test_generate_bodies_pass_lmdeploys_own_request_model_and_check(params: SamplingParams) -> None:
    from lmdeploy.serve.openai.endpoints.generate import check_request
    from lmdeploy.serve.openai.protocol import GenerateReqInput

    translation = translate(params, LMDEPLOY, 5, "generate")
    body = {**translation.native_params, "input_ids": request(params).prompt_ids, "stream": False}
    parsed = GenerateReqInput(**body)
    context = SimpleNamespace(engine_config=SimpleNamespace(logprobs_mode="raw_logprobs"),
                              session_manager=SimpleNamespace(has=lambda session_id: False))
    assert check_request(parsed, context) == ""
    assert parsed.return_logprob is True and parsed.top_logprobs_num == 5
    if params.seed is not None:  # /generate has no seed field: reported, not dropped silently
        assert any("seed=3 NOT APPLIED" in w for w in translation.warnings)


def test_answers_built_by_lmdeploys_own_code_parse_into_steps_with_ids() -> None:
    from lmdeploy.serve.openai.endpoints.generate import _create_token_logprobs, _create_top_logprobs

    ids = [7042, 30]
    engine_logprobs = [{7042: -0.28, 260: -2.66, 4528: -4.4}, {30: -1.9, 28: -0.5, 29: -2.5, 7042: -7.0}]
    payload = {"text": " Paris.", "output_ids": ids, "meta_info": {
        "finish_reason": {"type": "length"}, "output_token_logprobs": _create_token_logprobs(ids, engine_logprobs),
        "output_top_logprobs": _create_top_logprobs(ids, engine_logprobs, 3)}}
    completion = Completion()
    parse_payload(payload, "generate", completion)
    result = to_result("server", request(), Translation(native_params={}), {"input_ids": [1]}, completion,
                       TokenTable(lambda: None), "http://127.0.0.1/generate")
    assert result.status == "ok" and result.token_ids == ids and result.finish_reason == "length"
    assert result.chosen_logprobs == [-0.28, -1.9]
    assert result.top_ids[1] == [28, 30, 29]  # chosen merged back into the ranking where lmdeploy listed it apart
    assert result.prompt_ids == request().prompt_ids and not any("prompt token ids" in w for w in result.warnings)


def test_the_recorded_h100_answer_parses() -> None:
    completion = Completion()
    parse_payload(RECORDED, "generate", completion)
    assert completion.token_ids == [7042, 30, 198, 198, 504, 2988] and completion.finish_reason == "length"
    assert completion.steps[0].token == "token_id:7042" and completion.steps[0].top[1] == ("token_id:260", -2.65625)


def test_chat_pieces_built_by_lmdeploys_own_code_map_back_to_ids(tokenizer) -> None:
    from lmdeploy.serve.openai.chat_completions.logprobs import _create_chat_completion_logprobs

    ids = tokenizer.encode(" twelve times seven", add_special_tokens=False)
    logprobs = [{t: -0.1, (t + 1) % len(tokenizer): -2.0} for t in ids]
    content = _create_chat_completion_logprobs(tokenizer, ids, logprobs).model_dump()
    assert content["content"][1]["token"].startswith("Ġ")  # byte-level BPE pieces, not text
    completion = Completion()
    parse_payload({"choices": [{"message": {"content": " twelve times seven"}, "finish_reason": "length",
                                "logprobs": content}]}, "chat", completion)
    result = to_result("server", request(), Translation(native_params={}), {"messages": []}, completion,
                       TokenTable(lambda: tokenizer), "http://127.0.0.1/v1/chat/completions")
    assert result.token_ids == ids
    assert [top[0] for top in result.top_ids] == ids and len(result.top_ids[0]) == 2


def test_text_without_per_token_logprobs_is_an_engine_error_naming_the_endpoint() -> None:
    completion = Completion()
    parse_payload({"choices": [{"text": " Paris.\n\nThe answer is:", "logprobs": None, "finish_reason": "length"}]},
                  "completions", completion)
    result = to_result("server", request(), Translation(native_params={}), {"prompt": "x"}, completion,
                       TokenTable(lambda: None), "http://127.0.0.1:8000/v1/completions")
    assert result.status == "error"
    assert "http://127.0.0.1:8000/v1/completions answered 23 characters of text but no per-token logprobs" in \
        result.error


def test_completions_for_token_level_comparison_is_refused_at_validation(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", """\
model: smollm2-135m
engines:
  hf: {engine: hf, reference: true}
  served: {engine: lmdeploy-server, dtype: float16, options: {endpoint: completions}}
  other: {engine: openai, options: {url: "http://127.0.0.1:9/v1", dialect: lmdeploy}}
prompts: ["x"]
""")
    run = parity_in_process("validate", str(scenario))
    assert run.code == 2
    assert ("engines.served.options: endpoint completions: lmdeploy's api_server (0.18) answers /v1/completions with "
            "logprobs: null, so it cannot be compared token by token: use endpoint: generate (or chat)") in run.stderr
    other = scenario.read_text().replace("  served: {engine: lmdeploy-server, dtype: float16, options: "
                                         "{endpoint: completions}}\n", "")
    assert parity_in_process("validate", str(write_scenario(tmp_path / "ok.yaml", other))).code == 0
