"""The text verdicts' rules (harness.compare.text_rules) and the one reading of how an answer ended
(harness.compare.ending) on a toy byte-level vocabulary: each engine reading of its own ids is recognised, anything
else is a detokeniser finding, and stops, finish reasons (ignore_eos honoured), usage and streamed chunks are judged
from the ids."""

from __future__ import annotations

from harness.compare import text_rules
from harness.compare.ending import Ending, StopMatch, first_stop, read_ending
from harness.core.types import Result
from harness.core.vocabulary import SamplingParams

# id -> bytes; "好" is three UTF-8 bytes split over ids 5 and 6; 9 is the EOS
VOCAB = {1: b" one", 2: b",", 3: b" two", 4: b" th", 5: "好".encode()[:1], 6: "好".encode()[1:], 7: b"ree", 9: b"</s>"}
EOS = 9


def decode(ids: list[int]) -> str:
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def ending(ids: list[int], text: str = "", *, stops: list[str] | None = None, finish_reason: str = "length",
           max_new_tokens: int | None = None, stops_applied: bool = True, **params) -> Ending:
    warnings = [] if stops_applied else ["stop=['...'] NOT APPLIED: the engine has no stop strings"]
    result = Result(case_id="c", engine="e", status="ok", token_ids=ids, text=text, finish_reason=finish_reason,
                    warnings=warnings)
    wanted = SamplingParams(stop=stops, max_new_tokens=max_new_tokens or len(ids), **params)
    return read_ending(result, wanted, {EOS}, lambda part, skip: decode(part))


def read(text: str, ids: list[int], include_stop: bool | None = None, usage: dict[str, int] | None = None,
         **kw) -> text_rules.Reading:
    return text_rules.read_answer(text, ids, decode, ending(ids, text, **kw), include_stop=include_stop,
                                  usage=usage or {}, prompt_len=4)


def test_the_engines_readings_are_recognised() -> None:
    assert read(" one, two", [1, 2, 3]).text_check == text_rules.AS_IDS
    ended = read(" one", [1, EOS], finish_reason="stop", max_new_tokens=8)
    assert ended.text_check == text_rules.STOP_TOKEN_CUT and not ended.findings  # vLLM leaves the EOS's text out
    held = read(" one,", [1, 2, 5], max_new_tokens=3)  # 好 cut after its first byte: HF writes U+FFFD, vLLM waits
    assert decode([1, 2, 5]).endswith("\ufffd") and held.text_check == text_rules.PARTIAL_HELD


def test_a_text_that_no_reading_gives_is_a_detokeniser_finding() -> None:
    reading = read(" one, tw", [1, 2, 3])
    assert reading.text_check == text_rules.DIFFERS
    assert reading.findings == ["detokeniser: the text leaves the decoding of its own ids at character 8: "
                                "' one, tw' against ' one, two'"]
    cut = read(" one\ufffd", [1, 5, 6])
    assert "U+FFFD where the ids decode to a whole character" in cut.findings[0]


def test_a_stop_string_spanning_tokens_is_found_from_the_ids_and_its_cut_judged() -> None:
    ids = [1, 2, 4, 7]  # " one, three": the stop ", thr" spans three tokens and is complete at the last one
    stop = first_stop(ids, [", thr"], decode)
    assert stop == StopMatch(", thr", char=4, step=3, spans=True)
    before = read(" one", ids, stops=[", thr"], include_stop=False, finish_reason="stop", max_new_tokens=8)
    assert before.text_check == text_rules.BEFORE_STOP and not before.findings
    assert ending(ids, stops=[", thr"], finish_reason="stop", max_new_tokens=8).ids_end == "stop"
    kept = read(" one, three", ids, stops=[", thr"], include_stop=False, finish_reason="stop", max_new_tokens=8)
    assert kept.findings == ["the stop string ', thr' is kept but the engine's include_stop_str_in_output is False"]
    past = read(" one, three, two", [*ids, 2, 3], stops=[", thr"], finish_reason="stop", max_new_tokens=8)
    assert past.findings == ["generated 2 tokens past the stop string ', thr' (complete at token 3)"]


def test_finish_reason_and_usage_are_held_to_the_ids() -> None:
    wrong = read(" one", [1, EOS], finish_reason="length", max_new_tokens=8)
    assert wrong.findings == ["finish reason 'length' but the ids say 'stop' (the last token 9 is a stop token)"]
    counted = read(" one, two", [1, 2, 3], usage={"completion_tokens": 4, "prompt_tokens": 4})
    assert counted.findings == ["usage says 4 completion tokens, the answer has 3 ids"]


def test_streamed_chunks_must_join_to_the_text_whole() -> None:
    assert text_rules.delta_findings([" one", ",", " two"], " one, two", [], None) == []
    split = text_rules.delta_findings([" one", "\ufffd", "好"], " one好", [], None)
    assert split == ["the streamed chunks join to 6 characters, the text has 5",
                     "chunk 1 holds U+FFFD: a multi-byte character split between chunks"]
    leaked = text_rules.delta_findings([" one", ", thr"], " one", [", thr"], False)
    assert leaked[-1] == "the chunks leak the stop string ', thr' the text cut"


def test_a_stop_string_cut_from_the_text_still_ended_the_generation() -> None:
    """vLLM cuts the stop string from its text; the ids still hold it (it is not an EOS the engine kept back)."""
    params = SamplingParams(stop=[", thr"], max_new_tokens=8)
    cut = Result(case_id="c", engine="vllm", status="ok", token_ids=[1, 2, 4, 7], text=" one", finish_reason="stop")
    assert read_ending(cut, params, {EOS}, None).how == "eos_not_returned"  # the text alone misreads it
    assert read_ending(cut, params, {EOS}, lambda ids, skip: decode(ids)).how == "stop_string"
    stop_id = SamplingParams(stop_token_ids=[3], max_new_tokens=8)
    assert read_ending(cut.model_copy(update={"token_ids": [1, 3]}), stop_id, {EOS}, None).how == "stop_token"


def test_an_eos_under_ignore_eos_ends_nothing() -> None:
    """benchmarks/server_overhead.py's answers (ignore_eos, 64 tokens): one whose last generated id happens to be an
    EOS reached its length like the others; the text verdicts read it as the token verdicts do."""
    ids = [1, 2, 3, EOS]
    ignoring = read(" one, two</s>", ids, finish_reason="length", ignore_eos=True)
    assert ignoring.findings == [] and ignoring.text_check == text_rules.AS_IDS
    read_once = ending(ids, finish_reason="length", ignore_eos=True)
    assert (read_once.how, read_once.ids_end, read_once.last_id_ends) == ("length", "length", False)
    assert read_once.ids_why == "4 tokens, max_new_tokens reached (ignore_eos: an EOS ends nothing)"
    # without ignore_eos the same ids end on their EOS, and a 'length' finish reason is a finding
    wrong = read(" one, two", ids, finish_reason="length")
    assert wrong.findings == ["finish reason 'length' but the ids say 'stop' (the last token 9 is a stop token)"]
    # an EOS under ignore_eos is no stop token whose text an engine cuts: such a text is a detokeniser finding
    assert read(" one, two", ids, finish_reason="length", ignore_eos=True).text_check == text_rules.DIFFERS
