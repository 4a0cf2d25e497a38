"""llama.cpp on Gemma 3 270M for real: the F32 GGUF written from HF's own tensors is the shipped Q4_K_M file
dequantised (metadata key for key, tensors bit for bit), llama.cpp F32 gives HF's greedy tokens with rounding-level
drift, the bundled Q4_K_M shows quantisation drift, and `parity explain` compares every Gemma capture point of HF and
llama.cpp: all stay within the noise floor up to layer 0's MLP, which leaves it because llama.cpp's CPU GELU is an
fp16 lookup table (ggml-cpu's GGML_GELU_FP16): layer 0's MLP recomputed from llama.cpp's own gate and up with that
table is within the floor of llama.cpp's output, with an exact GELU it is not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from adapters.engines import llamacpp_gguf
from harness import models
from harness.models import gguf_header
from harness.models.catalog import MODELS

from helpers import ParityRun, gguf_tensors, parity, write_scenario

pytestmark = pytest.mark.engines

SCENARIO = """\
name: gemma3-llamacpp
model: gemma3-270m
dtype: float32
threads: 1
engines:
  hf: {engine: hf, reference: true}
  llama.cpp-f32: {engine: llama.cpp, options: {gguf: f32}, drift: {max_mean_kld: 1.0e-6, min_top1_agreement: 1.0}}
  llama.cpp-q4_k_m: {engine: llama.cpp, options: {gguf: bundled}, expect: {tokens: any},
                     drift: {max_mean_kld: 0.25, max_p99_kld: 2.0, min_top1_agreement: 0.5}}
prompts:
  - {id: capital, text: "The capital of France is"}
  - {id: story, text: "Once upon a time, in a small village by the sea,"}
  - {id: list, text: "List the days of the week: Monday, Tuesday,"}
