"""A misbehaving server and a loaded one: the fault proxy (tests/engines/fault_proxy.py) sits between the harness and
a real vLLM server on 127.0.0.1 and, request by request, drops the connection, stalls past the timeout, truncates
the body, answers 500 or 503, answers malformed JSON, or returns logprobs for fewer steps than tokens.

One `parity run` carries every fault: each fault has its own `openai` engine behind its own proxy. In each, the
case `flaky` meets the fault on its first attempt only, the case `victim` on every attempt, the other cases never.
What is safe to retry is retried (flaky recovers); the rest becomes an engine error for that case only, with the
reason; every other result is kept. Then 64 distinct prompts at concurrency 16: every answer accounted for once,
each attributed to its case through the prompt token ids the server returns with it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pandas as pd
import pytest

from adapters.engines.vllm_server import Engine as VllmServer
from harness import models
from harness.core.types import EngineSetup

from fault_proxy import FaultProxy
from helpers import ParityRun, parity, write_scenario

pytestmark = pytest.mark.engines

FLAKY, VICTIM = [1, 450, 2300, 17], [1, 450, 2300, 18]  # token-id prompts: the proxy knows each case by its body
PROMPTS = [{"id": "flaky", "token_ids": FLAKY}, {"id": "victim", "token_ids": VICTIM},
           {"id": "plain-a", "token_ids": [1, 450, 2300, 19]}, {"id": "plain-b", "token_ids": [1, 9, 10, 11]}]
REQUEST_TIMEOUT = 10  # seconds; generous for a loaded 2-core machine, where a stall is 3x as long

# fault -> retried?, the reason an unrecovered case names
FAULTS = {
    "drop": (True, "connection failed (RemoteProtocolError: Server disconnected without sending a response.)"),
    "stall": (False, f"no response within {REQUEST_TIMEOUT}s (not retried)"),
    "truncate": (True, "connection failed (RemoteProtocolError: peer closed connection without sending complete "
                       "message body"),
    "500": (True, "HTTP 500: injected 500"),
    "503": (True, "HTTP 503: injected 503"),
    "malformed": (True, "unreadable answer (JSONDecodeError"),
    "fewer_logprobs": (False, "returned 8 tokens but logprobs for 6 steps, so it cannot be compared token by token"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real vLLM server (tiny model) for the module, started and stopped by the vllm-server engine itself."""
    setup = EngineSetup(name="fixture", model_path=models.resolve("tiny-llama", "float32"), dtype="float32",
                        options={"kv_cache_gib": 0.5}, workdir=tmp_path_factory.mktemp("server"), max_context=512)
    engine = VllmServer(setup)
    warm_up = {"model": engine.model, "prompt": [1, 2], "max_tokens": 8, "temperature": 0, "logprobs": 5,
               "return_tokens_as_token_ids": True, "return_token_ids": True}
    for _ in range(2):  # the first requests of this shape are slow (the server warms up); the faults come after
        httpx.post(f"{engine.base_url}/completions", json=warm_up, timeout=300).raise_for_status()
    yield engine.base_url
    engine.close()


