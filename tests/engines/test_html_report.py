"""`parity report` on real runs, opened in a real headless Chromium: key elements, no JS errors, a screenshot; a
1,024-case run's report shows its problems on a first screen that is ready within 3 s."""

from __future__ import annotations

import json
import random
import re
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


LARGE_CASES = 1024
LARGE = """\
name: large
model: tiny-llama
engines:
  hf: {engine: hf, reference: true, options: {batched: true}}
  penalised: {engine: hf, options: {batched: true}, params: {repetition_penalty: 1.3}}
params: {temperature: 0, max_new_tokens: 4, ignore_eos: true}
prompts: [{file: prompts.jsonl}]
"""


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> ParityRun:
    """A real 1,024-case run of two engines on the tiny Llama (the penalised engine diverges wherever its penalty
    flips a token and matches elsewhere), and its report."""
    tmp = tmp_path_factory.mktemp("large")
    words = ("river", "city", "light", "morning", "old", "house", "garden", "quiet", "road", "market", "stone")
    rng = random.Random(29)
    (tmp / "prompts.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "text": " ".join(rng.choice(words) for _ in range(rng.randint(2, 24)))}) + "\n"
        for i in range(LARGE_CASES)))
    run = parity("run", str(write_scenario(tmp / "large.yaml", LARGE)), out=tmp / "reports")
    assert run.code == 1 and len(run.verdicts) == LARGE_CASES, run.stdout[-2000:] + run.stderr[-2000:]
    made = parity("report", str(run.run_dir))
    assert made.code == 0, made.stderr
    return run


def test_a_1024_case_report_shows_its_problems_on_a_first_screen_within_3_s(large: ParityRun, tmp_path: Path) -> None:
    """Measured in the page: from navigation start to the report's script at the end of its first page (every element
    parsed) within 3 s; the verdicts not as expected lead the table, the rest of its rows are collapsed and the cases
    past the first page are on further pages, each of which opens too."""
    verdicts = large.verdicts
    diverged = int((~verdicts.expected).sum())
    assert 0 < diverged < LARGE_CASES / 2 and "match" in set(verdicts.verdict)
    report = large.run_dir / "report.html"
    dom = chromium(tmp_path / "profile", "--dump-dom", report.as_uri())
    assert dom.returncode == 0 and "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    page = dom.stdout
    ready_ms = int(re.search(r'data-ready-ms="(\d+)"', page).group(1))
    print(f"first page of the 1,024-case report: {report.stat().st_size / 1e6:.2f} MB, ready in {ready_ms} ms")
    assert ready_ms <= 3000, ready_ms
    assert f"<b>{diverged} not as expected</b>" in page
    shown = page[page.index('id="verdicts"'):page.index('id="more-verdicts"')]
    assert shown.count("<tr data-href") == 100 and shown.count(">NO</td>") == min(100, diverged)
    assert '<details id="more-verdicts"><summary>' in page  # closed: its rows are not laid out
    further = sorted(large.run_dir.glob("report-cases-*.html"))
    assert len(further) == -(-LARGE_CASES // 50) - 1 and page.count("class=\"case\"") == 50
    last = chromium(tmp_path / "profile2", "--dump-dom", further[-1].as_uri())
    assert last.returncode == 0 and 'data-ready="yes"' in last.stdout and 'class="case"' in last.stdout
