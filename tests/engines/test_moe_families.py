"""The tiny mixture-of-experts families (issue 58) in HF and vLLM's CPU build: they agree token for token in
float32, routers with near ties included, and `parity explain` captures the router logits, the shared expert and the
block's output in both engines, keeps the clean pair inside the noise floor (the float64 floor runs HF's
experts eagerly: its grouped matmul takes no float64) and names an expert's down projection scaled by 1.01 with its
layer. One `parity explain` of a scenario per family, the HF and vLLM workers shared across them."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.models.tiny import FAMILIES

from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

MOE = sorted(name for name, family in FAMILIES.items() if family.experts)
SHARED = ("qwen2_moe", "glm4_moe")  # a shared expert beside the routed ones
FAULT_LAYER, FAULT_EXPERT = 1, 0  # expert 0 wins at about half of the positions (its router row is a, expert 1's -a)
FAULT = """\
def plant(model):
    \"\"\"Scale expert {expert}'s down projection in layer {layer} by 1.01.\"\"\"
    experts = model.model.layers[{layer}].mlp.experts
    experts.down_proj.data[{expert}] *= 1.01
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ParityRun]:
    tmp = tmp_path_factory.mktemp("moe")
    (tmp / "moe_fault.py").write_text(FAULT.format(layer=FAULT_LAYER, expert=FAULT_EXPERT))
    fault = '  fault: {engine: hf, options: {patch: "moe_fault:plant"}, expect: {tokens: any}}\n'
    files = [write_scenario(tmp / f"{family}.yaml", f"""\
name: tiny-{family}
model: tiny-{family}
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
{fault}prompts:
  - {{id: p0, text: "The capital of France is a city of art, history and food. Once upon a time"}}
params: {{temperature: 0, max_new_tokens: 12, ignore_eos: true}}
""") for family in MOE]
    run = parity("explain", *map(str, files), out=tmp / "out")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {d.name.split("-tiny-", 1)[1]: ParityRun(run.code, run.stdout, run.stderr, d)
            for d in sorted((tmp / "out").iterdir())}


def located(run: ParityRun) -> dict[str, dict]:
    return {loc["engine"]: loc for loc in json.loads(
        (run.run_dir / "explain" / "localisation.json").read_text())["localisations"]}


@pytest.mark.parametrize("family", MOE)
def test_hf_and_vllm_agree_on_the_moe_family(runs: dict[str, ParityRun], family: str) -> None:
    verdicts = runs[family].verdicts.set_index("engine")
    assert verdicts.loc["vllm"].verdict == "match", verdicts.loc["vllm"].explanation


@pytest.mark.parametrize("family", MOE)
def test_explain_reads_the_router_and_the_experts(runs: dict[str, ParityRun], family: str) -> None:
    found = located(runs[family])
    assert found["vllm"]["cause"] == "none", found["vllm"]["verdict"]  # no false alarm on the clean pair
    fault = found["fault"]
    assert fault["cause"] == "component", fault["verdict"]
    assert fault["out_of_floor"]["point"] == f"layers.{FAULT_LAYER}.moe", fault["verdict"]
    assert "Candidate cause: MoE experts" in fault["verdict"]
    points = pd.read_parquet(runs[family].run_dir / "explain" / "points.parquet")
    for engine in ("vllm", "fault"):  # both engines' routers and blocks captured, in every layer
        captured = set(points[points.engine == engine].point)
        wanted = ("router", "moe", "shared_expert") if family in SHARED else ("router", "moe")
        assert {f"layers.{n}.{p}" for n in (0, 1) for p in wanted} <= captured, engine
