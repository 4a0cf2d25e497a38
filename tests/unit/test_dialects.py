"""Dialect translation: what each server is sent for the canonical params, and what it is warned about."""

from __future__ import annotations

import pytest

from adapters.http.client import Completion, _Unreadable, parse_payload, read_stream, translate
from adapters.http.dialects import DIALECTS, markdown_table
from harness.core.vocabulary import SamplingParams

from helpers import ROOT

GREEDY = SamplingParams(temperature=0, max_new_tokens=8)


def body(params: SamplingParams, dialect: str, endpoint: str = "completions", defaults: str = "canonical"):
    return translate(params, DIALECTS[dialect], 5, endpoint, defaults)


def test_greedy_requests_send_neutral_penalties_where_the_server_default_is_not_neutral() -> None:
    """llama_cpp.server applies repeat_penalty 1.1 when a request leaves it out, in greedy mode too."""
    sent = body(GREEDY, "llama-cpp-python").native_params
    assert sent["temperature"] == 0.0 and sent["repeat_penalty"] == 1.0 and sent["max_tokens"] == 8
    assert "top_k" not in sent and "top_p" not in sent  # greedy: truncation has no effect, not sent
    # a server whose own default is neutral gets nothing: a default from the model's generation_config.json applies
    # there as it does in HF (what the generation-config-defaults scenario shows)
    assert "repetition_penalty" not in body(GREEDY, "vllm").native_params


def test_sampling_sends_neutral_truncation_and_warns_where_it_cannot() -> None:
    sampling = SamplingParams(do_sample=True, temperature=0.8, max_new_tokens=8)
    sent = body(sampling, "llamacpp").native_params
    assert sent["top_k"] == 0 and sent["top_p"] == 1.0 and sent["min_p"] == 0.0
    generic = body(sampling, "generic")
    assert "top_k" not in generic.native_params and generic.native_params["top_p"] == 1.0


def test_ignored_and_rejected_params_are_warned_and_not_sent() -> None:
    params = SamplingParams(temperature=0, frequency_penalty=0.5, min_new_tokens=2, max_new_tokens=8)
    lmdeploy = body(params, "lmdeploy")
    assert "frequency_penalty" not in lmdeploy.native_params
    assert any("frequency_penalty=0.5 NOT APPLIED: the lmdeploy server accepts and ignores it" in w
               for w in lmdeploy.warnings)
    assert any("min_new_tokens=2 NOT APPLIED: the lmdeploy server has no such field" in w for w in lmdeploy.warnings)
    assert body(params, "vllm").native_params["min_tokens"] == 2


def test_engine_defaults_mode_sends_only_what_the_scenario_set() -> None:
    unset = SamplingParams(max_new_tokens=8)
    translation = body(unset, "lmdeploy", defaults="engine")
    assert "temperature" not in translation.native_params
    assert any("the lmdeploy server's defaults decide (0.8)" in w for w in translation.warnings)


def test_token_id_fields_and_chat_logprobs() -> None:
    assert body(GREEDY, "vllm").native_params["return_token_ids"] is True
    chat = body(GREEDY, "vllm", endpoint="chat").native_params
    assert chat["logprobs"] is True and chat["top_logprobs"] == 5


def test_both_response_shapes_parse_into_steps() -> None:
    completions = Completion()
    parse_payload({"choices": [{"text": " Paris", "finish_reason": "length", "logprobs": {
        "tokens": ["token_id:7042"], "token_logprobs": [-0.28],
        "top_logprobs": [{"token_id:7042": -0.28, "token_id:260": -2.6}]}}]}, "completions", completions)
    assert completions.steps[0].token == "token_id:7042" and completions.steps[0].top[1] == ("token_id:260", -2.6)
    chat = Completion()
    parse_payload({"choices": [{"message": {"content": "84"}, "finish_reason": "stop", "logprobs": {"content": [
        {"token": "84", "logprob": -0.1, "top_logprobs": [{"token": "84", "logprob": -0.1}]}]}}]}, "chat", chat)
    assert chat.text == "84" and chat.steps[0].logprob == -0.1 and chat.finish_reason == "stop"


def test_a_stream_cut_before_its_finish_reason_is_unreadable_and_so_retried() -> None:
    """llama-cpp-python's server, interrupted by another request, sends [DONE] after the chunks it had: a whole
    answer to the client unless the missing finish reason gives the cut away."""
    chunk = 'data: {"choices": [{"text": "TEXT", "finish_reason": REASON}]}'
    whole = [chunk.replace("TEXT", " Paris").replace("REASON", "null"), "",
             chunk.replace("TEXT", ".").replace("REASON", '"length"'), "", "data: [DONE]"]
    out = Completion()
    read_stream(whole, "completions", out, parse_payload)
    assert out.text == " Paris." and out.deltas == [" Paris", "."] and out.finish_reason == "length"
    cut = [whole[0], "", "data: [DONE]"]
    with pytest.raises(_Unreadable, match=r"the stream ended after 1 chunk\(s\) without a finish reason: cut short"):
        read_stream(cut, "completions", Completion(), parse_payload)


def test_readme_dialect_table_is_current() -> None:
    assert markdown_table() in (ROOT / "docs" / "engines-and-servers.md").read_text()
