"""lmdeploy's CPU-usable code, for real: the bodies the lmdeploy dialect sends validate against lmdeploy's own
request models and request check, and what its server builds from them is what the effective-params table says;
the pipeline's GenerationConfig accepts what the lmdeploy engine passes. Engines needing CUDA are reported as such."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.engines.lmdeploy_params import translate as pipeline_kwargs
from adapters.http.client import translate as request_body
from adapters.http.dialects import DIALECTS
from adapters.sampling import lmdeploy as lmdeploy_sampling
from harness import models
from harness.core.vocabulary import SamplingParams

from helpers import SCENARIOS, parity

CASES = [
    SamplingParams(temperature=0, max_new_tokens=16),
    SamplingParams(temperature=0, repetition_penalty=1.2, max_new_tokens=16),
    SamplingParams(do_sample=True, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                   frequency_penalty=0.5, seed=3, ignore_eos=True, max_new_tokens=16),
    SamplingParams(max_new_tokens=16),
]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return models.resolve("smollm2-135m", "float32")


@pytest.mark.parametrize("params", CASES, ids=["greedy", "greedy-penalty", "sampling-all", "unset"])
@pytest.mark.parametrize("defaults", ["canonical", "engine"])
def test_server_bodies_validate_against_lmdeploys_request_models(params, defaults, model_path) -> None:
    from types import SimpleNamespace

    from lmdeploy.serve.openai.endpoints.completions import check_request
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest, CompletionRequest

    context = SimpleNamespace(engine_config=SimpleNamespace(logprobs_mode="raw_logprobs"),
                              session_manager=SimpleNamespace(has=lambda session_id: False))
    completions = request_body(params, DIALECTS["lmdeploy"], 5, "completions", defaults).native_params
    request = CompletionRequest(model="m", prompt="The capital of France is", **completions)
    assert check_request(request, context) == ""
    chat = request_body(params, DIALECTS["lmdeploy"], 5, "chat", defaults).native_params
    ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **chat)
    assert "frequency_penalty" not in completions  # lmdeploy accepts and ignores it: never sent, warned instead
    config, sent, _ = lmdeploy_sampling.final_config(model_path, params, "server", defaults, [1, 2, 3], "lmdeploy")
    assert config.do_sample is True  # the server always samples
    if "temperature" in sent:
        assert config.temperature == sent["temperature"]
    if params.repetition_penalty:
        assert config.repetition_penalty == params.repetition_penalty  # kept, greedy or not


@pytest.mark.parametrize("params", CASES, ids=["greedy", "greedy-penalty", "sampling-all", "unset"])
def test_pipeline_kwargs_build_lmdeploys_generation_config(params, model_path) -> None:
    from lmdeploy.messages import GenerationConfig

    native = pipeline_kwargs(params).native_params
    GenerationConfig(**native)
    effective = lmdeploy_sampling.effective(model_path, params, "float32", "pipeline")
    assert effective.decoding == ("greedy" if params.greedy else "sampling")
    if params.greedy:  # the pipeline turns do_sample false into top_k=1 and drops the penalty
        assert effective.top_k == 1 and effective.repetition_penalty == 1.0


def test_a_run_needing_lmdeploy_exits_3_with_the_reason(tmp_path: Path) -> None:
    run = parity("run", str(SCENARIOS / "do-sample-defaults.yaml"), out=tmp_path / "reports")
    assert run.code == 3
    assert "engine lmdeploy needs a CUDA GPU" in run.stderr and "--allow-missing" in run.stderr
    assert "Traceback" not in run.stderr


def test_env_create_resolves_the_pinned_lmdeploy_environment() -> None:
    run = parity("env", "create", "lmdeploy", "--dry-run", timeout=900)
    assert run.code == 0, run.stderr[-2000:]
    text = " ".join(run.stdout.split())
    assert "lmdeploy==0.18.0" in text and "torch==" in text
    assert "lmdeploy: uv would install" in text  # uv, which scripts/bootstrap.sh installs: 2 s against pip's 43 s
