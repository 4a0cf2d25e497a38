"""The rest of the commands on gemma3-270m float32, HF against vLLM: beam search run on the Ray executor, a baseline
saved from that run and `parity gate` run locally against it (it passes only if the local run gives the Ray run's
tokens), `parity report` of the gate's run, and vLLM's invariance knobs prefix_cache and chunked_prefill on a
599-token prompt, past the 512-token sliding window. Three runs, one engine load per configuration."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

BEAMS = """\
name: gemma3-beams
model: gemma3-270m
dtype: float32
threads: 1
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm}
prompts:
  - {id: capital, text: "The capital of France is"}
  - {id: story, text: "Once upon a time, in a small village by the sea,"}
params: {temperature: 0, max_new_tokens: 8, num_beams: 2, num_return_sequences: 2, length_penalty: 0.0}
"""

INVARIANCE = f"""\
name: gemma3-invariance
model: gemma3-270m
dtype: float32
threads: 1
engines:
  hf: {{engine: hf, reference: true}}
  vllm:
    engine: vllm
    options: {{prefix_caching: false, chunked_prefill: false}}
    invariance: [prefix_cache, chunked_prefill]
prompts:
  - {{id: capital, text: "The capital of France is"}}
  - file: {SCENARIOS / "gemma3-long-prompt.jsonl"}
params: {{temperature: 0, max_new_tokens: 8}}
"""


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gemma3-workflow")


@pytest.fixture(scope="module")
def on_ray(tmp: Path) -> ParityRun:
    """Started without --ray-address: a Ray instance of its own on this machine."""
    return parity("run", str(write_scenario(tmp / "beams.yaml", BEAMS)), "--executor", "ray", out=tmp / "ray")


@pytest.fixture(scope="module")
def gated(tmp: Path, on_ray: ParityRun) -> ParityRun:
    saved = parity("baseline", "save", str(on_ray.run_dir), "--to", str(tmp / "baselines"))
    assert saved.code == 0, saved.stderr[-2000:]
    return parity("gate", str(tmp / "beams.yaml"), "--baseline", str(tmp / "baselines"), "--junit",
                  str(tmp / "junit.xml"), out=tmp / "gate")


def test_beam_search_on_ray_returns_every_engines_beams(on_ray: ParityRun) -> None:
    assert on_ray.code == 0, on_ray.stderr[-3000:]
    beams = pd.read_parquet(on_ray.run_dir / "beams.parquet")
    assert beams.groupby(["engine", "case_id"]).size().to_dict() == {
        (engine, case): 2 for engine in ("hf", "vllm") for case in ("capital", "story")}
    assert list(on_ray.verdicts["verdict"]) == ["match", "match"]
    assert on_ray.verdicts["explanation"].str.contains("same 2 beams").all()
    for engine in ("hf", "vllm"):  # each engine ran as a Ray actor
        actor = json.loads((on_ray.run_dir / "engines" / engine / "actor.json").read_text())[0]
        assert actor["node_id"] and actor["model_path"].endswith("gemma3-270m/float32")


def test_gate_passes_locally_against_the_ray_runs_baseline(gated: ParityRun, tmp: Path) -> None:
    assert gated.code == 0, gated.stdout[-3000:]
    suite = ET.parse(tmp / "junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"


def test_report_of_the_gate_run_shows_the_beam_verdicts(gated: ParityRun) -> None:
    report = parity("report", str(gated.run_dir))
    assert report.code == 0, report.stderr[-2000:]
    html = (gated.run_dir / "report.html").read_text()
    assert "gemma3-beams" in html and "same 2 beams" in html


def test_prefix_cache_and_chunked_prefill_past_the_window_keep_the_tokens(tmp: Path) -> None:
    run = parity("run", str(write_scenario(tmp / "invariance.yaml", INVARIANCE)), out=tmp / "invariance")
    assert run.code == 0, run.stdout[-3000:]
    assert len(run.results.set_index(["engine", "case_id"]).loc[("hf", "lighthouse"), "prompt_ids"]) > 512
    knobs = pd.read_parquet(run.run_dir / "invariance.parquet").set_index("knob")
    for knob in ("prefix_cache", "chunked_prefill"):
        assert knobs.loc[knob, "verdict"] in ("identical", "tokens_identical"), knobs.loc[knob, "explanation"]
        assert knobs.loc[knob, "cases"] == 2
    assert knobs.loc["control", "verdict"] == "diverged"  # the negative control: the comparison can fail
