"""Server engines against a real vLLM OpenAI server on 127.0.0.1: attach by URL, both endpoints, streaming,
dialects, 4xx errors, and no server left behind after Ctrl-C. (A server killed mid-run: tests/engines/test_resume.py,
with llama.cpp's server, which starts in seconds.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from adapters.engines.vllm_server import Engine as VllmServer
from harness import models
from harness.core.processes import group_alive
from harness.core.types import EngineSetup

from fault_proxy import FaultProxy
from helpers import SCENARIOS, ParityRun, journal_lines, parity, start_parity_run, wait_for, write_scenario

pytestmark = pytest.mark.engines

API_KEY_ENV = "PARITY_TEST_API_KEY"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One real vLLM server for this module, started with an API key by the vllm-server engine itself (the key in its
    environment, from the env var api_key_env names), stopped at the end."""
    os.environ[API_KEY_ENV] = "secret-test-key"
    setup = EngineSetup(name="fixture", model_path=models.resolve("smollm2-135m", "float32"), dtype="float32",
                        options={"api_key_env": API_KEY_ENV}, workdir=tmp_path_factory.mktemp("server"))
    engine = VllmServer(setup)
    server = engine.server
    yield engine, setup.workdir
    engine.close()
    assert server.gone()


@pytest.fixture(scope="module")
def server_url(served) -> str:
    return served[0].base_url


def test_the_server_demands_the_key_and_writes_it_nowhere(served, attached: ParityRun) -> None:
    engine, workdir = served
    assert httpx.get(f"{engine.base_url}/models", timeout=10).status_code == 401
    files = [p for p in workdir.rglob("*") if p.is_file()]
    assert any(p.name == "server.log" for p in files)
    assert not [p for p in files if b"secret-test-key" in p.read_bytes()]


ATTACHED = """\
name: attached
model: smollm2-135m
engines:
  hf: {{engine: hf, reference: true}}
  completions: {{engine: openai, options: {{url: "{url}", dialect: vllm, api_key_env: {key}}}}}
  completions-stream: {{engine: openai, options: {{url: "{url}", dialect: vllm, stream: true, api_key_env: {key}}}}}
  chat: {{engine: openai, options: {{url: "{url}", dialect: vllm, endpoint: chat, api_key_env: {key}}},
          expect: {{tokens: any}}}}
  chat-stream: {{engine: openai, options: {{url: "{url}", dialect: vllm, endpoint: chat, stream: true,
                                            api_key_env: {key}, concurrency: 1}}, expect: {{tokens: any}}}}
  generic: {{engine: openai, options: {{url: "{url}", dialect: generic, api_key_env: {key}}}, expect: {{tokens: any}}}}
  as-lmdeploy: {{engine: openai, options: {{url: "{url}", dialect: lmdeploy, endpoint: chat, api_key_env: {key}}},
                 params: {{frequency_penalty: 0.5}}, expect: {{tokens: any}}}}
  lmdeploy-attached: {{engine: lmdeploy-server, options: {{url: "{url}", endpoint: chat, api_key_env: {key}}},
                       params: {{repetition_penalty: 1.1}}, expect: {{tokens: any}}}}
  too-long: {{engine: openai, options: {{url: "{url}", dialect: vllm, api_key_env: {key}}},
              params: {{max_new_tokens: 100000}}, expect: {{tokens: any}}}}
prompts:
  - {{id: math, messages: [{{role: user, content: "What is 12 times 7? Answer briefly."}}]}}
  - {{id: code, messages: [{{role: user, content: "Write a Python function that reverses a string."}}]}}
  - {{id: capital, text: "The capital of France is"}}
params: {{temperature: 0, max_new_tokens: 12}}
"""


