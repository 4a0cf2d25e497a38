"""The seeds' decoding params (no_repeat_ngram_size, stop_token_ids, include_stop_str_in_output, logit_bias,
bad_words, skip_special_tokens, spaces_between_special_tokens): each engine's translation applies or warns, and
num_return_sequences under sampling is refused with the way to compare samples."""

from __future__ import annotations

import pytest

from adapters.engines import hf, llamacpp, lmdeploy_params, vllm_offline
from adapters.engines.hf_kwargs import generate_kwargs
from adapters.http.client import translate as request_body
from adapters.http.dialects import DIALECTS
from adapters.sampling.common import sent_fields
from harness.core.vocabulary import CONSTRAINTS, DETOKENISATION, SamplingParams

ALL = SamplingParams(temperature=0, no_repeat_ngram_size=2, stop_token_ids=[13], include_stop_str_in_output=False,
                     logit_bias={5: -100}, bad_words=["dog"], skip_special_tokens=False,
                     spaces_between_special_tokens=True, stop=["x"])


def not_applied(warnings: list[str]) -> set[str]:
    return {w.split("=")[0] for w in warnings if "NOT APPLIED" in w}


def test_the_groups_hold_the_new_params() -> None:
    assert CONSTRAINTS == ("no_repeat_ngram_size", "logit_bias", "bad_words", "constraint")
    assert DETOKENISATION == ("skip_special_tokens", "spaces_between_special_tokens")


def test_sampled_sequences_are_refused_with_the_sampling_block_named() -> None:
    with pytest.raises(ValueError, match="num_return_sequences 3 under sampling .* `sampling:` block"):
        SamplingParams(do_sample=True, top_k=50, top_p=0.95, num_return_sequences=3)


def test_hf_applies_every_param_but_a_kept_stop_string_and_spaces() -> None:
    translation = hf.translate(ALL)
    native = translation.native_params
    assert native["no_repeat_ngram_size"] == 2 and native["sequence_bias"] == {(5,): -100.0}
    assert not_applied(translation.warnings) == {"include_stop_str_in_output", "spaces_between_special_tokens"}
    kwargs = generate_kwargs(native, {2}, tokenizer=None if not native.get("bad_words") else _Words())
    assert kwargs["eos_token_id"] == [2, 13]  # the model's EOS kept, the stop id added
    assert kwargs["bad_words_ids"] == [[1], [2, 1]] and "skip_special_tokens" not in kwargs


class _Words:
    """A tokenizer stand-in: 'dog' is one token, ' dog' two."""

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [1] if text == "dog" else [2, 1]


def test_vllm_takes_them_by_name_except_the_ngram_ban() -> None:
    translation = vllm_offline.translate(ALL)
    for name in ("stop_token_ids", "include_stop_str_in_output", "logit_bias", "bad_words", "skip_special_tokens",
                 "spaces_between_special_tokens"):
        assert translation.native_params[name] == getattr(ALL, name)
    assert not_applied(translation.warnings) == {"no_repeat_ngram_size"}


def test_llamacpp_and_lmdeploy_name_what_they_lack() -> None:
    assert not_applied(llamacpp.translate(ALL).warnings) == {"no_repeat_ngram_size", "bad_words",
                                                             "spaces_between_special_tokens",
                                                             "include_stop_str_in_output"}
    lmdeploy = lmdeploy_params.translate(ALL).warnings
    assert not_applied(lmdeploy) == {"no_repeat_ngram_size", "logit_bias"}
    assert any("indexes_containing_token" in w for w in lmdeploy)  # its bad-words rule is another one


def test_servers_get_the_fields_their_dialect_has() -> None:
    vllm = request_body(ALL, DIALECTS["vllm"], 5, "completions")
    assert vllm.native_params["logit_bias"] == {"5": -100.0}  # JSON keys: token ids as strings
    assert vllm.native_params["stop_token_ids"] == [13] and not_applied(vllm.warnings) == {"no_repeat_ngram_size"}
    generic = request_body(ALL, DIALECTS["generic"], 5, "completions")
    assert "logit_bias" in generic.native_params  # an OpenAI field
    assert not_applied(generic.warnings) == {"no_repeat_ngram_size", "stop_token_ids", "include_stop_str_in_output",
                                             "bad_words", "skip_special_tokens", "spaces_between_special_tokens"}
    lmdeploy = request_body(ALL, DIALECTS["lmdeploy"], 5, "generate")
    assert lmdeploy.native_params["skip_special_tokens"] is False and "stop_token_ids" in lmdeploy.native_params


def test_fields_an_engine_takes_as_sent_follow_its_rules() -> None:
    fields = sent_fields(ALL, ("stop_token_ids", "logit_bias", "skip_special_tokens"), stop_included=True)
    assert fields["stop_token_ids"] == [13] and fields["logit_bias"] == {5: -100.0}
    assert fields["no_repeat_ngram_size"] is None and fields["include_stop_str_in_output"] is True
    assert fields["spaces_between_special_tokens"] is None  # not taken: no such knob
    skipping = sent_fields(SamplingParams(), ("skip_special_tokens",))
    assert skipping["skip_special_tokens"] is True and skipping["include_stop_str_in_output"] is None
    assert skipping["spaces_between_special_tokens"] is None  # nothing to space when special tokens are skipped
