"""Every tiny family of harness.models.tiny through HF and vLLM, float32 greedy, by one `parity explain` each: HF
and vLLM generate the same tokens with logprobs within rounding; vLLM stays inside the noise floor at every capture
point of the family's map; and a 1% fault planted in an HF copy, at a layer and module the test draws with a seed,
is named exactly (layer and point). Prompt and generated tokens run past the families' 16-token sliding windows.

phi3 is left without a map on purpose: its explain works from the logits alone and names the missing maps."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from adapters.tracing.arch_maps import arch_map
from harness.models.tiny import FAMILIES

from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: tiny-{family}
model: tiny-{family}
dtype: float32
engines:
  hf: {{engine: hf, reference: true{hf_options}}}
  vllm: {{engine: vllm{vllm_extra}}}
{extra_engines}prompts:
  - "The quick brown fox jumps over the lazy dog while"
  - {{id: numbers, text: "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"}}
params: {{max_new_tokens: 16, ignore_eos: true}}
expect: {{tokens: exact, max_logprob_delta: 0.0001}}
"""

FAULT_MODULE = """\
def plant(model):
    \"\"\"Scale {path}'s output by 1.01.\"\"\"
    module = dict(model.named_modules())["{path}"]
    module.register_forward_hook(lambda _module, _args, out: out * 1.01)
"""

UNMAPPED_FAMILY = "phi3"  # no per-layer map in either engine: its explain works at the logits
# HF's sdpa attention skips Gemma 2's attention soft-capping (only its eager attention applies it), so HF runs eager
# where the family soft-caps, and its sdpa attention is an engine of its own, whose difference explain must find
HF_OPTIONS = {"gemma2": {"attn_implementation": "eager"}}
EXTRA_ENGINES = {"gemma2": "  hf-sdpa: {engine: hf, options: {attn_implementation: sdpa}}\n"}
SEED = 27


def planted_fault(family: str) -> tuple[int, str, str]:
    """(layer, point, module path) of the fault for a family: a per-layer module of HF's map whose output is a
    capture point, drawn with a seed."""
    arch = arch_map("hf", FAMILIES[family].model_type)
    taps = [t for t in arch.per_layer if t.take == "output" and t.module]
    rng = random.Random(f"{SEED}-{family}")
    layer, tap = rng.randrange(2), rng.choice(taps)
    return layer, tap.points[0], f"{arch.layers}.{layer}.{tap.module}"


def expected_points(family: str) -> set[str]:
    """The capture points of HF's map for a 2-layer model of the family, rope derived where the family has it."""
    arch = arch_map("hf", FAMILIES[family].model_type)
    per_layer = {p for t in arch.per_layer for p in t.points} | ({"q_rope", "k_rope"} if arch.rope else set())
    return {"embeddings", "final_norm", "logits"} | {f"layers.{layer}.{p}" for layer in range(2) for p in per_layer}


def explain(family: str, tmp_path, extra_engines: str = "", vllm_extra: str = "") -> ParityRun:
    options = HF_OPTIONS.get(family, {})
    hf_options = f", options: {json.dumps(options)}" if options else ""
    scenario = SCENARIO.format(family=family, hf_options=hf_options, vllm_extra=vllm_extra,
                               extra_engines=extra_engines)
    run = parity("explain", str(write_scenario(tmp_path / "tiny.yaml", scenario)), "--case", "p0",
                 out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


def localisations(run: ParityRun) -> dict[str, dict]:
    data = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    return {loc["engine"]: loc for loc in data["localisations"]}


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {UNMAPPED_FAMILY}))
def test_family_matches_stays_in_the_floor_and_a_planted_fault_is_named(family: str, tmp_path) -> None:
    layer, point, path = planted_fault(family)
    (tmp_path / "tiny_faults.py").write_text(FAULT_MODULE.format(path=path))
    options = {**HF_OPTIONS.get(family, {}), "patch": "tiny_faults:plant"}
    run = explain(family, tmp_path, f"  fault: {{engine: hf, options: {json.dumps(options)}, "
                                    "expect: {tokens: any}}\n" + EXTRA_ENGINES.get(family, ""))
    verdicts = run.verdicts[run.verdicts.engine == "vllm"]
    assert set(verdicts.verdict) == {"match"}, verdicts.explanation.tolist()
    results = run.results
    assert results.token_ids.map(len).eq(16).all() and results.prompt_ids.map(len).min() >= 10
    found = localisations(run)
    assert found["vllm"]["cause"] == "none", found["vllm"]["verdict"]
    points = pd.read_parquet(run.run_dir / "explain" / "points.parquet")
    vllm = points[points.engine == "vllm"]
    assert not vllm.leaves_floor.any(), vllm[vllm.leaves_floor]
    assert set(vllm.point) == expected_points(family)  # vLLM's map yields every point of HF's
    fault = found["fault"]
    assert fault["cause"] == "component", (path, fault["verdict"])
    assert fault["out_of_floor"]["point"] == f"layers.{layer}.{point}", (path, fault["verdict"])
    if family == "gemma2":  # HF's default attention drops the attention soft cap: its kernel is named, from the
        # second position on (the first attends to itself alone); this tiny model's tokens still agree
        sdpa = found["hf-sdpa"]
        assert sdpa["cause"] == "component" and sdpa["out_of_floor"]["point"] == "layers.0.attn", sdpa["verdict"]
        assert "attention kernel" in sdpa["verdict"] and sdpa["out_of_floor"]["first_position"] == 1


def test_a_family_without_a_map_matches_is_explained_and_drift_measured_at_the_logits(tmp_path) -> None:
    """phi3 has no per-layer map in either engine: its run matches like the other families', and explain, and the
    drift verdict of that run, work from the logits of each engine's own output; the notes name the missing maps."""
    run = explain(UNMAPPED_FAMILY, tmp_path,
                  vllm_extra=", drift: {max_mean_kld: 1.0e-6, min_top1_agreement: 1.0}")
    assert set(run.verdicts.verdict) == {"match"}, run.verdicts.explanation.tolist()
    explain_meta = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    notes = " ".join(explain_meta["notes"])
    for engine in ("hf", "vllm"):
        assert f"no {engine} architecture map for model type 'phi3'" in notes, notes
    assert "compared at the logits only" in notes and "docs/adding-an-architecture.md" in notes
    assert {loc["cause"] for loc in explain_meta["localisations"]} == {"none"}, explain_meta["localisations"]
    points = pd.read_parquet(run.run_dir / "explain" / "points.parquet")
    assert set(points.point) == {"logits"} and not points.leaves_floor.any()
    drift = pd.read_parquet(run.run_dir / "drift.parquet")
    assert drift.ok.all() and drift.mean_kld.max() < 1e-6
    assert "no hf architecture map" in (run.run_dir / "explain" / "summary.md").read_text()
