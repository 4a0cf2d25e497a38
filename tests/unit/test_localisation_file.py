"""explain/localisation.json is defined once (harness.rundir.localisations, issue 75 item 9): the report reads the
file with the schema explain's localisations are written in, so every field explain writes comes back as written (the
report's own copy of the schema read a part of it)."""

from __future__ import annotations

from pathlib import Path

from harness.explain.localise import Localisation
from harness.rundir.localisations import ExplainFile
from harness.rundir.store import read_json, write_json


def test_every_field_explain_writes_is_read_back_as_written(tmp_path: Path) -> None:
    localisation = Localisation(
        case_id="p0", engine="vllm", reference="hf", cause="component", verdict="layer 1 v leaves the floor first",
        k=10.0, first_step=3, divergence={"step": 3, "ref_token": 5, "engine_token": 7},
        first_difference={"point": "layers.0.q", "error": 1e-7}, out_of_floor={"point": "layers.1.v", "jump": 12.5},
        curve=[{"layer": 0, "error": 1e-7, "floor": 1e-7}, {"layer": 1, "error": 1e-2, "floor": 2e-7}],
        routing={"grid": ["layer 0: ..x"], "legend": "x: another expert"}, adapter={"modules": ["q_proj"]},
        forced=True, sensitivity={"threshold": 0.031, "point": "layers.2.attn"})
    meta = {"k": 10.0, "floor": "hf@float64", "free_floor": "hf@float64-free", "forced": ["hf", "vllm"],
            "cases": ["p0"],
            "engines": {"hf": {"load_s": 1.5, "model_loads": 1, "versions": {"torch": "2.9"}}},
            "during_run": {"passes": ["hf"], "beside": ["vllm"]}, "notes": ["a note"],
            "localisations": [localisation.model_dump()]}  # as harness.explain.orchestrate writes it
    (tmp_path / "explain").mkdir()
    write_json(tmp_path / "explain" / "localisation.json", meta)
    assert read_json(tmp_path, "explain/localisation.json", ExplainFile).model_dump() == meta
