"""Quantised KV caches as drift (scenarios/kv-cache.yaml): llama.cpp with its cache in q8_0 (K and V, or K alone) and
q4_0, vLLM with its cache in fp8, each judged by the drift family against the same engine with a full cache. One run
serves the module."""

from __future__ import annotations

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> ParityRun:
    return parity("run", str(SCENARIOS / "kv-cache.yaml"), out=tmp_path_factory.mktemp("kv-cache"))


def test_each_quantised_cache_is_judged_against_the_full_cache(run: ParityRun) -> None:
    assert run.code == 0, run.stdout[-3000:]
    drift = pd.read_parquet(run.run_dir / "drift.parquet")
    assert set(drift.against) == {"kv-f32", "vllm"} and drift.expected.all()
    kld = drift.pivot(index="case_id", columns="engine", values="mean_kld")
    assert (kld > 0).all().all(), kld  # every quantised cache moves the distribution
    assert (kld["kv-q4_0"] > 10 * kld["kv-q8_0"]).all(), kld  # and q4_0 by an order of magnitude more than q8_0
    assert (kld[["kv-q8_0", "k-q8_0"]] < 0.002).all().all(), kld
    assert (kld["vllm-fp8"] > kld["kv-q8_0"]).all(), kld  # fp8 (3 mantissa bits) loses more than q8_0


def test_the_cache_that_ran_is_recorded(run: ParityRun) -> None:
    versions = {name: engine["versions"] for name, engine in run.meta["engines"].items() if name != "hf"}
    assert versions.pop("vllm")["kv_cache"] == "auto" and versions.pop("vllm-fp8")["kv_cache"] == "fp8"
    assert {name: (v["kv_cache"], v["flash_attn"]) for name, v in versions.items()} == {
        "kv-f32": ("f32", "on"), "kv-q8_0": ("q8_0", "on"), "k-q8_0": ("K q8_0, V f32", "off"),
        "kv-q4_0": ("q4_0", "on")}
