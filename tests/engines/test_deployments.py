"""How engines are deployed. scenarios/tensor-parallel.yaml: vLLM split over two tensor-parallel ranks, offline and as
a server, against one rank (the tensor_parallel knob); `parity explain` capturing inside every rank of a two-rank
engine, clean and with a fault planted in one rank's shard. scenarios/compile.yaml: compiled graphs against eager mode
(the compile knob) on HF, vLLM and its server, and explain on a compiled engine. scenarios/kv-cache-explain.yaml:
fp8 and q8_0 KV caches judged as drift and explained, a cache fault in one layer named. scenarios/logprob-kinds.yaml:
raw against processed logprobs under a penalty, said as a difference in kind, a fault beside them still named. One
`parity explain` of the four files serves the module."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity

FILES = ("tensor-parallel.yaml", "compile.yaml", "kv-cache-explain.yaml", "logprob-kinds.yaml")


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, ParityRun]:
    out = tmp_path_factory.mktemp("deployments")
    run = parity("explain", *(str(SCENARIOS / name) for name in FILES), out=out)
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {run_dir.name.split("-", 2)[2]: ParityRun(run.code, run.stdout, run.stderr, run_dir)
            for run_dir in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def explained(both: dict[str, ParityRun]) -> ParityRun:
    return both["tensor-parallel"]


@pytest.fixture(scope="module")
def compiled(both: dict[str, ParityRun]) -> ParityRun:
    return both["compile"]


def localisations(run: ParityRun) -> dict[str, dict]:
    data = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    return {loc["engine"]: loc for loc in data["localisations"]}


def test_two_ranks_answer_as_one_offline_and_served(explained: ParityRun) -> None:
    """The knob on both vLLM engines: the same greedy tokens on one rank and on two, the logprobs within rounding;
    the negative control tells a real difference apart on each."""
    invariance = pd.read_parquet(explained.run_dir / "invariance.parquet")
    knob = invariance[invariance.knob == "tensor_parallel"].set_index("engine")
    assert set(knob.index) == {"vllm-tp2", "vllm-server"}
    assert set(knob.verdict) <= {"identical", "tokens_identical"}, knob[["verdict", "explanation"]]
    assert (knob.max_abs_logprob_delta < 1e-4).all()
    control = invariance[invariance.knob == "control"]
    assert set(control.verdict) == {"diverged"}, control


def test_the_ranks_and_their_cores_are_recorded(explained: ParityRun) -> None:
    engines = explained.meta["engines"]
    assert engines["vllm-tp2"]["versions"]["tensor_parallel_size"] == "2"
    assert engines["vllm-tp2"]["versions"]["threads_bind"] == "0|1"  # a core per rank, from the cores it may use
    sizes = {name: e["versions"].get("tensor_parallel_size") for name, e in engines.items() if "server" in name}
    assert sizes == {"vllm-server": "1", "vllm-server~tensor_parallel_size=2": "2",
                     "vllm-server~enforce_eager=False": "1"}, sizes
    assert engines["vllm-server~tensor_parallel_size=2"]["versions"]["threads_bind"] == "0|1"


def test_a_clean_two_rank_engine_stays_inside_the_floor_as_one_rank_does(explained: ParityRun) -> None:
    """Every layer captured in both ranks and joined: the same points as a one-rank engine, none out of its floor."""
    loc = localisations(explained)["vllm-tp2"]
    assert loc["cause"] == "none" and loc["forced"], loc["verdict"]
    points = pd.read_parquet(explained.run_dir / "explain" / "points.parquet")
    captured = set(points[points.engine == "vllm-tp2"].point)
    assert {"layers.1.q", "layers.1.k", "layers.1.attn", "layers.1.gate", "layers.1.up", "layers.1.mlp",
            "logits"} <= captured
    assert not points[points.engine == "vllm-tp2"].leaves_floor.any()


def test_a_fault_in_one_ranks_shard_is_named_with_its_layer_component_and_rank(explained: ParityRun) -> None:
    """Rank 1's query heads of layer 1 changed by 2% (scenarios/tp_faults.py), rank 0 untouched: named by layer and
    component, and as rank 1's shard (its query head), rank 0's shard measured clean."""
    loc = localisations(explained)["rank1-fault"]
    assert loc["cause"] == "component", loc["verdict"]
    out = loc["out_of_floor"]
    assert out["point"] == "layers.1.q" and out["shards"]["ranks"] == [1]
    assert "rank 1's shard (query head 1 of 2) only" in loc["verdict"]
    assert "fused projection" not in out["cause"]  # one rank's shard: no fusion every rank shares


def test_compiled_graphs_answer_as_eager_mode_on_every_engine(compiled: ParityRun, explained: ParityRun) -> None:
    """HF and vLLM offline in compile.yaml, the vLLM server in tensor-parallel.yaml (one server for both knobs)."""
    invariance = pd.concat([pd.read_parquet(run.run_dir / "invariance.parquet") for run in (compiled, explained)])
    knob = invariance[invariance.knob == "compile"].set_index("engine")
    assert set(knob.index) == {"hf", "vllm-compiled", "vllm-server"}
    assert set(knob.verdict) <= {"identical", "tokens_identical"}, knob[["verdict", "explanation"]]
    assert set(invariance[invariance.knob == "control"].verdict) == {"diverged"}


def test_the_graph_mode_that_ran_is_recorded_as_each_engine_settled_on_it(compiled: ParityRun,
                                                                          explained: ParityRun) -> None:
    """vLLM's CPU platform turns a compiled configuration into DYNAMO_TRACE_ONCE with inductor: read back from the
    engine's configuration offline and from the server's start-up log."""
    modes = {name: engine["versions"]["compilation"] for run in (compiled, explained)
             for name, engine in run.meta["engines"].items() if name != "hf" or run is compiled}
    assert modes["vllm-compiled"] == "DYNAMO_TRACE_ONCE (inductor)" == modes["vllm-server~enforce_eager=False"]
    assert modes["vllm-compiled~enforce_eager=True"] == "NONE" == modes["vllm-server"]
    assert modes["hf~compile=True"].startswith("torch.compile") and modes["hf"] == "NONE"


def test_explain_on_a_compiled_engine_says_it_captured_eager_mode(compiled: ParityRun) -> None:
    data = json.loads((compiled.run_dir / "explain" / "localisation.json").read_text())
    assert any("vllm-compiled: captured in eager mode" in note and "inside the compiled graph" in note
               for note in data["notes"]), data["notes"]
    assert localisations(compiled)["vllm-compiled"]["cause"] == "none"


@pytest.fixture(scope="module")
def caches(both: dict[str, ParityRun]) -> ParityRun:
    return both["kv-cache-explain"]


def test_quantised_caches_are_drift_within_their_gates(caches: ParityRun) -> None:
    drift = pd.read_parquet(caches.run_dir / "drift.parquet").set_index("engine")
    assert set(drift.index) == {"vllm-fp8", "llamacpp-q8_0"} and drift.expected.all()
    assert (drift.mean_kld > 0).all() and drift.loc["vllm-fp8", "against"] == "vllm"


@pytest.mark.parametrize(("engine", "point", "held"), [
    ("vllm-fp8", "layers.0.attn", "vllm-fp8 holds it in fp8"),
    ("vllm-fp8-layer1", "layers.1.attn", "vllm-fp8-layer1 holds it in fp8, except layers 0"),
    ("llamacpp-q8_0", "layers.0.o_proj", "llamacpp-q8_0 holds it in q8_0")])
def test_a_quantised_cache_is_read_at_attention_and_named_as_the_cause(caches: ParityRun, engine: str, point: str,
                                                                      held: str) -> None:
    """The first point out of the floor is attention's output (llama.cpp's map has none: o_proj, the first after it);
    the cause names the cache's dtype from the engine's configuration. The planted control quantises layer 1's cache
    alone and is named at layer 1, layer 0 inside its floor."""
    loc = localisations(caches)[engine]
    assert loc["cause"] == "component" and loc["out_of_floor"]["point"] == point, loc["verdict"]
    assert loc["out_of_floor"]["cause"].startswith(f"the KV cache: {held} (its configuration)")


def test_a_full_cache_beside_them_stays_inside_every_floor(caches: ParityRun) -> None:
    loc = localisations(caches)["vllm"]
    assert loc["cause"] == "none", loc["verdict"]
    assert caches.meta["engines"]["vllm-fp8-layer1"]["versions"]["kv_cache"] == "fp8, except layers 0"


@pytest.fixture(scope="module")
def kinds(both: dict[str, ParityRun]) -> pd.DataFrame:
    return both["logprob-kinds"].verdicts.set_index(["engine", "case_id"])


@pytest.mark.parametrize("engine", ["vllm-processed", "hf-processed", "server-processed"])
def test_processed_logprobs_under_a_penalty_are_a_difference_in_kind(kinds: pd.DataFrame, engine: str) -> None:
    """Greedy with repetition_penalty 1.3: the same tokens as HF, logprobs apart by the penalty (0.36 nats measured),
    said as raw against processed and not judged as drift; without a penalty both kinds are the same numbers."""
    penalised = kinds.loc[(engine, "story[repetition_penalty=1.3]")]
    assert penalised.verdict == "match" and penalised.expected, penalised.explanation
    assert penalised.explanation.startswith(f"logprobs differ in kind, not numerics: {engine} returns "
                                            "processed_logprobs, hf raw_logprobs")
    assert penalised.max_abs_logprob_delta > 0.1
    plain = kinds.loc[(engine, "story[repetition_penalty=1.0]")]
    assert plain.max_abs_logprob_delta < 1e-3 and "differ in kind" not in plain.explanation


def test_a_real_fault_beside_them_is_still_named(kinds: pd.DataFrame) -> None:
    """Processed logprobs and a fault in vLLM's layer 1: the tokens diverge on both cases, penalised or not, and the
    kinds' reading leaves the divergence named."""
    fault = kinds.loc["processed-fault"]
    assert set(fault.verdict) == {"diverged"}, fault.explanation.to_dict()
    assert all("diverged at step" in text for text in fault.explanation)


