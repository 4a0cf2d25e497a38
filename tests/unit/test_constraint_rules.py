"""Constrained output judged metamorphically (harness.compare.constraint_rules): a reference that already satisfies the
constraint must be followed token for token; one that does not must be steered to a valid answer; a bad schema or
regex is refused where the scenario is read."""

from __future__ import annotations

import pytest

from harness.compare import constraint_rules
from harness.core.types import Result
from harness.core.vocabulary import Constraint, SamplingParams

# a toy vocabulary: id -> text
VOCAB = {1: "{", 2: '"a"', 3: ":", 4: " 1", 5: "}", 6: "\n", 7: " Paris", 8: " 2", 9: "yes", 10: "no", 11: "<eos>"}
SCHEMA = Constraint(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


def result(engine: str, ids: list[int], finish: str = "stop") -> Result:
    text = "".join(VOCAB[i] for i in ids if i != 11)
    return Result(case_id="c", engine=engine, status="ok", token_ids=ids, text=text, finish_reason=finish,
                  chosen_logprobs=[-0.1] * len(ids), top_ids=[[i] for i in ids], top_logprobs=[[-0.1]] * len(ids))


def judge(reference: Result, engine: Result, constraint: Constraint = SCHEMA, applied: bool = True, **kw) -> dict:
    return constraint_rules.judge(constraint, reference, engine, applied, lambda t: VOCAB[t],
                                  lambda ids: "".join(VOCAB[i] for i in ids if i != 11), **kw)


def test_a_satisfying_reference_must_be_followed_up_to_its_answer() -> None:
    reference = result("hf", [1, 2, 3, 4, 5, 6])  # its answer, then the newline it stopped at
    same = judge(reference, result("vllm", [1, 2, 3, 4, 5, 11]), ended=(True, True))  # the schema, then the newline
    # the reference stopped at and EOS ended the engine's answer
    assert same["verdict"] == "unchanged" and same["reference_satisfies"]
    changed = judge(reference, result("vllm", [1, 2, 3, 8, 5, 11]), ended=(True, True))
    assert changed["verdict"] == "changed" and changed["masked_step"] == 3
    assert "the reference chose ' 1', the engine ' 2': the constraint masked a token it allows" in \
        changed["explanation"]


def test_a_change_after_the_first_satisfying_tokens_is_a_change() -> None:
    """The reference's shortest satisfying prefix is one token of a choice, a regex or a number: a masking defect
    after it must still be seen, so the engine's whole answer is held against the reference's tokens."""
    reference = result("hf", [1, 2, 3, 4, 5, 6])
    reference = result("hf", [1, 2, 3, 4, 5, 9, 6])  # more of an answer after its first satisfying tokens
    later = judge(reference, result("vllm", [1, 2, 3, 4, 5, 8, 11]), ended=(True, True))
    assert later["verdict"] == "changed" and later["masked_step"] == 5


def test_an_unsatisfying_reference_must_be_steered_to_a_valid_answer() -> None:
    reference = result("hf", [7, 6])
    steered = judge(reference, result("vllm", [1, 2, 3, 4, 5, 11]))
    assert steered["verdict"] == "steered" and steered["masked_step"] == 0
    assert steered["explanation"].startswith("the reference's answer is not JSON")
    cut = judge(reference, result("vllm", [1, 2, 3], finish="stop"), stopped_by="\n")
    assert cut["verdict"] == "invalid" and "cut by the stop string '\\n'" in cut["explanation"]
    short = judge(reference, result("vllm", [1, 2, 3], finish="length"))
    assert "cut by max_new_tokens" in short["explanation"]
    assert judge(reference, result("x", [7]), applied=False)["verdict"] == "not_applied"


def test_choices_and_regexes_are_matched_whole() -> None:
    choice = Constraint(choice=["yes", "no"])
    assert constraint_rules.satisfies(choice, "yes") == (True, "")
    assert constraint_rules.satisfies(choice, "yes!") == (False, "is none of the choices ('yes!')")
    digits = Constraint(regex=r"[0-9]{3}")
    assert constraint_rules.satisfies(digits, "123")[0] and not constraint_rules.satisfies(digits, "1234")[0]
    failed = constraint_rules.satisfies(SCHEMA, '{"a": "x"}')
    assert failed == (False, "fails the schema at a: 'x' is not of type 'integer'")


@pytest.mark.parametrize(("given", "message"), [
    ({"regex": "("}, r"regex '\(' does not compile"),
    ({"json_schema": {"type": "nope"}}, "json_schema is not a valid JSON schema"),
    ({"choice": []}, "at least 1 item"),
    ({"regex": "a", "choice": ["a"]}, "give exactly one of json_schema, regex, choice"),
])
def test_a_bad_constraint_is_refused(given: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(constraint=given)