def upstream(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").removesuffix("/v1").split(":")
    return host, int(port)


def fault_rule(fault: str):
    def rule(path: str, body: dict, attempt: int) -> str | None:
        prompt = body.get("prompt")
        return fault if prompt == VICTIM or (prompt == FLAKY and attempt == 1) else None

    return rule


@pytest.fixture(scope="module")
def faulted(server, tmp_path_factory):
    proxies = {fault: FaultProxy(upstream(server), fault_rule(fault), stall_s=3 * REQUEST_TIMEOUT)
               for fault in FAULTS}
    engines = "\n".join(
        f"  fault-{fault}: {{engine: openai, options: {{url: '{proxy.url}', dialect: vllm, concurrency: 2, retries: 2, "
        f"request_timeout: {REQUEST_TIMEOUT}}}, expect: {{tokens: any}}}}" for fault, proxy in proxies.items())
    scenario = (f"model: tiny-llama\nengines:\n  hf: {{engine: hf, reference: true}}\n{engines}\n"
                f"prompts: {json.dumps(PROMPTS)}\nparams: {{temperature: 0, max_new_tokens: 8, ignore_eos: true}}\n")
    tmp = tmp_path_factory.mktemp("faulted")
    run = parity("run", str(write_scenario(tmp / "faulted.yaml", scenario)), out=tmp / "reports")
    yield run, proxies
    for proxy in proxies.values():
        proxy.close()


def check_fault(faulted, fault: str) -> None:
    run, proxies = faulted
    assert run.code == 1, run.stdout[-3000:]  # the victims are engine errors
    retried, reason = FAULTS[fault]
    results = run.results.set_index(["engine", "case_id"]).loc[f"fault-{fault}"]
    verdicts = run.verdicts.set_index(["engine", "case_id"]).loc[f"fault-{fault}"]
    for case in ("plain-a", "plain-b"):  # untouched cases: kept, and equal to the reference's tokens
        assert results.loc[case].status == "ok" and verdicts.loc[case].verdict == "match"
    victim = results.loc["victim"]
    assert victim.status == "error" and reason in victim.error, victim.error
    if retried:
        assert "gave up after 3 attempts: " in victim.error
        assert results.loc["flaky"].status == "ok" and verdicts.loc["flaky"].verdict == "match"
        assert json.loads(results.loc["flaky"].timings)["attempts"] == 2
    else:
        assert results.loc["flaky"].status == "error" and reason in results.loc["flaky"].error
    sent = [s for s in proxies[fault].seen if s.path.endswith("/completions")]
    attempts = {case: sum(s.body["prompt"] == ids for s in sent)
                for case, ids in (("flaky", FLAKY), ("victim", VICTIM))}
    assert attempts == ({"flaky": 2, "victim": 3} if retried else {"flaky": 1, "victim": 1})
    log = (run.run_dir / "engines" / f"fault-{fault}" / "worker.log").read_text()
    assert "Traceback" not in log


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault(faulted, fault: str) -> None:
    check_fault(faulted, fault)


def test_no_result_of_an_unfaulted_case_is_lost(faulted) -> None:
    run, _ = faulted
    results = run.results
    assert len(results) == 4 * (1 + len(FAULTS)) and not results.duplicated(["engine", "case_id"]).any()
    lost = results[results.case_id.str.startswith("plain") & (results.status != "ok")]
    assert lost.empty, lost[["engine", "case_id", "error"]]


LOAD = 64


def test_64_prompts_at_concurrency_16_are_each_answered_once_and_attributed(server, tmp_path: Path) -> None:
    proxy = FaultProxy(upstream(server), lambda path, body, attempt: None)  # passes everything, counts requests
    try:
        prompts = [f"Prompt number {i}: say something about the number {i * 7 + 3}." for i in range(LOAD)]
        scenario = (f"model: tiny-llama\nengines:\n  hf: {{engine: hf, reference: true, options: {{batched: true}}, "
                    f"batch_size: {LOAD}}}\n  served: {{engine: openai, options: {{url: '{proxy.url}', dialect: vllm, "
                    f"concurrency: 16}}, batch_size: {LOAD}, expect: {{tokens: any}}}}\n"
                    f"prompts: {json.dumps(prompts)}\nparams: {{temperature: 0, max_new_tokens: 16}}\n")
        run: ParityRun = parity("run", str(write_scenario(tmp_path / "load.yaml", scenario)),
                                out=tmp_path / "reports")
    finally:
        proxy.close()
    assert run.code == 0, run.stdout[-3000:]
    served = run.results[run.results.engine == "served"].set_index("case_id")
    assert len(served) == LOAD and served.index.is_unique and set(served.status) == {"ok"}
    prompt_ids = run.meta["prompt_ids"]
    assert len({tuple(ids) for ids in prompt_ids.values()}) == LOAD  # distinct prompts
    for case, row in served.iterrows():  # the server's own echo of the prompt it answered
        assert list(row.prompt_ids) == prompt_ids[case], case
    sent = [tuple(s.body["prompt"]) for s in proxy.seen if s.path.endswith("/completions")]
    assert sorted(sent) == sorted(tuple(ids) for ids in prompt_ids.values())  # each sent exactly once
    assert pd.Series([json.loads(t)["attempts"] for t in served.timings]).eq(1).all()
