"""The architecture-map contract, proven by a family mapped by following docs/adding-an-architecture.md: Phi-3, whose
HF checkpoint fuses q/k/v and gate/up (a layout of its own, not a Llama alias), is mapped by examples/phi3-map,
pip-installed as its own package (into a private target directory, registered through the `llm_parity.arch_maps`
entry point). With it, tiny-phi3's explain localises per layer: vLLM stays in the floor at every point and a fault
planted in HF at a seeded layer and module is named exactly; without it the family is explained at the logits
(test_tiny_families.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from family_explain import VLLM, expected_points, explain, fault_engine, localisations, planted_fault

from helpers import ROOT

pytestmark = pytest.mark.engines

PACKAGE = ROOT / "examples" / "phi3-map"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("arch-map-plugin")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target), str(PACKAGE)],
                   check=True, timeout=300, capture_output=True)
    assert (target / "parity_phi3_map-0.1.0.dist-info" / "entry_points.txt").exists()
    return target


@pytest.fixture()
def with_plugin(plugin_path: Path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugin_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(plugin_path))
    yield


def test_a_family_mapped_from_outside_the_project_is_localised_per_layer(with_plugin, tmp_path) -> None:
    from parity_phi3_map import HF

    layer, point, path = planted_fault("phi3", HF)
    run = explain("phi3", tmp_path, engines=VLLM + fault_engine(tmp_path, "phi3", path, {}))
    assert set(run.verdicts[run.verdicts.engine == "vllm"].verdict) == {"match"}
    found = localisations(run)
    assert found["vllm"]["cause"] == "none", found["vllm"]["verdict"]
    points = pd.read_parquet(run.run_dir / "explain" / "points.parquet")
    vllm = points[points.engine == "vllm"]
    assert set(vllm.point) == expected_points(HF) and not vllm.leaves_floor.any(), vllm[vllm.leaves_floor]
    assert found["fault"]["cause"] == "component", (path, found["fault"]["verdict"])
    assert found["fault"]["out_of_floor"]["point"] == f"layers.{layer}.{point}", (path, found["fault"]["verdict"])
    meta = run.run_dir / "engines" / "hf" / "traces" / "p0.safetensors"
    from safetensors import safe_open

    with safe_open(str(meta), "pt") as trace:
        assert trace.metadata()["arch"] == "hf-phi3" and trace.metadata()["fused"] == "q,k,v,gate,up"