def test_a_servers_prompt_logprobs_score_the_reference_tokens_as_hf_does(both: dict[str, ParityRun]) -> None:
    """The vLLM server's scoring path: its prompt logprobs on the reference's ids, which no sampler touches, agree
    with HF's teacher-forced logprobs (float32 rounding) on the penalised case too, where its answers' processed
    logprobs were 0.36 nats off."""
    locs = json.loads((both["logprob-kinds"].run_dir / "explain" / "localisation.json").read_text())["localisations"]
    loc = next(x for x in locs if x["engine"] == "server-processed" and x["case_id"] == "story[repetition_penalty=1.3]")
    found = re.search(r"teacher-forced logprobs of the reference's 16 tokens are within ([0-9.e+-]+) of",
                      loc["verdict"])
    assert found and float(found[1]) < 1e-3, loc["verdict"]


def test_params_says_what_each_engine_returns_as_a_logprob() -> None:
    shown = parity("params", str(SCENARIOS / "logprob-kinds.yaml"))
    assert shown.code == 0, shown.stderr[-2000:]
    assert "what each engine returns as a logprob" in shown.stdout
    assert "| vllm-processed | processed_logprobs | vLLM's logprobs_mode processed_logprobs" in shown.stdout
    assert "| hf | raw_logprobs | the log-softmax of generate()'s output_logits" in shown.stdout
