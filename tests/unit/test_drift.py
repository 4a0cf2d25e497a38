"""Quantisation drift measures (llama.cpp's perplexity --kl-divergence definitions) and their verdict."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from harness.compare import drift_rules
from harness.core.errors import ConfigError
from harness.scenario.spec import load

from helpers import write_scenario


def test_identical_logits_have_no_drift() -> None:
    logits = np.random.default_rng(0).normal(size=(6, 50))
    tokens = drift_rules.token_drift(logits, logits.copy(), np.arange(6))
    stats = drift_rules.summarize(tokens)
    assert stats.mean_kld == pytest.approx(0, abs=1e-12) and stats.top1_agreement == 1.0
    assert stats.rms_delta_p == pytest.approx(0, abs=1e-12) and stats.ln_ppl_ratio == pytest.approx(0, abs=1e-12)
    assert stats.ppl == pytest.approx(stats.ppl_base)


def test_measures_of_one_known_pair() -> None:
    """P = (0.6, 0.4), Q = (0.3, 0.7), the text's token is 1: KL(P||Q) = 0.6 ln 2 + 0.4 ln(4/7), the tops differ,
    delta p = Q(1) - P(1) = 0.3."""
    base, other = np.log([[0.6, 0.4]]), np.log([[0.3, 0.7]])
    tokens = drift_rules.token_drift(base, other, np.array([1]))
    assert tokens.kld[0] == pytest.approx(0.6 * math.log(2) + 0.4 * math.log(4 / 7))
    assert not tokens.same_top[0] and tokens.delta_p[0] == pytest.approx(0.3)
    assert tokens.nll[0] == pytest.approx(-math.log(0.7)) and tokens.nll_base[0] == pytest.approx(-math.log(0.4))
    assert drift_rules.summarize(tokens).ln_ppl_ratio == pytest.approx(math.log(0.4 / 0.7))


def test_percentiles_interpolate_between_ranks_as_llama_cpp_does() -> None:
    """llama.cpp: p = fraction * (n - 1), value = (1 - frac(p)) v[floor p] + frac(p) v[floor p + 1]."""
    kld = np.linspace(0.0, 1.0, 11) ** 2  # 11 sorted values
    per_token = drift_rules.TokenDrift(kld, np.ones(11, bool), np.zeros(11), np.ones(11), np.ones(11))
    stats = drift_rules.summarize(per_token)
    p = 0.99 * 10
    expected = (1 - (p - 9)) * kld[9] + (p - 9) * kld[10]
    assert stats.p99_kld == pytest.approx(expected) and stats.max_kld == 1.0 and stats.median_kld == kld[5]


def test_verdict_names_each_threshold_crossed_and_every_measure() -> None:
    stats = drift_rules.DriftStats(tokens=32, mean_kld=0.05, median_kld=0.01, p99_kld=0.4, max_kld=0.5,
                             top1_agreement=0.75, mean_delta_p=-0.01, rms_delta_p=0.08, ppl=3.5, ppl_base=3.2,
                             ln_ppl_ratio=0.09)
    thresholds = {"max_mean_kld": 0.1, "max_p99_kld": 0.2, "min_top1_agreement": 0.9}
    ok, text = drift_rules.judge(stats, thresholds, "q4", "f32")
    assert not ok
    assert "p99 KLD 0.4 > 0.2" in text and "top-1 agreement 0.75 < 0.9" in text and "mean KLD 0.05 >" not in text
    assert "q4 vs f32 over 32 tokens" in text and "PPL 3.5 vs 3.2" in text
    ok, text = drift_rules.judge(stats, {}, "q4", "f32")  # no thresholds: reported, not checked
    assert ok and text.startswith("quantisation drift within the scenario's thresholds")


DRIFT_SCENARIO = """\
model: tiny-llama
engines:
  hf: {engine: hf, reference: true}
  f32: {engine: llama.cpp}
  q8: {engine: llama.cpp, options: {gguf: q8_0}, drift: {against: f32, max_mean_kld: 0.01}}
prompts: ["hello"]
"""


def test_drift_blocks_are_validated(tmp_path: Path) -> None:
    scenario = load(write_scenario(tmp_path / "ok.yaml", DRIFT_SCENARIO))
    assert scenario.spec.drift_baseline("q8") == "f32" and scenario.spec.drift_baseline("f32") is None
    for old, new, words in (
            ("against: f32", "against: nosuch", "drift baseline 'nosuch' must be another engine of this scenario"),
            ("against: f32", "against: q8", "drift baseline 'q8' must be another engine"),
            ("max_mean_kld: 0.01", "max_mean_klds: 0.01", "engines.q8.drift.max_mean_klds: unknown key"),
            ("q8: {engine: llama.cpp, options: {gguf: q8_0}", "q8: {engine: llama.cpp-server, options: {gguf: q8_0}",
             "cannot give full logits over a text")):
        with pytest.raises(ConfigError, match=words):
            load(write_scenario(tmp_path / "bad.yaml", DRIFT_SCENARIO.replace(old, new)))
