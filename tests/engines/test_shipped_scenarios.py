"""The shipped scenarios, run for real: HF transformers and vLLM on SmolLM2-135M. (bf16-greedy.yaml's run is the one
`parity explain` makes of it in tests/engines/test_explain.py, where its verdicts are checked: explain runs the whole
scenario before tracing the cases that did not match.)"""

from __future__ import annotations

import pandas as pd
import pytest

from helpers import SCENARIOS, ParityRun, parity

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> ParityRun:
    return parity("run", str(SCENARIOS / "quickstart.yaml"), out=tmp_path_factory.mktemp("quickstart"))


@pytest.fixture(scope="module")
def penalties(tmp_path_factory) -> ParityRun:
    # lmdeploy needs CUDA: skipped here, and the report says so
    return parity("run", str(SCENARIOS / "penalty-semantics.yaml"), "--allow-missing",
                  out=tmp_path_factory.mktemp("penalties"))


def test_quickstart_fp32_greedy_matches_token_for_token(quickstart: ParityRun) -> None:
    assert quickstart.code == 0, quickstart.stderr[-2000:]
    verdicts = quickstart.verdicts
    assert len(verdicts) == 4 and set(verdicts.verdict) == {"match"}
    assert verdicts.max_abs_logprob_delta.max() < 1e-3
    results = quickstart.results
    hf, vllm = (results[results.engine == e].set_index("case_id") for e in ("hf", "vllm"))
    for case in hf.index:
        assert list(hf.token_ids[case]) == list(vllm.token_ids[case])
        assert list(hf.prompt_ids[case]) == list(vllm.prompt_ids[case])
    assert "PASS: quickstart" in quickstart.stdout


def test_run_directory_records_what_verdicts_rest_on(quickstart: ParityRun) -> None:
    meta = quickstart.meta
    assert meta["status"] == "finished" and meta["exit_code"] == 0
    for engine in ("hf", "vllm"):
        assert meta["engines"][engine]["env"] == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}
        assert meta["engines"][engine]["versions"]["torch"].startswith("2.13.0")
    assert meta["engines"]["vllm"]["versions"]["vllm"] == "0.32.0"
    # what vLLM chose at load: its CPU build has no Triton, so the V1 runner, and its CPU attention
    assert (meta["engines"]["vllm"]["versions"]["model_runner"], meta["engines"]["vllm"]["versions"]["attention"]) \
        == ("v1", "CPU_ATTN")
    assert set(meta["prompt_ids"]) == {"capital", "story", "math", "code"}
    assert meta["prompt_ids"]["math"][0] == 1  # chat template applied: starts with <|im_start|>
    steps = pd.read_parquet(quickstart.run_dir / "steps.parquet")
    assert len(steps) == quickstart.results.token_ids.map(len).sum()
    assert steps.top_ids.map(len).eq(5).all()
    assert (quickstart.run_dir / "summary.md").read_text().count("| match |") == 4


def test_penalty_semantics_names_the_difference(penalties: ParityRun) -> None:
    assert penalties.code == 1
    verdicts = penalties.verdicts.set_index(["engine", "case_id"])
    assert set(verdicts.loc["vllm-repetition"].verdict) == {"match"}
    frequency = verdicts.loc["vllm-frequency"]
    assert set(frequency.verdict) == {"diverged"}
    assert (frequency.first_divergence < 16).all()
    for text in frequency.explanation:
        assert "frequency_penalty: unset vs 1.2" in text and "repetition_penalty: 1.2 vs unset" in text
        assert "different semantics" in text
    assert "different semantics" in penalties.stdout and "FAIL: penalty-semantics (exit 1)" in penalties.stdout
    presence = verdicts.loc["vllm-presence"]
    assert set(presence.verdict) == {"diverged"}
    assert all("presence_penalty: unset vs 1.2" in text for text in presence.explanation)
    assert "lmdeploy" not in set(penalties.verdicts.engine)
    assert "skipped: engine lmdeploy needs a CUDA GPU" in (penalties.run_dir / "summary.md").read_text()


def test_penalty_semantics_names_llama_cpps_penalty_window(penalties: ParityRun) -> None:
    """llama.cpp's repetition_penalty 1.2 is HF's formula over the last 64 generated tokens only: the verdicts say
    so from its effective params, and the own-top-1 check says the tokens were picked after the logits."""
    llama = penalties.verdicts.set_index(["engine", "case_id"]).loc["llama.cpp"]
    assert set(llama.verdict) == {"diverged"}
    for text in llama.explanation:
        assert "repetition_scope: hf prompt and output tokens, llama.cpp the last 64 generated tokens" in text
        assert "sampler or penalty semantics, not numerics" in text
