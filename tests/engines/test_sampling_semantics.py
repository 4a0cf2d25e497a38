"""Sampling semantics, from the engines' own code: effective params (`parity params`), the sampler transplant
(`parity transplant`), sampling parity (seeded samples, G-test) and the fp16 temperature hazard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SCENARIOS, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines


def transplant_verdicts(run: ParityRun) -> dict[tuple[str, str], dict]:
    data = json.loads((run.run_dir / "transplant" / "verdicts.json").read_text())
    return {(v["case_id"], v["engine"]): v for v in data}


def cells(stdout: str) -> dict[str, list[str]]:
    """param -> its cells (one per engine, then the differs marker) from `parity params` output (not a terminal:
    Markdown rows, every cell whole)."""
    table = {}
    for line in stdout.splitlines():
        if line.startswith("| ") and not line.startswith("| param "):
            parts = [c.strip() for c in line.strip().strip("|").split(" | ")]
            table[parts[0]] = parts[1:]
    return table


def test_params_shows_generation_config_defaults_per_engine() -> None:
    run = parity("params", str(SCENARIOS / "generation-config-defaults.yaml"), "--all")
    assert run.code == 0, run.stderr[-2000:]
    text = " ".join(run.stdout.split())
    assert "hf: repetition_penalty=1.1 from the model's generation_config.json" in text
    assert ("vllm-server-auto: repetition_penalty=1.1 from the model's generation_config.json (server "
            "--generation-config auto)") in text
    assert "lmdeploy-server: repetition_penalty=1.1 from the model's generation_config.json" in text
    assert "lmdeploy: do_sample false: lmdeploy decodes greedily as top_k=1" in text
    table = cells(run.stdout)  # engines: hf, vllm, vllm-server-auto, lmdeploy, lmdeploy-server
    assert table["repetition_penalty"] == ["1.1", "1", "1.1", "1", "1.1", "DIFFERS"]
    assert table["repetition_scope"][-1] == "DIFFERS"  # lmdeploy-server counts generated tokens only
    assert table["decoding"] == ["greedy"] * 5 + [""]


def test_params_shows_pipeline_greedy_and_servers_sampling_by_default() -> None:
    run = parity("params", str(SCENARIOS / "do-sample-defaults.yaml"))
    assert run.code == 0, run.stderr[-2000:]
    table = cells(run.stdout)  # engines: hf, lmdeploy, lmdeploy-server, vllm-server
    assert table["decoding"] == ["greedy", "greedy", "sampling", "sampling", "DIFFERS"]
    assert table["temperature"][:4] == ["-", "1", "0.8", "1"]
    assert table["top_k"][:4] == ["-", "1", "50", "0"]


def test_params_temperature_clamp_and_rejection_come_from_the_engines(tmp_path: Path) -> None:
    hazard = parity("params", str(SCENARIOS / "temperature-hazard.yaml"))
    assert "vllm: temperature 0.0003 raised to 0.01 (vLLM's minimum)" in " ".join(hazard.stdout.split())
    bad = write_scenario(tmp_path / "hot.yaml", (SCENARIOS / "temperature-hazard.yaml").read_text()
                         .replace("temperature: 0.0003", "temperature: 3.0"))
    refused = parity("params", str(bad))
    assert refused.code == 2
    text = " ".join(refused.stdout.split())
    assert "rejected by vllm: temperature must be in [0, 2], got 3.0" in text  # vLLM's own validation
    assert "rejected by lmdeploy pipeline: temperature 3.0 is outside [0, 2]" in text  # lmdeploy's assertion
    # The run's preflight (declared ranges) refuses the same, before any engine starts, in one line.
    run = parity("run", str(bad), out=tmp_path / "reports")
    assert run.code == 2 and "Traceback" not in run.stderr
    assert "rejected by vllm: temperature must be in [0, 2], got 3.0" in run.stderr
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


@pytest.fixture(scope="module")
def penalty_transplant(tmp_path_factory) -> ParityRun:
    return parity("transplant", str(SCENARIOS / "penalty-semantics.yaml"), "--case", "list",
                  out=tmp_path_factory.mktemp("transplant"))


def test_transplant_names_the_penalty_whose_semantics_differ(penalty_transplant: ParityRun) -> None:
    assert penalty_transplant.code == 1, penalty_transplant.stderr[-2000:]
    verdicts = transplant_verdicts(penalty_transplant)
    assert verdicts[("list", "vllm-repetition")]["cause"] == "agree"
    frequency = verdicts[("list", "vllm-frequency")]
    assert frequency["cause"] == "sampler"
    assert set(frequency["params"]) == {"repetition_penalty", "frequency_penalty"}
    presence = verdicts[("list", "vllm-presence")]
    assert presence["cause"] == "sampler" and "presence_penalty" in presence["params"]
    lmdeploy = verdicts[("list", "lmdeploy")]  # lmdeploy's own FusedLogitsProcessor, on CPU
    assert lmdeploy["cause"] == "sampler" and lmdeploy["params"] == ["repetition_penalty"]
    assert "hf counts prompt and output tokens, lmdeploy counts generated tokens only" in lmdeploy["verdict"]


def test_transplant_reproduces_the_fp16_temperature_overflow(tmp_path: Path) -> None:
    run = parity("transplant", str(SCENARIOS / "temperature-hazard.yaml"), out=tmp_path / "reports")
    assert run.code == 1, run.stderr[-2000:]
    verdicts = transplant_verdicts(run)
    lmdeploy = verdicts[("capital", "lmdeploy")]
    assert lmdeploy["cause"] == "hazard"
    ops = {h["op"]: h for h in lmdeploy["hazards"]}
    assert any("temperature division (in float16)" in op and h["+inf"] > 0 for op, h in ops.items())
    assert ops["softmax"]["nan"] > 0
    assert "probability tensor contains either `inf`, `nan` or element < 0" in ops["multinomial sampling"]["error"]
    assert "hf (sampling in float32) has none on the same logits" in lmdeploy["verdict"]
    assert "any temperature below max_logit/65504" in lmdeploy["verdict"]
    assert verdicts[("capital", "vllm")]["cause"] == "agree"  # vLLM upcasts to float32 too


SHIPPED_SAMPLES, SAMPLES = 2000, 1200


@pytest.fixture(scope="module")
def sampling_parity(tmp_path_factory) -> ParityRun:
    """The shipped scenario plus one engine 10% hotter, in one run: one HF sampling pass serves both checks. The
    hotter one is HF: it computes the prompt once for all samples where vLLM computes it for each, and what is under
    test is the G-test's verdict, whichever engine drew the samples. 1200 samples, not the scenario's 2000: vLLM's
    cost grows with them (the run 141 s of CPU against 219 s), and the hotter engine still stood out at two steps
    (p=3.4e-05 against their 0.005 threshold; p=0.0017 at 1000). One step, not the scenario's two: each decode
    step costs vLLM a pass over all samples (the run 108 s of CPU against 153 s), and the hotter engine stands out at
    the first token (p=7.1e-04 against the one step's 0.01; vLLM's p=0.38); tests/engines/test_invariance.py keeps a
    two-step test."""
    tmp = tmp_path_factory.mktemp("sampling")
    text = (SCENARIOS / "sampling-parity.yaml").read_text().replace(
        "prompts:", "  hf-hotter:\n    engine: hf\n    params: {temperature: 1.1}\nprompts:", 1)
    text = text.replace(f"samples: {SHIPPED_SAMPLES}", f"samples: {SAMPLES}", 1).replace("steps: 2", "steps: 1", 1)
    assert f"samples: {SAMPLES}" in text and "steps: 1" in text
    return parity("run", str(write_scenario(tmp / "sampling.yaml", text)), out=tmp / "reports")


def test_sampling_parity_hf_and_vllm_draw_from_the_same_distribution(sampling_parity: ParityRun) -> None:
    verdicts = sampling_parity.verdicts.set_index("engine")
    verdict = verdicts.loc["vllm"]
    assert verdict.verdict == "match" and "G-test" in verdict.explanation, sampling_parity.stdout[-3000:]
    samples = sampling_parity.results.set_index("engine").samples
    assert all(len(s) == SAMPLES for s in samples)
    assert len({tuple(x) for x in samples["vllm"]}) > 20  # really independent draws, not one repeated


def test_sampling_parity_fails_clearly_when_one_temperature_is_10_percent_off(sampling_parity: ParityRun) -> None:
    assert sampling_parity.code == 1
    hotter = sampling_parity.verdicts.set_index("engine").loc["hf-hotter"]
    assert hotter.verdict == "diverged"
    assert "sampling distributions differ in the first 1 token(s)" in hotter.explanation
    assert "temperature: 1.0 vs 1.1" in hotter.explanation


def test_generation_config_defaults_explain_an_hf_vllm_divergence(tmp_path: Path) -> None:
    run = parity("run", str(SCENARIOS / "generation-config-defaults.yaml"), "--engines", "hf,vllm,lmdeploy",
                 "--allow-missing", out=tmp_path / "reports")
    assert run.code == 1, run.stderr[-2000:]
    assert "skipped lmdeploy: engine lmdeploy needs a CUDA GPU" in " ".join(run.stdout.split())
    diverged = run.verdicts[run.verdicts.verdict == "diverged"]
    assert len(diverged) >= 1
    assert all("repetition_penalty: hf 1.1 (generation_config.json), vllm 1" in e for e in diverged.explanation)
    assert "skipped: engine lmdeploy needs a CUDA GPU" in (run.run_dir / "summary.md").read_text()
