"""`parity explain` for real: planted faults in HF (found by layer and component), vLLM vs HF on the shipped
penalty and bf16 scenarios (bf16-greedy.yaml's verdicts too: explain runs every case before tracing those that did
not match, so its run is that scenario's run in the suite), OPT on both engines, and the files an investigation
leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.executors.start_next import usable_cores
from harness.rundir.traces import Trace

from helpers import SCENARIOS, ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

ATTENTION_SWAP = """\
name: attention-swap
model: smollm2-135m
dtype: bfloat16
engines:
  hf: {engine: hf, reference: true}
  eager: {engine: hf, options: {patch: "adapters.tracing.patches:hf_eager_attention"}}
prompts:
  - {id: story, text: "Once upon a time, in a small village by the sea,"}
params: {max_new_tokens: 16}
expect: {tokens: any}
"""

OPT = """\
name: opt
model: tiny-opt
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm}
prompts: ["The capital of France is"]
params: {max_new_tokens: 8, ignore_eos: true}
"""


def localisations(run: ParityRun) -> dict[tuple[str, str], dict]:
    data = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    return {(loc["case_id"], loc["engine"]): loc for loc in data["localisations"]}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> ParityRun:
    # the patches live next to the scenario (scenarios/planted_faults.py), found through its folder
    return parity("explain", str(SCENARIOS / "planted-fault.yaml"), out=tmp_path_factory.mktemp("planted"))


def test_planted_v_projection_fault_is_named_by_layer_and_component(planted: ParityRun) -> None:
    assert planted.code == 0, planted.stderr[-2000:]
    loc = localisations(planted)[("story", "v-fault")]
    assert loc["cause"] == "component"
    assert loc["out_of_floor"]["point"] == "layers.7.v"
    assert loc["out_of_floor"]["jump"] == float("inf")  # nothing upstream of it differs at all
    assert loc["first_difference"]["point"] == "layers.7.v"
    assert "layer 7 v leaves the noise floor first" in loc["verdict"] and "q/k/v projection" in loc["verdict"]
    assert "layer 7 v leaves the noise floor first" in planted.stdout


def test_planted_late_mlp_fault_is_named_by_layer_and_component(planted: ParityRun) -> None:
    loc = localisations(planted)[("story", "mlp-fault")]
    assert loc["cause"] == "component" and loc["out_of_floor"]["point"] == "layers.26.mlp"
    assert "MLP" in loc["out_of_floor"]["cause"]
    curve = loc["curve"]
    assert len(curve) == 30 and all(c["error"] == 0 for c in curve[:26]) and curve[26]["error"] > 0


def test_explain_leaves_traces_and_error_tables(planted: ParityRun) -> None:
    explain_dir = planted.run_dir / "explain"
    points = pd.read_parquet(explain_dir / "points.parquet")
    assert {"point", "layer", "component", "error", "floor", "threshold", "ratio", "leaves_floor", "max_abs",
            "min_cosine", "max_rel_diff"} <= set(points.columns)
    errors = pd.read_parquet(explain_dir / "errors.parquet")
    assert {"max_abs", "rel_l2", "cosine", "rel_diff", "position", "compared_to"} <= set(errors.columns)
    floor_rows = errors[errors.compared_to == "hf@float64"]
    assert len(floor_rows) > 0 and floor_rows.rel_l2.max() < 1e-4  # fp32 vs fp64 of the same model
    n_points = 1 + 30 * 13 + 2  # embeddings, 13 points per layer, final norm, logits
    assert points[points.engine == "v-fault"].point.nunique() == n_points
    summary = (explain_dir / "summary.md").read_text()
    assert "layers.7.v" in summary and "What each layer adds to the residual stream" in summary
    report = parity("report", str(planted.run_dir))
    html = (planted.run_dir / "report.html").read_text()
    assert report.code == 0 and "id='explain'" in html and "layer 7 v leaves the noise floor first" in html
    assert "what each layer adds to the residual stream" in html and "id='effective'" in html


def test_explain_keeps_the_logits_and_the_first_divergent_layers_rows_and_loads_each_model_once(
        planted: ParityRun) -> None:
    """Traces sized to the answer: each engine's kept trace holds its logits rows and, for a faulty copy, the layer it
    leaves the floor in and the residual stream entering it; the reference's holds those layers for every fault; the
    float64 floor keeps nothing. Each engine configuration loads its model once in the whole command (the floor's is
    the one load explain adds)."""
    kept = {engine: Trace(planted.run_dir / "engines" / engine / "traces" / "story.safetensors")
            for engine in ("hf", "v-fault", "mlp-fault")}
    compared = set(pd.read_parquet(planted.run_dir / "explain" / "points.parquet").point)
    layer = lambda n: {p for p in compared if p.startswith(f"layers.{n}.")}  # noqa: E731
    assert set(kept["v-fault"].points) == {"logits", "layers.6.residual"} | layer(7)
    assert set(kept["mlp-fault"].points) == {"logits", "layers.25.residual"} | layer(26)
    assert set(kept["hf"].points) == {"logits", "layers.6.residual", "layers.25.residual"} | layer(7) | layer(26)
    assert kept["hf"].shape("layers.7.v")[0] == kept["hf"].shape("layers.7.q")[0] > 10  # every position
    assert not (planted.run_dir / "engines" / "hf@float64" / "traces" / "story.safetensors").exists()
    engines = json.loads((planted.run_dir / "explain" / "localisation.json").read_text())["engines"]
    assert {name: e["model_loads"] for name, e in engines.items()} == {
        "hf": 0, "v-fault": 0, "mlp-fault": 0, "v-fault@free": 0, "mlp-fault@free": 0, "hf@float64": 1,
        "v-fault@layers": 0, "mlp-fault@layers": 0}
    run_loads = {name: e["model_loads"] for name, e in planted.meta["engines"].items()}
    assert run_loads == {"hf": 1, "v-fault": 1, "mlp-fault": 1}, run_loads


def test_the_references_passes_start_during_the_run_on_the_threads_it_leaves(planted: ParityRun) -> None:
    """Its one case is known before the verdicts: the reference's traced pass and the float64 floor's start as soon
    as the reference has answered, in its worker, beside the run's engines still going. The reference's pass takes
    the threads those leave (every other pass waits for it), the floor's, the longest, the command's whole budget
    (engines at once x threads each, here the machine's cores at most); the others keep their own."""
    during = json.loads((planted.run_dir / "explain" / "localisation.json").read_text())["during_run"]
    assert during["passes"] == ["hf", "hf@float64"] and set(during["beside"]) <= {"v-fault", "mlp-fault"}
    budget = int(usable_cores())  # --parallel defaults to cores / threads (1 here): cores x 1
    used = {engine: [json.loads(line)["threads"] for line in
                     (planted.run_dir / "engines" / engine / "traces.jsonl").read_text().splitlines()]
            for engine in ("hf", "hf@float64", "v-fault")}
    free = max(1, budget - len(during["beside"]))
    assert used == {"hf": [free], "hf@float64": [budget], "v-fault": [1, 1]}, used


@pytest.fixture(scope="module")
def attention_swap(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("attention")
    return parity("explain", str(write_scenario(tmp / "swap.yaml", ATTENTION_SWAP)), out=tmp / "reports")


def test_attention_implementation_swap_in_bf16_is_found_in_the_attention_kernel(attention_swap: ParityRun) -> None:
    assert attention_swap.code == 0, attention_swap.stderr[-2000:]
    loc = localisations(attention_swap)[("story", "eager")]
    # Everything before attention is computed by the same code: the first difference is the attention output.
    assert loc["first_difference"]["point"] == "layers.0.attn", loc
    assert "attention kernel" in loc["verdict"]


@pytest.fixture(scope="module")
def penalties(tmp_path_factory) -> ParityRun:
    return parity("explain", str(SCENARIOS / "penalty-semantics.yaml"), "--engines", "hf,vllm-frequency",
                  "--case", "list", out=tmp_path_factory.mktemp("penalties"))


def test_penalty_semantics_logits_agree_sampler_differs(penalties: ParityRun) -> None:
    assert penalties.code == 1, penalties.stderr[-2000:]  # the scenario itself fails, as it intends
    loc = localisations(penalties)[("list", "vllm-frequency")]
    assert loc["cause"] == "sampler", loc["verdict"]
    assert loc["out_of_floor"] is None
    assert "logits agree within noise but tokens differ" in loc["verdict"]
    assert "penalty semantics" in loc["verdict"] and "frequency_penalty: unset vs 1.2" in loc["verdict"]
    assert loc["first_difference"]["point"].startswith("layers.0.")  # fused qkv vs three matmuls: tiny drift


@pytest.fixture(scope="module")
def bf16_both(tmp_path_factory) -> dict[str, ParityRun]:
    """bf16-greedy.yaml and bf16-planted-fault.yaml explained in one command (their HF and vLLM engines shared), each
    run by its scenario's name."""
    out = tmp_path_factory.mktemp("bf16")
    both = parity("explain", str(SCENARIOS / "bf16-greedy.yaml"), str(SCENARIOS / "bf16-planted-fault.yaml"), out=out)
    assert both.code == 0, both.stdout[-3000:] + both.stderr[-2000:]
    return {run_dir.name.split("-", 2)[2]: ParityRun(both.code, both.stdout, both.stderr, run_dir)
            for run_dir in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def bf16(bf16_both: dict[str, ParityRun]) -> ParityRun:
    return bf16_both["bf16-greedy"]


@pytest.mark.parametrize(("engine", "point", "component"), [
    ("mlp-fault", "layers.15.mlp", "MLP"), ("v-head-fault", "layers.9.v", "q/k/v projection"),
    ("norm-fault", "layers.21.post_norm", "norm"), ("vllm-mlp-fault", "layers.8.mlp", "MLP")])
def test_bf16_two_percent_faults_are_named_by_layer_and_component(bf16_both: dict[str, ParityRun], engine: str,
                                                                 point: str, component: str) -> None:
    """A change of 2% relative L2 in one component's output (scenarios/bf16_faults.py: every channel of an MLP or a
    norm, one KV head of a v projection; planted in HF and in vLLM) is named in bfloat16: every layer starts from the
    reference's input, so a point measures what its layer adds, against the reference's own rounding on its weights.
    The old floor (float32 weights, worst position, running maximum, at least 2^-7, k=10) read none of them."""
    loc = localisations(bf16_both["bf16-planted-fault"])[("story", engine)]
    assert loc["cause"] == "component" and loc["forced"], loc["verdict"]
    assert loc["out_of_floor"]["point"] == point and component in loc["out_of_floor"]["cause"]
    assert "its layer started from the reference's input" in loc["verdict"]


def test_bf16_clean_vllm_stays_inside_every_floor_and_says_its_sensitivity(bf16_both: dict[str, ParityRun]) -> None:
    """The clean pair of the same command: nothing out of a floor, and the smallest change it could have told from
    rounding said as a number ('none above X%'), no threshold above 5%."""
    loc = localisations(bf16_both["bf16-planted-fault"])[("story", "vllm")]
    assert loc["cause"] == "none", loc["verdict"]
    reach = loc["sensitivity"]["threshold"]
    assert 0 < reach <= 0.05 and f"none above {100 * reach:.3g}%" in loc["verdict"]
    points = pd.read_parquet(bf16_both["bf16-planted-fault"].run_dir / "explain" / "points.parquet")
    assert points[points.engine == "vllm"].sensitivity.max() <= 0.05
    assert "none above" in bf16_both["bf16-planted-fault"].stdout


def test_bf16_divergences_are_only_benign_ties(bf16: ParityRun) -> None:
    """The shipped scenario's verdicts, from the run explain makes of every case before tracing the ties."""
    assert bf16.code == 0, bf16.stdout[-3000:]
    verdicts = bf16.verdicts
    assert len(verdicts) == 4 and set(verdicts.verdict) <= {"match", "benign_tie"}
    ties = verdicts[verdicts.verdict == "benign_tie"]
    assert (ties.engine_token_in_ref_topk & ties.ref_token_in_engine_topk).all()


def test_bf16_divergence_is_a_near_tie_and_the_drift_is_located(bf16: ParityRun) -> None:
    assert bf16.code == 0, bf16.stderr[-2000:]
    assert bf16.verdicts.set_index("case_id").loc["story", "verdict"] == "benign_tie"
    loc = localisations(bf16)[("story", "vllm")]
    assert loc["cause"] == "near_tie", loc["verdict"]
    assert "the engines first differ at layer" in loc["verdict"]
    d = loc["divergence"]
    # the two tokens are both engines' top two: swapped, or exactly tied in bf16 and the tie broken differently (which
    # happens depends on the CPU's bf16 kernels: AMX machines tie here)
    assert {d["engine_token"], d["ref_token"]} == set(d["ref_top"][:2]) == set(d["engine_top"][:2])


@pytest.fixture(scope="module")
def opt(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("opt")
    return parity("explain", str(write_scenario(tmp / "opt.yaml", OPT)), "--keep-traces", out=tmp / "reports")


def test_vllm_cpu_runs_opt_and_its_traces_match_hf(opt: ParityRun) -> None:
    assert opt.code == 0, opt.stderr[-2000:]
    assert set(opt.verdicts.verdict) == {"match"}
    loc = localisations(opt)[("p0", "vllm")]
    assert loc["cause"] == "none"
    points = pd.read_parquet(opt.run_dir / "explain" / "points.parquet")
    assert {"layers.1.q", "layers.1.v", "layers.1.attn", "layers.1.up", "layers.1.mlp", "logits"} <= set(points.point)
    assert not points.leaves_floor.any()
    for engine in ("hf", "vllm", "hf@float64"):  # --keep-traces: every engine's whole trace
        trace = Trace(opt.run_dir / "engines" / engine / "traces" / "p0.safetensors")
        assert set(trace.points) >= set(points.point)


def test_unknown_case_is_a_one_line_error(tmp_path: Path) -> None:
    run = parity("explain", str(SCENARIOS / "quickstart.yaml"), "--case", "nope", out=tmp_path / "reports")
    assert run.code == 2
    assert "--case: ['nope'] not in" in run.stderr and "Traceback" not in run.stderr