@pytest.fixture(scope="module")
def attached(server_url, tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("attached")
    scenario = write_scenario(tmp / "attached.yaml", ATTACHED.format(url=server_url, key=API_KEY_ENV))
    return parity("run", str(scenario), out=tmp / "reports")


def _verdicts(run: ParityRun) -> pd.DataFrame:
    return run.verdicts.set_index(["engine", "case_id"])


def test_completions_plain_and_streamed_match_hf(attached: ParityRun) -> None:
    verdicts = _verdicts(attached)
    for engine in ("completions", "completions-stream"):
        assert set(verdicts.loc[engine].verdict) == {"match"}, verdicts.loc[engine].explanation.tolist()
        assert verdicts.loc[engine].max_abs_logprob_delta.max() < 1e-3
    results = attached.results.set_index(["engine", "case_id"])
    assert results.loc[("completions-stream", "code")].text == results.loc[("completions", "code")].text
    assert json.loads(results.loc[("completions-stream", "code")].native_params)["stream"] is True


def test_chat_endpoint_uses_the_servers_template(attached: ParityRun) -> None:
    verdicts = _verdicts(attached)
    for engine in ("chat", "chat-stream"):
        for case in ("math", "code"):  # same template as the harness's: same prompt ids, same tokens
            assert verdicts.loc[(engine, case)].verdict == "match", verdicts.loc[(engine, case)].explanation
        capital = verdicts.loc[(engine, "capital")]  # a text prompt becomes a chat message on this endpoint
        assert capital.verdict == "diverged" and "prompt token ids differ" in capital.explanation
        assert "first apart at position 0" in capital.explanation and "chat-template" in capital.explanation
    # a dialect that asks for no prompt ids: the server's own template is named, and the first-step divergence it
    # causes is read as a prompt difference, not numerics
    results = attached.results.set_index(["engine", "case_id"])
    assert any("its own chat template and BOS rule made them" in w
               for w in results.loc[("as-lmdeploy", "capital")].warnings)
    capital = verdicts.loc[("as-lmdeploy", "capital")]
    assert capital.first_divergence == 0 and "most likely a prompt difference" in capital.explanation


def test_generic_dialect_maps_token_text_back_and_says_so(attached: ParityRun) -> None:
    results = attached.results.set_index(["engine", "case_id"])
    generic = results.loc[("generic", "math")]
    assert any("token ids inferred from token text" in w for w in generic.warnings)
    body = json.loads(generic.native_params)
    assert "return_tokens_as_token_ids" not in body and "top_k" not in body
    verdicts = _verdicts(attached)
    assert set(verdicts.loc["generic"].verdict) <= {"match", "diverged"}
    ambiguous = [w for w in results.loc["generic"].warnings.explode().dropna() if w.startswith("ambiguous")]
    matched = verdicts.loc["generic"].verdict.eq("match").sum()
    assert matched == 3 or ambiguous  # a mismatch is only allowed where the mapping said it was ambiguous


def test_ignored_param_warns_and_is_not_sent(attached: ParityRun) -> None:
    results = attached.results.set_index(["engine", "case_id"])
    row = results.loc[("as-lmdeploy", "math")]
    assert "frequency_penalty" not in json.loads(row.native_params)
    assert any("frequency_penalty=0.5 NOT APPLIED: the lmdeploy server accepts and ignores it" in w
               for w in row.warnings)
    assert "frequency_penalty=0.5 NOT APPLIED" in attached.stdout


def test_lmdeploy_server_engine_speaks_the_lmdeploy_dialect_over_http(attached: ParityRun) -> None:
    """The lmdeploy-server adapter attached by url (no CUDA needed for that) to a real OpenAI-compatible server, on
    the chat path (vLLM has no lmdeploy-native /generate): token ids mapped back, and the effective params computed
    by lmdeploy's own server code."""
    results = attached.results.set_index(["engine", "case_id"])
    row = results.loc[("lmdeploy-attached", "capital")]
    assert row.status == "ok" and len(row.token_ids) > 0
    body = json.loads(row.native_params)
    assert body["repetition_penalty"] == 1.1 and "return_token_ids" not in body and body["temperature"] == 0.0
    assert any("token ids inferred from token text" in w for w in row.warnings)
    effective = json.loads(row.effective)
    assert effective["repetition_scope"] == "generated tokens only"
    assert effective["top_k"] == 1  # temperature 0 -> top_k 1
    assert "the server always samples (do_sample true); temperature 0 becomes top_k=1" in effective["notes"]


def test_4xx_is_reported_with_the_servers_message_without_retry(attached: ParityRun) -> None:
    verdicts = _verdicts(attached).loc["too-long"]
    assert set(verdicts.verdict) == {"engine_error"}
    assert all("rejected by the server: HTTP 400" in e for e in verdicts.explanation)
    log = next(attached.run_dir.glob("engines/too-long/worker.log")).read_text()
    assert "Traceback" not in log


def test_missing_api_key_env_fails_to_load(server_url, tmp_path: Path) -> None:
    scenario = ATTACHED.format(url=server_url, key="PARITY_NO_SUCH_KEY").split("  completions-stream")[0]
    scenario += "prompts: ['hi']\nparams: {max_new_tokens: 2}\n"
    run = parity("run", str(write_scenario(tmp_path / "s.yaml", scenario)), out=tmp_path / "reports")
    assert run.code == 1
    assert "env var PARITY_NO_SUCH_KEY (api_key_env) is not set" in run.verdicts.explanation.iloc[0]


def test_remote_url_needs_explicit_permission(tmp_path: Path) -> None:
    scenario = ATTACHED.format(url="http://10.1.2.3:8000/v1", key=API_KEY_ENV)
    run = parity("validate", str(write_scenario(tmp_path / "s.yaml", scenario)))
    assert run.code == 2
    assert "is not a loopback address: set allow_remote: true" in run.stderr


def test_server_vs_offline_scenario(tmp_path: Path) -> None:
    run = parity("run", str(SCENARIOS / "server-vs-offline.yaml"), out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:]
    verdicts = _verdicts(run)
    assert set(verdicts.verdict) == {"match"}
    assert verdicts.loc["vllm-server"].max_abs_logprob_delta.max() < 1e-3
    server = run.meta["engines"]["vllm-server"]
    assert float(server["versions"]["server_startup_s"]) > 0
    pid = int((run.run_dir / "engines" / "vllm-server" / "server.pid").read_text())
    assert not group_alive(pid)  # stopped at the end of the run
    assert "Application startup complete" in (run.run_dir / "engines" / "vllm-server" / "server.log").read_text()


SERVED = """\
model: smollm2-135m
engines:
  hf: {engine: hf, reference: true}
  served: {engine: vllm-server}
prompts: ["one", "two"]
params: {temperature: 0, max_new_tokens: 8}
"""


def test_interrupt_leaves_no_server_process(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    proc = start_parity_run(write_scenario(tmp_path / "s.yaml", SERVED), out)
    wait_for(lambda: bool(list(out.glob("*/engines/served/server.pid"))), timeout=120)
    time.sleep(3)  # the server is starting up: its engine processes are being spawned
    server_pid = int(next(out.glob("*/engines/served/server.pid")).read_text())
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    wait_for(lambda: not group_alive(server_pid), timeout=30)


SERVER_KNOBS = """\
name: server-knobs
model: smollm2-135m
engines:
  hf: {{engine: hf, reference: true}}
  served:
    engine: openai
    options: {{url: "{url}", dialect: vllm, api_key_env: {key}, concurrency: 4}}
    invariance: [repeat, order, concurrency, seed, prefix_cache]
prompts: ["one", "two", "three", "four"]
params: {{temperature: 0, max_new_tokens: 12}}
expect: {{tokens: any}}
"""


def test_the_knobs_a_server_turns_with_requests_alone(server_url, tmp_path: Path) -> None:
    """Any OpenAI-compatible server, attached by url: repeat, order, concurrency and seed need only requests; its
    configuration (prefix cache...) is not the harness's to change, and the report says so."""
    scenario = write_scenario(tmp_path / "s.yaml", SERVER_KNOBS.format(url=server_url, key=API_KEY_ENV))
    run = parity("run", str(scenario), out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:]
    knobs = pd.read_parquet(run.run_dir / "invariance.parquet").set_index("knob")
    for knob in ("repeat", "order", "concurrency", "seed"):
        assert knobs.loc[knob].verdict in ("identical", "tokens_identical"), knobs.loc[knob].explanation
    assert knobs.loc["concurrency"].baseline == "one request at a time"
    assert knobs.loc["prefix_cache"].verdict == "unsupported" and "not the harness's to change" in \
        knobs.loc["prefix_cache"].explanation
    assert knobs.loc["control"].verdict == "diverged" and knobs.loc["seed-control"].verdict == "diverged"


ATTACHED_LONG = """\
name: attached-long
model: smollm2-135m
engines:
  a: {{engine: openai, reference: true, options: {{url: "{url}", dialect: vllm, api_key_env: {key}, concurrency: 2}}}}
  b: {{engine: openai, options: {{url: "{url}", dialect: vllm, api_key_env: {key}, concurrency: 2}}}}
prompts: ["one", "two", "three", "four", "five", "six", "seven", "eight"]
params: {{temperature: 0, max_new_tokens: 64, ignore_eos: true}}
"""


def test_interrupting_an_attached_client_keeps_results_and_waits_for_no_request(server_url, tmp_path: Path) -> None:
    """An attached client runs in a thread of the harness (harness.executors.local_thread): Ctrl-C must not wait for the
    requests still queued or in flight (their threads are daemons), and what finished is kept for --resume."""
    out = tmp_path / "reports"
    proc = start_parity_run(write_scenario(tmp_path / "s.yaml", ATTACHED_LONG.format(url=server_url,
                                                                                      key=API_KEY_ENV)), out)
    wait_for(lambda: journal_lines(out, "a") >= 1, timeout=180)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)  # 6 requests of 64 tokens were still to come
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    run_dir = next(out.iterdir())
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert 1 <= journal_lines(out, "a") < 8


ATTACHED_BEAMS = """\
name: attached-beams
model: smollm2-135m
engines:
  hf: {{engine: hf, reference: true}}
  client: {{engine: openai, options: {{url: "{url}", dialect: vllm, api_key_env: {key}}}}}
prompts: ["Once upon a time"]
params: {{temperature: 0, max_new_tokens: 6, num_beams: 3, length_penalty: 0.0}}
expect: {{tokens: any}}
"""


def test_an_attached_vllm_dialect_client_searches_beams_on_the_server(server_url, tmp_path: Path) -> None:
    """The openai engine with dialect vllm asks the server's own beam search (use_beam_search, n = width): three
    beams, best first, each token's logprob summed as the server reported it, the same numbers as HF's on the beams
    both return; it reports no final score (the server returns none), and says so."""
    scenario = write_scenario(tmp_path / "s.yaml", ATTACHED_BEAMS.format(url=server_url, key=API_KEY_ENV))
    run = parity("run", str(scenario), out=tmp_path / "reports")
    assert run.code == 0, run.stdout[-3000:]
    beams = pd.read_parquet(run.run_dir / "beams.parquet")
    client = beams[beams.engine == "client"].sort_values("rank")
    assert list(client["rank"]) == [0, 1, 2] and client.score.isna().all()
    assert list(client.cum_logprob) == sorted(client.cum_logprob, reverse=True)  # length_penalty 0: by cum logprob
    hf = {tuple(b.token_ids): b.cum_logprob for b in beams[beams.engine == "hf"].itertuples()}
    shared = [(hf[tuple(b.token_ids)], b.cum_logprob) for b in client.itertuples() if tuple(b.token_ids) in hf]
    assert shared and all(abs(a - b) < 1e-3 for a, b in shared)
    result = run.results.set_index("engine").loc["client"]
    body = json.loads(result.native_params)
    assert body["use_beam_search"] is True and body["n"] == 3 and body["length_penalty"] == 0.0
    assert any(w.startswith("no final beam scores: the vllm server returns none") for w in result.warnings)
    assert run.verdicts.set_index("engine").loc["client"].beams_compared == 3


DETOKENISED = """\
name: detokenised
model: smollm2-135m
engines:
  hf: {{engine: hf, reference: true}}
  direct:
    engine: openai
    options: {{url: "{url}", dialect: vllm, api_key_env: {key}, stream: true}}
    invariance: [stream]
  cut:
    engine: openai
    options: {{url: "{proxy}", dialect: vllm, api_key_env: {key}, stream: true}}
    invariance: [stream]
prompts:
  - {{id: chinese, messages: [{{role: user, content: "你好！请用中文介绍一下你自己。"}}]}}
  - {{id: count, text: "1, 2, 3, 4, 5,"}}
params: {{temperature: 0, max_new_tokens: 16, stop: [" 8, 9"]}}
"""


@pytest.fixture(scope="module")
def detokenised(server_url, tmp_path_factory) -> ParityRun:
    """The real server answered directly (streamed, and unstreamed for the stream knob) and through a proxy that
    writes the first non-ASCII character of each streamed answer as U+FFFD, as a detokeniser that cut its bytes
    would, and passes unstreamed answers as they are (the stream knob's baseline)."""
    host, port = server_url.removeprefix("http://").removesuffix("/v1").split(":")
    proxy = FaultProxy((host, int(port)), lambda path, body, attempt: "cut_character" if body.get("stream") else None)
    tmp = tmp_path_factory.mktemp("detokenised")
    scenario = write_scenario(tmp / "s.yaml", DETOKENISED.format(url=server_url, proxy=proxy.url, key=API_KEY_ENV))
    yield parity("run", str(scenario), out=tmp / "reports")
    proxy.close()


def test_the_text_verdicts_catch_a_cut_character_the_token_verdicts_cannot(detokenised: ParityRun) -> None:
    assert detokenised.code == 1, detokenised.stdout[-3000:]
    verdicts = detokenised.verdicts.set_index(["engine", "case_id"])
    assert verdicts.loc[("cut", "chinese")].verdict == "match"  # its ids are the server's own
    text = pd.read_parquet(detokenised.run_dir / "text.parquet").set_index(["engine", "case_id"])
    cut = text.loc[("cut", "chinese")]
    assert not cut.expected and cut.explanation.startswith("detokeniser: the text leaves the decoding of its own ids")
    assert "U+FFFD where the ids decode to a whole character" in cut.explanation
    assert text.loc[("direct", "chinese")].expected and "\ufffd" not in text.loc[("direct", "chinese")].text
    assert "answers that do not read as their own ids say" in detokenised.stdout


def test_a_stop_string_spanning_tokens_is_judged_from_the_ids(detokenised: ParityRun) -> None:
    text = pd.read_parquet(detokenised.run_dir / "text.parquet").set_index(["engine", "case_id"])
    for engine in ("hf", "direct"):
        row = text.loc[(engine, "count")]
        assert row.expected and row.stop_string == " 8, 9" and row.stop_spans_tokens, row.explanation
        assert row.ids_text.endswith(" 8, 9") and row.finish_reason == "stop"
    assert text.loc[("direct", "count")].text_check == "cut before stop"  # vLLM cuts where the stop string starts
    assert text.loc[("hf", "count")].text_check == "as the ids"  # HF keeps the tokens that completed it
    ids = detokenised.results.set_index(["engine", "case_id"]).loc[("direct", "count")].token_ids
    usage = json.loads(text.loc[("direct", "count")].usage)  # the last streamed chunk's counts, held to the ids
    assert usage["completion_tokens"] == len(ids) and usage["prompt_tokens"] > 0


def test_the_stream_knob_compares_the_same_requests_streamed_and_not(detokenised: ParityRun) -> None:
    knobs = pd.read_parquet(detokenised.run_dir / "invariance.parquet").set_index(["engine", "knob"])
    stream = knobs.loc[("direct", "stream")]
    assert stream.verdict in ("identical", "tokens_identical"), stream.explanation
    assert (stream.baseline, stream.variant) == ("each answer in one piece", "the same requests streamed")


def test_a_proxy_that_alters_streamed_answers_only_fails_the_stream_knob(detokenised: ParityRun) -> None:
    """Equal ids, another text: the stream knob is text_diverged, fails, and says what differs and where."""
    knobs = pd.read_parquet(detokenised.run_dir / "invariance.parquet").set_index(["engine", "knob"])
    stream = knobs.loc[("cut", "stream")]
    assert stream.verdict == "text_diverged" and not stream.expected, stream.explanation
    assert stream.explanation.startswith("token ids equal, but 1 answer(s) read otherwise; first chinese: the text "
                                         "leaves the baseline's at character"), stream.explanation
    assert "it holds U+FFFD where the ids decode to a whole character" in stream.explanation
    assert knobs.loc[("direct", "stream")].expected  # the same server, unaltered


def test_the_gate_fails_a_case_on_its_text_finding(detokenised: ParityRun, tmp_path: Path) -> None:
    """The cut answer's tokens are the server's own and match any baseline: only its text verdict can fail it."""
    saved = parity("baseline", "save", str(detokenised.run_dir), "--to", str(tmp_path / "baselines"))
    assert saved.code == 0, saved.stderr
    gate = parity("gate", detokenised.meta["scenario"], "--baseline", str(tmp_path / "baselines"), "--engines",
                  "hf,cut", out=tmp_path / "reports")
    assert gate.code == 1, gate.stdout[-3000:]
    assert ("REGRESSION detokenised chinese [cut]: out of expectation: detokeniser: the text leaves the decoding of "
            "its own ids") in gate.stdout, gate.stdout[-3000:]
    assert "REGRESSION detokenised count [cut]" not in gate.stdout  # ASCII only: nothing to cut
