"""Secrets and exposure, on a real run: an API key planted in an environment variable the scenario names is used
(the llama.cpp server the harness starts requires it) and appears in no file, log, report or message; a server the
scenario lets listen beyond loopback listens there and is named in every report; and a real model's answer that is
HTML (SmolLM2 asked to repeat an <img onerror> tag and to write a <script>) stays inert text in the report, checked
in the real headless Chromium the report tests use. (The vLLM server's key, also planted in its environment only, is
held to the same in tests/engines/test_servers.py; its server takes a minute to start here, llama.cpp's seconds.)"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import httpx
import pytest

from adapters.engines.llamacpp_server import SERVER_SETTINGS
from adapters.engines.llamacpp_server import Engine as LlamaServer
from adapters.engines.vllm_server import Engine as VllmServer
from harness import models
from harness.core.types import EngineSetup

from helpers import ParityRun, chromium, parity, write_scenario

pytestmark = pytest.mark.engines

KEY_ENV = "PARITY_PLANTED_KEY"
KEY = f"sk-planted-{secrets.token_hex(16)}"

SCENARIO = f"""\
name: exposed
model: smollm2-135m
engines:
  hf: {{engine: hf, reference: true}}
  served: {{engine: llama.cpp-server, options: {{api_key_env: {KEY_ENV}, bind: 0.0.0.0, allow_remote: true}}}}
prompts:
  - {{id: img, messages: [{{role: user, content: 'Repeat this HTML exactly: <img src=x onerror="document.title=1">'}}]}}
  - {{id: script, messages: [{{role: user, content: "Write an HTML snippet with a script tag that shows an alert."}}]}}
params: {{temperature: 0, max_new_tokens: 48}}
"""


@pytest.fixture(scope="module")
def exposed(tmp_path_factory) -> tuple[ParityRun, list[str]]:
    """The run, its HTML report and a baseline saved from it, with the key in the environment; every output."""
    tmp = tmp_path_factory.mktemp("exposed")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, KEY)
        run = parity("run", str(write_scenario(tmp / "exposed.yaml", SCENARIO)), out=tmp / "reports")
        report = parity("report", str(run.run_dir))
        baseline = parity("baseline", "save", str(run.run_dir), "--to", str(tmp / "baselines"))
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert report.code == 0 and baseline.code == 0, report.stderr + baseline.stderr
    return run, [run.stdout, run.stderr, report.stdout, report.stderr, baseline.stdout, baseline.stderr]


def test_the_planted_key_is_in_no_output(exposed, tmp_path: Path) -> None:
    run, printed = exposed
    files = [p for p in run.run_dir.parent.parent.rglob("*") if p.is_file()]
    assert any(p.name == "server.log" for p in files) and any(p.name == "report.html" for p in files)
    assert len(files) > 10
    leaked = [str(p) for p in files if KEY.encode() in p.read_bytes()]
    assert not leaked and not any(KEY in text for text in printed)
    assert run.meta["engines"]["served"]["options"]["api_key_env"] == KEY_ENV  # the name is recorded, not the key


@pytest.mark.parametrize(("server", "key_var"), [(VllmServer, "VLLM_API_KEY"), (LlamaServer, "API_KEY")])
def test_the_server_gets_the_key_in_its_environment_not_its_command_line(server, key_var, tmp_path: Path,
                                                                         monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    setup = EngineSetup(name="s", model_path=models.resolve("tiny-llama", "float32"), dtype="float32",
                        options={"api_key_env": KEY_ENV}, workdir=tmp_path)
    engine = server.__new__(server)  # launch() only builds the command; nothing is started
    engine.options = server.Options(**setup.options)
    launch = engine.launch(setup, 8000)
    launch.cleanup()
    assert launch.env[key_var] == KEY and not any(KEY in arg for arg in launch.command)
    assert launch.command[launch.command.index("--host") + 1] == "127.0.0.1"  # loopback unless the scenario says


@pytest.mark.parametrize(("server", "key_var"), [(VllmServer, "VLLM_API_KEY"), (LlamaServer, "API_KEY")])
def test_a_shells_own_key_does_not_reach_a_server_the_scenario_gives_none(server, key_var, tmp_path: Path,
                                                                         monkeypatch) -> None:
    monkeypatch.setenv(key_var, "a-key-for-something-else")
    setup = EngineSetup(name="s", model_path=models.resolve("tiny-llama", "float32"), dtype="float32", options={},
                        workdir=tmp_path)
    engine = server.__new__(server)
    engine.options = server.Options(**setup.options)
    launch = engine.launch(setup, 8000)
    launch.cleanup()
    assert key_var not in launch.env


def test_the_server_settings_kept_from_the_shell_are_the_installed_servers_own() -> None:
    from llama_cpp.server.settings import Settings

    assert {*Settings.model_fields, "config_file"} == SERVER_SETTINGS


def test_a_started_llama_cpp_server_demands_the_key_and_listens_where_told(tmp_path: Path, monkeypatch) -> None:
    """A shell's settings for llama_cpp.server (an unrelated API_KEY; HOST and PORT, which would override its
    command line; CONFIG_FILE, which would replace it) do not reach the server; the scenario's key does, and bind is
    honoured."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv("API_KEY", "not-the-scenarios-key")
    monkeypatch.setenv("HOST", "127.0.0.1")
    monkeypatch.setenv("PORT", "1")
    monkeypatch.setenv("CONFIG_FILE", str(tmp_path / "absent.json"))
    setup = EngineSetup(name="s", model_path=models.resolve("tiny-llama", "float32"), dtype="float32",
                        options={"api_key_env": KEY_ENV, "bind": "0.0.0.0", "allow_remote": True}, workdir=tmp_path)
    engine = LlamaServer(setup)
    try:
        port = int(engine.base_url.rsplit(":", 1)[1].split("/")[0])
        assert httpx.get(f"{engine.base_url}/models", timeout=10).status_code == 401
        assert httpx.get(f"{engine.base_url}/models", headers={"Authorization": "Bearer not-the-scenarios-key"},
                         timeout=10).status_code == 401
        assert httpx.get(f"{engine.base_url}/models", headers={"Authorization": f"Bearer {KEY}"},
                         timeout=10).status_code == 200
        assert f"00000000:{port:04X}" in _listening_sockets()  # 0.0.0.0, not 127.0.0.1
    finally:
        engine.close()


