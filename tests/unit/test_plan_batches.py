"""What a worker is told of its plan: how many cases it is sent at once (every case for an engine with its own
scheduler and for a server's client, which keeps its requests in flight; a fixed batch for HF, whose generate() holds
every step's logits of a batch; the scenario's batch_size above all), and at load each distinct params of its cases
once (their effective params start there)."""

from __future__ import annotations

from pathlib import Path

from harness.core.types import Request
from harness.core.vocabulary import SamplingParams
from harness.plan.plans import engine_plan
from harness.scenario.spec import load

from helpers import write_scenario

SCENARIO = """\
name: batches
model: smollm2-135m
engines:
  hf: {engine: hf, reference: true}
  vllm: {engine: vllm}
  server: {engine: openai, options: {url: "http://127.0.0.1:9/v1", dialect: vllm}}
  small: {engine: openai, batch_size: 2, options: {url: "http://127.0.0.1:9/v1", dialect: vllm}}
prompts: [{id: p, text: "Hello"}]
params: {temperature: 0, max_new_tokens: 4}
"""


def test_engines_with_a_scheduler_and_servers_get_every_case_at_once_unless_the_scenario_says(tmp_path: Path) -> None:
    scenario = load(write_scenario(tmp_path / "s.yaml", SCENARIO)).with_resolved(resolve=lambda *_: tmp_path)
    requests = [Request(case_id=f"c{i}", prompt_ids=[1], params=SamplingParams(), top_logprobs=5) for i in range(40)]
    plans = {name: engine_plan(scenario, name, tmp_path, requests)
             for name in ("hf", "vllm", "server", "small")}
    assert {name: plan.batch_size for name, plan in plans.items()} == {"hf": 16, "vllm": 40, "server": 40, "small": 2}
    assert [len(b) for b in plans["hf"].batches()] == [16, 16, 8] and len(plans["server"].batches()) == 1


def test_a_worker_is_told_each_distinct_params_once_at_load(tmp_path: Path) -> None:
    from harness.executors.engine_runs import _distinct_params

    scenario = load(write_scenario(tmp_path / "s.yaml", SCENARIO)).with_resolved(resolve=lambda *_: tmp_path)
    requests = [Request(case_id=f"c{i}", prompt_ids=[1], params=SamplingParams(temperature=t), top_logprobs=5)
                for i, t in enumerate((0.0, 0.5, 0.0))]
    plan = engine_plan(scenario, "server", tmp_path, requests)
    assert [p["temperature"] for p in _distinct_params(plan)] == [0.0, 0.5]
    traced = engine_plan(scenario, "server", tmp_path, requests, op="trace")
    assert _distinct_params(traced) == []  # effective params are for generate plans only


PLACES = """\
name: places
model: smollm2-135m
engines:
  hf: {engine: hf, reference: true}
  attached: {engine: openai, options: {url: "http://127.0.0.1:9/v1", dialect: vllm}}
  launched: {engine: vllm-server}
  attached-vllm: {engine: vllm-server, options: {url: "http://127.0.0.1:9/v1"}}
  other-python: {engine: openai, python: /usr/bin/python3, options: {url: "http://127.0.0.1:9/v1", dialect: vllm}}
prompts: [{id: p, text: "Hello"}]
params: {temperature: 0, max_new_tokens: 4}
"""


def test_only_clients_of_servers_the_harness_does_not_start_run_in_its_own_process(tmp_path: Path) -> None:
    """They only send HTTP requests (harness.executors.local_thread); an engine in-process, a server the harness starts
    (its worker stops it however it ends), a server engine whose client imports its package (vllm-server scores
    beams with vLLM's code) and another interpreter keep a worker process."""
    scenario = load(write_scenario(tmp_path / "s.yaml", PLACES)).with_resolved(resolve=lambda *_: tmp_path)
    attached = {name: engine_plan(scenario, name, tmp_path, []).attached_client
                for name in scenario.spec.engines}
    assert attached == {"hf": False, "attached": True, "launched": False, "attached-vllm": False,
                        "other-python": False}
