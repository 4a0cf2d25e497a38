"""A configuration knob whose two sides recorded the same value of what it turns is unsupported, never identical; a
control with no judged knob fails nothing."""

from __future__ import annotations

from harness.compare.invariance_rules import InvarianceRow
from harness.plan.invariance_checks import Check, Side
from harness.verdicts.invariance import _control_unused, ran_alike


def check(knob: str, control: bool = False) -> Check:
    return Check(engine="vllm", knob=knob, control=control, baseline=Side("vllm", [], [], "eager mode"),
                 variant=Side("vllm~enforce_eager=False", [], [], "the compiled graph"))


def test_two_sides_that_ran_alike_are_not_compared() -> None:
    versions = {"vllm": {"compilation": "NONE"}, "vllm~enforce_eager=False": {"compilation": "NONE"}}
    said = ran_alike(check("compile"), versions)
    assert said.startswith("both sides ran with compilation NONE: vllm did not turn what the knob turns")
    assert "LoRA adapter" in said


def test_two_sides_that_ran_as_the_knob_says_are_compared() -> None:
    versions = {"vllm": {"compilation": "NONE"}, "vllm~enforce_eager=False": {"compilation": "DYNAMO_TRACE_ONCE"}}
    assert ran_alike(check("compile"), versions) == ""
    assert ran_alike(check("compile"), {}) == ""  # an engine that records nothing of it: judged as it ran
    assert ran_alike(check("batch"), {"vllm": {"compilation": "NONE"}}) == ""
    assert ran_alike(check("compile", control=True), {"vllm": {}, "vllm~enforce_eager=False": {}}) == ""


def test_a_control_fails_nothing_only_where_no_knob_of_its_engine_was_judged() -> None:
    sides = {"baseline": "a", "variant": "b"}
    control = InvarianceRow(engine="vllm", knob="control", control=True, verdict="identical", expected=False,
                            explanation="no case diverged", **sides)
    unsupported = InvarianceRow(engine="vllm", knob="compile", control=False, verdict="unsupported", expected=True,
                                **sides)
    judged = InvarianceRow(engine="vllm", knob="batch", control=False, verdict="identical", expected=True, **sides)
    kept = _control_unused(control, [unsupported, control])
    assert kept.expected and kept.explanation.endswith("no knob of vllm was judged, so nothing rests on its control")
    assert not _control_unused(control, [unsupported, judged, control]).expected