params: {temperature: 0, max_new_tokens: 16}
"""
DESCRIPTIVE = ("general.name", "general.type", "general.basename", "general.size_label", "general.license",
               "general.tags", "general.file_type", "general.quantization_version", "GGUF.kv_count")


@pytest.fixture(scope="module")
def folder() -> Path:
    return models.resolve("gemma3-270m", "float32")


@pytest.fixture(scope="module")
def explained(folder, tmp_path_factory) -> ParityRun:
    """Three greedy cases through HF, llama.cpp F32 and the shipped Q4_K_M, then explained (the cases where the
    Q4_K_M's tokens differ, else the first)."""
    tmp = tmp_path_factory.mktemp("gemma3-llamacpp")
    scenario = write_scenario(tmp / "gemma3-llamacpp.yaml", SCENARIO)
    return parity("explain", str(scenario), out=tmp / "reports")


def _localisations(run: ParityRun) -> dict[tuple[str, str], dict]:
    data = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    return {(loc["engine"], loc["case_id"]): loc for loc in data["localisations"]}


def test_the_f32_gguf_is_the_shipped_q4_k_m_dequantised(folder) -> None:
    """Every architecture and tokenizer key of the shipped file, with its value and type; the same tensors, one of
    each stored type equal to the shipped one dequantised (a norm: stored as 1 + w; q/k not permuted, Gemma's rope
    is NEOX)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    source, built = MODELS["gemma3-270m"].source_gguf(), llamacpp_gguf.ensure(folder, "f32")
    shipped_values, ours = gguf_header.read(source)[0], gguf_header.read(built)[0]
    keys = {k: value for k, value in shipped_values.items() if k not in DESCRIPTIVE}
    assert set(keys) == {k for k in ours if k not in DESCRIPTIVE}
    for key, value in keys.items():
        assert ours[key] == value, key  # its types and its value
    shipped, mine = gguf_tensors(source), gguf_tensors(built)
    assert set(mine) == set(shipped)
    one_per_type = {t.type: (name, t) for name, t in sorted(shipped.items(), key=lambda item: -item[1].elements)}
    assert set(one_per_type) == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}  # the smallest of each: F32 is a norm
    for name, tensor in one_per_type.values():
        expected = dequantize(tensor.data, GGMLQuantizationType[tensor.type]).reshape(-1)
        assert np.array_equal(mine[name].data.reshape(-1), expected), name
    config = json.loads((folder / "config.json").read_text())
    assert len(shipped_values["tokenizer.ggml.tokens"].value) == config["vocab_size"]  # nothing trimmed


def test_llama_cpp_f32_gives_hfs_tokens_with_rounding_drift(explained: ParityRun) -> None:
    assert explained.code == 0, explained.stdout[-3000:]
    verdicts = explained.verdicts.set_index(["engine", "case_id"])
    results = explained.results.set_index(["engine", "case_id"])
    for case in ("capital", "story", "list"):
        assert verdicts.loc[("llama.cpp-f32", case), "verdict"] == "match", verdicts.loc[("llama.cpp-f32", case)]
        assert list(results.loc[("llama.cpp-f32", case), "token_ids"]) == list(results.loc[("hf", case), "token_ids"])
    drift = pd.read_parquet(explained.run_dir / "drift.parquet").set_index(["engine", "case_id"])
    f32 = drift.loc["llama.cpp-f32"]
    assert f32.expected.all() and (f32.against == "hf").all() and (f32.top1_agreement == 1.0).all()
    weights = explained.meta["engines"]["llama.cpp-f32"]["versions"]["weights"]
    assert weights.startswith("gemma3 270M") and weights.endswith("all F32")


def test_the_shipped_q4_k_m_shows_quantisation_drift(explained: ParityRun) -> None:
    drift = pd.read_parquet(explained.run_dir / "drift.parquet").set_index(["engine", "case_id"])
    q4, f32 = drift.loc["llama.cpp-q4_k_m"], drift.loc["llama.cpp-f32"]
    assert q4.expected.all() and (q4.against == "hf").all()
    assert (q4.mean_kld > 100 * f32.mean_kld).all()  # quantisation, orders of magnitude above rounding
    assert "Q4_K - Medium" in explained.meta["engines"]["llama.cpp-q4_k_m"]["versions"]["weights"]
    for (engine, _), located in _localisations(explained).items():
        if engine == "llama.cpp-q4_k_m":
            assert located["cause"] == "component" and located["out_of_floor"]["layer"] == 0


def test_explain_compares_every_gemma_point_and_finds_llama_cpps_fp16_gelu(explained: ParityRun, folder) -> None:
    points = pd.read_parquet(explained.run_dir / "explain" / "points.parquet")
    located = _localisations(explained)
    cases = points.case_id.unique()
    assert len(cases) >= 1
    for case in cases:
        f32 = points[(points.engine == "llama.cpp-f32") & (points.case_id == case)].reset_index(drop=True)
        assert len(f32) == 1 + 18 * 17 + 2  # embeddings, 17 points in each of 18 layers, final norm, logits
        first = int(np.flatnonzero(f32.leaves_floor.to_numpy())[0])
        assert f32.point[first] == "layers.0.mlp", f32.head(first + 1)  # q/k norms, rope, sandwich norms: within
        assert located[("llama.cpp-f32", case)]["out_of_floor"]["point"] == "layers.0.mlp"
        trace = explained.run_dir / "engines" / "llama.cpp-f32" / "traces" / f"{case}.safetensors"
        exact, table = _mlp_errors(trace, folder)
        assert table < float(f32.threshold[first]) < exact, (table, f32.threshold[first], exact)


def _mlp_errors(trace: Path, folder: Path) -> tuple[float, float]:
    """Layer 0's MLP recomputed from llama.cpp's own gate and up activations, with an exact GELU-tanh and with
    ggml-cpu's (vec.h ggml_vec_geglu_f32: the gate rounded to fp16, its GELU read from an fp16 table, 0 below -10,
    identity above 10): the worst position's relative error of each against llama.cpp's MLP output."""
    import torch
    from safetensors import safe_open

    with safe_open(str(trace), framework="pt") as f:
        gate, up, mlp = (f.get_tensor(f"layers.0.{p}") for p in ("gate", "up", "mlp"))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        down = f.get_tensor("model.layers.0.mlp.down_proj.weight").double()
    gelu = lambda x: torch.nn.functional.gelu(x, approximate="tanh")  # noqa: E731
    table = torch.where(gate <= -10, 0.0, torch.where(gate >= 10, gate, gelu(gate.half().float()).half().float()))

    def error(activation: torch.Tensor) -> float:
        out = (activation * up).double() @ down.T
        return float(((out - mlp.double()).norm(dim=1) / mlp.double().norm(dim=1)).max())

    return error(gelu(gate)), error(table)
