"""The shipped mixture-of-experts scenarios (scenarios/moe-*.yaml, issue 58) in HF and vLLM's CPU build, and llama.cpp
for mixtral and qwen3_moe (F32 GGUFs written here): the tiny families agree token for token in float32, routers with
near ties included, and `parity explain` captures the router logits, the shared expert, the block's output and the
chosen experts in both engines, keeps the clean pair inside the noise floor with every (layer, position) routed alike
(the float64 floor runs HF's experts eagerly: its grouped matmul takes no float64), and names the three faults
scenarios/moe_faults.py plants in HF copies with their layer and kind (weighting, a routing flip without a tie, an
expert kernel). One `parity explain` of every family's scenario, the HF and vLLM workers shared across them; the
invariance knobs on scenarios/moe-invariance.yaml, where a batch-dependent router drifts under the batch knob."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.models.tiny import FAMILIES

from helpers import SCENARIOS, ParityRun, parity

pytestmark = pytest.mark.engines

MOE = sorted(name for name, family in FAMILIES.items() if family.experts)
SHARED = ("qwen2_moe", "glm4_moe")  # a shared expert beside the routed ones
LLAMA_CPP = ("mixtral", "qwen3_moe")  # the families llama.cpp runs from GGUFs written here
FAULT_LAYER = 1  # scenarios/moe_faults.py's LAYER
KIND = {"weighting": "weighting", "shifted-rule": "routing_rule", "expert": "expert_kernel"}  # engine -> its fault


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ParityRun]:
    """`parity explain` of every shipped MoE scenario in one command (moe-bf16.yaml's run under "bf16")."""
    tmp = tmp_path_factory.mktemp("moe")
    run = parity("explain", *(str(SCENARIOS / f"moe-{family}.yaml") for family in (*MOE, "bf16")), out=tmp / "out")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {d.name.split("-moe-", 1)[1]: ParityRun(run.code, run.stdout, run.stderr, d)
            for d in sorted((tmp / "out").iterdir())}


@pytest.fixture(scope="module")
def invariance(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("moe-invariance")
    return parity("run", str(SCENARIOS / "moe-invariance.yaml"), out=tmp / "out")


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


@pytest.mark.parametrize("family", LLAMA_CPP)
def test_llama_cpp_gives_hfs_tokens_and_routes_alike(runs: dict[str, ParityRun], family: str) -> None:
    """llama.cpp's router logits (ffn_moe_logits), block outputs (ffn_moe_out) and chosen experts (ffn_moe_topk,
    ffn_moe_weights_norm), read through its graph callback from an F32 GGUF."""
    run = runs[family]
    verdict = run.verdicts.set_index("engine").loc["llama.cpp"]
    assert verdict.verdict == "match", verdict.explanation
    assert run.meta["engines"]["llama.cpp"]["versions"]["weights"].endswith("all F32")
    found = located(run)["llama.cpp"]
    assert found["cause"] == "none", found["verdict"]
    assert found["routing"]["kind"] == "same", found["verdict"]
    points = pd.read_parquet(run.run_dir / "explain" / "points.parquet")
    mine = points[points.engine == "llama.cpp"]
    assert {f"layers.{n}.{p}" for n in (0, 1) for p in ("router", "moe", "residual")} <= set(mine.point)
    routes = pd.read_parquet(run.run_dir / "explain" / "routing.parquet")
    routed = routes[routes.engine == "llama.cpp"]
    assert set(routed.layer) == {0, 1} and routed.engine_margin.notna().all()  # its own choice's margin


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


def test_bf16_two_percent_expert_and_router_faults_are_named_and_vllm_stays_clean(runs: dict[str, ParityRun]) -> None:
    """tiny-qwen3_moe in bfloat16 (scenarios/moe-bf16.yaml): expert 0's down projection scaled to change the block's
    output by 2% where it acts (judged over the positions the reference routed to expert 0), and the router's logits
    changed by 2%, each named with its layer and kind; vLLM inside every floor."""
    found = located(runs["bf16"])
    assert found["vllm"]["cause"] in ("none", "near_tie"), found["vllm"]["verdict"]
    expert, router = found["expert-fault"], found["router-fault"]
    assert expert["cause"] == "component" and expert["out_of_floor"]["point"] == "layers.1.moe", expert["verdict"]
    assert expert["out_of_floor"]["routing"] == "expert_kernel" and "the positions routed to expert 0" in \
        expert["verdict"]
    assert router["cause"] == "component" and router["out_of_floor"]["point"] == "layers.1.router", router["verdict"]


def test_an_engine_that_ignores_the_score_correction_bias_is_a_routing_flip_without_a_tie(
        runs: dict[str, ParityRun]) -> None:
    """tiny-glm4_moe's bias is drawn so that it decides the choice at some positions (vLLM honours it and routes
    alike); a copy choosing by the sigmoid scores alone flips there, against its own biased scores: no tie."""
    found = located(runs["glm4_moe"])["ignored-bias"]
    assert found["cause"] == "component" and found["out_of_floor"]["routing"] == "routing_rule", found["verdict"]
    assert found["out_of_floor"]["point"] == f"layers.{FAULT_LAYER}.moe"
    routing = pd.read_parquet(runs["glm4_moe"].run_dir / "explain" / "routing.parquet")
    flips = routing[(routing.engine == "ignored-bias") & ~routing.same]
    assert len(flips) and set(flips.kind) == {"routing_rule"} and (flips.engine_margin < 0).all()


def test_the_invariance_knobs_run_on_a_moe_and_catch_a_batch_dependent_router(invariance: ParityRun) -> None:
    assert invariance.code == 0, invariance.stdout[-3000:]
    table = pd.read_parquet(invariance.run_dir / "invariance.parquet").set_index(["engine", "knob"])
    for engine, knob in (("hf", "order"), ("vllm", "batch"), ("vllm", "order"), ("vllm-server", "order"),
                         ("vllm-server", "concurrency")):
        assert table.loc[(engine, knob)].verdict == "identical", (engine, knob)
    assert table.loc[("hf", "batch")].verdict in ("identical", "tokens_identical")
    honest, planted = (table.loc[(engine, "batch")] for engine in ("hf", "batch-router"))
    drift = {"honest": honest.max_abs_logprob_delta, "planted": planted.max_abs_logprob_delta}
    assert planted.verdict == "diverged" or drift["planted"] > 1000 * max(drift["honest"], 1e-9), drift


def test_the_html_report_shows_the_routing_view(runs: dict[str, ParityRun]) -> None:
    run = runs["mixtral"]
    assert parity("report", str(run.run_dir)).code == 0
    page = (run.run_dir / "report.html").read_text()
    views = page.count("<pre class='routing'>")
    assert views == 5, views  # one per engine compared with the reference
    assert "color:#cf222e'>x</b>" in page  # the shifted rule's flips without a tie
    summary = (run.run_dir / "explain" / "summary.md").read_text()
    assert "Chosen experts per layer and position" in summary and "layer 1: " in summary


def test_a_two_rank_engine_routes_alike_within_the_floor(runs: dict[str, ParityRun]) -> None:
    """vLLM split over two tensor-parallel ranks (moe-qwen3_moe.yaml's vllm-tp2): every layer captured in both ranks
    and joined, and the chosen experts read in rank 0, compared at every (layer, position) as a one-rank engine's."""
    sharded = located(runs["qwen3_moe"])["vllm-tp2"]
    assert sharded["cause"] == "none", sharded["verdict"]
    assert sharded["routing"]["kind"] == "same", sharded["routing"]
