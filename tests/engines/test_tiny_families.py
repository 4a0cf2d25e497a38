"""Every tiny family of harness.models.tiny through HF and vLLM, float32 greedy: the same tokens, logprobs within
rounding. One `parity run` per family (one engine load each), past the families' 16-token sliding windows."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.models.tiny import FAMILIES

from helpers import parity, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: tiny-{family}
model: tiny-{family}
dtype: float32
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
prompts:
  - "The quick brown fox jumps over the lazy dog while"
  - {{id: numbers, text: "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"}}
params: {{max_new_tokens: 16, ignore_eos: true}}
expect: {{tokens: exact, max_logprob_delta: 0.0001}}
"""


UNMAPPED_FAMILY = "phi3"  # no per-layer map in either engine: its run is the explain test's below


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {UNMAPPED_FAMILY}))
def test_hf_and_vllm_match_on_the_tiny_family(family: str, tmp_path) -> None:
    run = parity("run", str(write_scenario(tmp_path / "tiny.yaml", SCENARIO.format(family=family))),
                 out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = run.verdicts
    assert set(verdicts.verdict) == {"match"}, verdicts.explanation.tolist()
    results = run.results
    assert results.token_ids.map(len).eq(16).all() and results.prompt_ids.map(len).min() >= 10


def test_a_family_without_a_map_matches_is_explained_and_drift_measured_at_the_logits(tmp_path) -> None:
    """phi3 has no per-layer map in either engine: its run matches like the other families', and explain, and the
    drift verdict of that run, work from the logits of each engine's own output; the notes name the missing maps."""
    scenario = SCENARIO.format(family=UNMAPPED_FAMILY).replace(
        "vllm: {engine: vllm}", "vllm: {engine: vllm, drift: {max_mean_kld: 1.0e-6, min_top1_agreement: 1.0}}")
    run = parity("explain", str(write_scenario(tmp_path / "unmapped.yaml", scenario)), out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert set(run.verdicts.verdict) == {"match"}, run.verdicts.explanation.tolist()
    explain = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    notes = " ".join(explain["notes"])
    for engine in ("hf", "vllm"):
        assert f"no {engine} architecture map for model type 'phi3'" in notes, notes
    assert "compared at the logits only" in notes
    assert {loc["cause"] for loc in explain["localisations"]} == {"none"}, explain["localisations"]
    points = pd.read_parquet(run.run_dir / "explain" / "points.parquet")
    assert set(points.point) == {"logits"} and not points.leaves_floor.any()
    drift = pd.read_parquet(run.run_dir / "drift.parquet")
    assert drift.ok.all() and drift.mean_kld.max() < 1e-6
    assert "no hf architecture map" in (run.run_dir / "explain" / "summary.md").read_text()
