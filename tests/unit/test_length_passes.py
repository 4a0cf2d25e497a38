"""harness.explain.length_passes without engines: which models' rope depends on the sequence's length, which cases
are traced again up to their divergent step, and how the two readings combine."""

from __future__ import annotations

import json
from pathlib import Path

from harness.core.types import TraceRequest
from harness.explain.length_passes import length_dependent_rope, prefix_requests, reread
from harness.explain.localise import Localisation


def folder(tmp_path: Path, **config) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_only_a_rope_that_follows_the_length_asks_for_a_prefix_pass(tmp_path: Path) -> None:
    assert length_dependent_rope(folder(tmp_path, rope_parameters={"rope_type": "longrope"})) == "longrope"
    assert length_dependent_rope(folder(tmp_path, rope_scaling={"type": "dynamic", "factor": 2})) == "dynamic"
    assert length_dependent_rope(folder(tmp_path, rope_parameters={"rope_type": "yarn"})) is None
    assert length_dependent_rope(folder(tmp_path, model_type="llama")) is None


def loc(engine: str, cause: str, step: int | None, verdict: str = "v") -> Localisation:
    return Localisation(case_id="c", engine=engine, reference="hf", cause=cause, verdict=verdict, first_step=step)


def test_unsettled_diverged_cases_are_traced_to_their_divergent_step() -> None:
    request = TraceRequest(case_id="c", token_ids=list(range(40)), prompt_len=30)
    wanted = prefix_requests([request], [loc("a", "near_tie", 2), loc("b", "component", 1), loc("d", "none", None)])
    assert list(wanted) == ["c\na"]
    assert wanted["c\na"].token_ids == list(range(32)) and wanted["c\na"].case_id == "c@32"


def test_a_component_only_the_prefix_shows_is_a_length_dependence() -> None:
    full = loc("a", "near_tie", 0, "near-tie: ...")
    prefix = loc("a", "component", None, "layer 0 q_rope leaves the noise floor first. The generated tokens agree.")
    found = reread(full, prefix, 32, 48, "longrope")
    assert found.cause == "length"
    assert "traced over the 32 tokens" in found.verdict and "layer 0 q_rope" in found.verdict
    assert "The generated tokens agree" not in found.verdict
    assert "all 48 tokens every point stays within the floor (near_tie)" in found.verdict
    kept = reread(full, loc("a", "none", None), 32, 48, "longrope")
    assert kept.cause == "near_tie" and "the engines agree as well (none)" in kept.verdict
