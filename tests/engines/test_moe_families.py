"""The tiny mixture-of-experts families (issue 58) in HF and vLLM's CPU build: they agree token for token in
float32, routers with near ties included, and `parity explain` captures the router logits, the shared expert, the
block's output and the chosen experts in both engines, keeps the clean pair inside the noise floor with every
(layer, position) routed alike (the float64 floor runs HF's experts eagerly: its grouped matmul takes no float64), and
names three faults planted in HF copies with their layer and kind:
- weighting: the chosen experts' weights not renormalised where the family renormalises them, renormalised where it
  does not (the sglang#35160 class);
- routing_rule: the experts chosen from the router logits shifted all-negative by a maximum search that starts at 0,
  a rule that is not invariant to a constant shift (the vllm#38859 class; the router logits themselves unchanged);
- expert_kernel: one expert's down projection scaled by 1.01.
One `parity explain` of a scenario per family, the HF and vLLM workers shared across them."""

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
FAULTS = '''\
LAYER, EXPERT = {layer}, {expert}


def _scores(model, logits):
    """The family's own selection scores (GLM-4.5: sigmoid; the others: softmax)."""
    return logits.float().sigmoid() if model.config.model_type == "glm4_moe" else logits.float().softmax(-1)


def _renormalises(model):
    return model.config.model_type != "qwen2_moe"


def weighting(model):
    """Layer LAYER's router weights renormalised where the family does not, left raw where it does."""
    def hook(module, args, out):
        logits, weights, ids = out
        raw = _scores(model, logits).gather(1, ids)
        raw = raw * getattr(module, "routed_scaling_factor", 1.0)
        return logits, (raw if _renormalises(model) else raw / raw.sum(-1, keepdim=True)).to(weights.dtype), ids
    model.model.layers[LAYER].mlp.gate.register_forward_hook(hook)


def shifted_rule(model):
    """Layer LAYER's experts chosen from the router logits shifted all-negative by a maximum search starting at 0."""
    def hook(module, args, out):
        logits, weights, ids = out
        shifted = logits - logits.max(-1, keepdim=True).values - 1.0
        chosen = shifted.clamp(min=0.0).topk(ids.shape[1], dim=-1).indices
        picked = _scores(model, logits).gather(1, chosen)
        if _renormalises(model):
            picked = picked / picked.sum(-1, keepdim=True)
        return logits, picked.to(weights.dtype), chosen
    model.model.layers[LAYER].mlp.gate.register_forward_hook(hook)


def expert(model):
    """Expert EXPERT's down projection in layer LAYER scaled by 1.01."""
    model.model.layers[LAYER].mlp.experts.down_proj.data[EXPERT] *= 1.01
'''
KIND = {"weighting": "weighting", "shifted_rule": "routing_rule", "expert": "expert_kernel"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ParityRun]:
    tmp = tmp_path_factory.mktemp("moe")
    (tmp / "moe_faults.py").write_text(FAULTS.format(layer=FAULT_LAYER, expert=FAULT_EXPERT))
    faults = "".join(f'  {fault}: {{engine: hf, options: {{patch: "moe_faults:{fault}"}}, expect: {{tokens: any}}}}\n'
                     for fault in KIND)
    files = [write_scenario(tmp / f"{family}.yaml", f"""\
name: tiny-{family}
model: tiny-{family}
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
{faults}prompts:
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
def test_the_clean_pair_routes_alike_within_the_floor(runs: dict[str, ParityRun], family: str) -> None:
    clean = located(runs[family])["vllm"]
    assert clean["cause"] == "none", clean["verdict"]
    assert clean["routing"]["kind"] == "same" and clean["routing"]["flips"] == 0, clean["verdict"]
    assert "the chosen experts agree at all" in clean["verdict"]
    points = pd.read_parquet(runs[family].run_dir / "explain" / "points.parquet")
    for engine in ("vllm", "expert"):  # both engines' routers and blocks captured, in every layer
        captured = set(points[points.engine == engine].point)
        wanted = ("router", "moe", "shared_expert") if family in SHARED else ("router", "moe")
        assert {f"layers.{n}.{p}" for n in (0, 1) for p in wanted} <= captured, engine


@pytest.mark.parametrize("fault", sorted(KIND))
@pytest.mark.parametrize("family", MOE)
def test_a_planted_moe_fault_is_named_with_its_layer_and_kind(runs: dict[str, ParityRun], family: str,
                                                              fault: str) -> None:
    found = located(runs[family])[fault]
    out = found["out_of_floor"]
    assert found["cause"] == "component", found["verdict"]
    assert out["point"] == f"layers.{FAULT_LAYER}.moe", found["verdict"]
    assert out["routing"] == KIND[fault], found["verdict"]
    if fault == "expert":
        assert "an expert kernel" in found["verdict"]
    routing = pd.read_parquet(runs[family].run_dir / "explain" / "routing.parquet")
    mine = routing[routing.engine == fault]
    assert set(mine[mine.layer < FAULT_LAYER].kind) == {"same"}  # routed alike before the planted layer
