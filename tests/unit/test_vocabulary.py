"""The canonical vocabulary is defined once and everything else derives from it."""

from __future__ import annotations

import pytest

from adapters.contract import greedy_ignored
from adapters.http.dialects import CANONICAL_PARAMS
from harness.core.types import COMPARED, Effective
from harness.core.vocabulary import (
    GREEDY_IRRELEVANT,
    NEUTRAL,
    OPENAI_FIELDS,
    PARAMS,
    PENALTIES,
    SHAPING,
    Group,
    SamplingParams,
    names,
)


def test_every_param_carries_its_info() -> None:
    assert set(PARAMS) == set(SamplingParams.model_fields)
    assert PENALTIES == ("repetition_penalty", "frequency_penalty", "presence_penalty")
    assert set(names(Group.TRUNCATION)) == {"top_k", "top_p", "min_p"}
    assert set(GREEDY_IRRELEVANT) == {"temperature", "top_k", "top_p", "min_p", "seed"}
    assert NEUTRAL["repetition_penalty"] == 1.0 and NEUTRAL["frequency_penalty"] == 0.0 and NEUTRAL["top_k"] == 0
    assert OPENAI_FIELDS["max_new_tokens"] == "max_tokens" and "top_k" not in OPENAI_FIELDS


def test_derived_lists_cover_the_vocabulary() -> None:
    assert set(SHAPING) == set(names(Group.DECODING, Group.TRUNCATION, Group.PENALTY)) - {"do_sample"}
    assert set(CANONICAL_PARAMS) == set(PARAMS) - {"do_sample"}
    # the effective-params table compares every canonical param an engine can have a knob for
    knobs = [n for n in PARAMS if n in Effective.model_fields]
    assert set(knobs) <= set(COMPARED)
    assert set(SHAPING) <= set(knobs)


def test_greedy_warns_about_every_param_it_ignores() -> None:
    params = SamplingParams(temperature=0, top_k=5, top_p=0.9, min_p=0.1, seed=3)
    warned = {w.split()[0] for w in greedy_ignored(params)}
    assert warned == {"top_k", "top_p", "min_p", "seed"}  # temperature 0 is how greedy is asked for
    assert greedy_ignored(SamplingParams(do_sample=False, temperature=0.7)) == [
        "temperature has no effect: decoding is greedy (do_sample false)"]
    assert greedy_ignored(SamplingParams(do_sample=True, temperature=0.7, top_k=5)) == []


def test_neutralised_keeps_sampling_on_and_does_not_touch_the_original() -> None:
    params = SamplingParams(temperature=0.7, repetition_penalty=1.2)
    hotter = params.neutralised("temperature")
    assert hotter.temperature is None and not hotter.greedy and params.temperature == 0.7
    assert params.neutralised("repetition_penalty").repetition_penalty is None


def test_contradictions_are_rejected() -> None:
    with pytest.raises(ValueError, match="contradictory"):
        SamplingParams(do_sample=True, temperature=0)
