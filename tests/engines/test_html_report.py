"""`parity report` on real runs, opened in a real headless Chromium: key elements, no JS errors, a screenshot."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.http.server_process import free_port

from helpers import ParityRun, chromium, parity, write_scenario

pytestmark = pytest.mark.engines

REPORTED = """\
name: reported
model: tiny-llama
engines:
  hf: {{engine: hf, reference: true}}
  batched: {{engine: hf, options: {{batched: true}}}}
  penalised: {{engine: hf, params: {{repetition_penalty: 3.0}}}}
  unreachable: {{engine: openai, options: {{url: "http://127.0.0.1:{port}/v1", retries: 0}}}}
prompts: ["Hello world, this is", {{id: chat, messages: [{{role: user, content: "Hi there"}}]}}]
params: {{max_new_tokens: 16}}
"""

@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> ParityRun:
    tmp = tmp_path_factory.mktemp("reported")
    scenario = write_scenario(tmp / "reported.yaml", REPORTED.format(port=free_port()))
    run = parity("run", str(scenario), out=tmp / "reports")
    assert run.code == 1  # penalised diverges, unreachable is an engine error
    made = parity("report", str(run.run_dir))
    assert made.code == 0, made.stderr
    return run


def test_report_renders_in_chromium_with_its_parts(reported: ParityRun, tmp_path: Path) -> None:
    report = reported.run_dir / "report.html"
    html = report.read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "").replace("http://127.0.0.1", "")
    dom = chromium(tmp_path / "profile", "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert 'data-ready="yes"' in page  # the inline script ran to its end
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr
    assert 'id="verdicts"' in page and 'id="params"' in page and 'id="engines"' in page
    assert page.count('class="tok first"') >= 2  # the first divergence is highlighted on both sides
    assert '<svg class="plot"' in page and "top-k at step" in page
    assert "engine_error" in page and "unreachable" in page
    assert 'class="differs"' in page  # repetition_penalty differs between engines
    shot = reported.run_dir / "report.png"
    taken = chromium(tmp_path / "profile2", f"--screenshot={shot}", "--window-size=1280,2400", report.as_uri())
    assert taken.returncode == 0 and shot.stat().st_size > 20_000


def test_report_of_a_missing_run_dir_is_a_config_error(tmp_path: Path) -> None:
    run = parity("report", str(tmp_path))
    assert run.code == 2 and "not a run directory" in run.stderr