def _listening_sockets() -> str:
    """Local addresses (hex address:port, as the kernel lists them) of this machine's listening IPv4 TCP sockets."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return " ".join(row.split()[1] for row in rows if row.split()[3] == "0A")


def test_a_server_bound_beyond_loopback_is_named_in_every_report(exposed) -> None:
    run, printed = exposed
    listening = run.meta["engines"]["served"]["versions"]["server_listening"]
    assert listening.startswith("0.0.0.0:")
    sentence = f"served: the server the harness started listened on {listening}, not on a loopback address"
    assert sentence in (run.run_dir / "summary.md").read_text()
    assert sentence in (run.run_dir / "report.html").read_text()
    assert sentence in " ".join(printed[0].split())
    assert "listened on" not in (run.run_dir / "summary.md").read_text().replace(sentence, "")  # hf: no server


def test_html_answers_stay_inert_in_chromium(exposed, tmp_path: Path) -> None:
    run, _ = exposed
    answers = run.results.set_index(["engine", "case_id"]).text
    assert '<img src=x onerror="document.title=1">' in answers[("served", "img")]  # what the real model said
    assert "<script>" in answers[("served", "script")]
    page = (run.run_dir / "report.html").read_text()
    assert '&lt;img src=x onerror=&quot;document.title=1&quot;&gt;' in page
    dom = chromium(tmp_path / "profile", "--dump-dom", (run.run_dir / "report.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="yes"' in dom.stdout  # the report's own script ran to its end
    assert re.search(r"<title>llm-parity: exposed</title>", dom.stdout)  # onerror did not retitle the page
    assert "<img" not in dom.stdout and dom.stdout.count("<script") == 1  # no element from an answer
    assert "&lt;script&gt;" in dom.stdout and "&lt;img src=x" in dom.stdout  # shown as text
