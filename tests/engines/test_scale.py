"""The default batching at a small count (benchmarks/scale.py measures it at 1,024 cases): vLLM gets every case in
one call and each is journalled when its step loop finishes it; HF goes in batches of 16; the harness killed half-way
through HF's batches resumes with what was journalled; progress comes as plain lines with a rate and the time left."""

from __future__ import annotations

import json
import random
import re

import pytest

from helpers import ParityRun, journal_lines, parity, start_parity_run, wait_for, write_scenario

pytestmark = pytest.mark.engines

CASES = 40
WORDS = ("river", "city", "light", "morning", "old", "house", "garden", "quiet", "road", "market", "stone", "bridge")


def scenario_text() -> str:
    rng = random.Random(29)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30))) for _ in range(CASES)]
    return ("name: scale\nmodel: smollm2-135m\nthreads: 1\nengines:\n"
            "  vllm: {engine: vllm, reference: true}\n"
            "  hf: {engine: hf, options: {batched: true}, expect: {tokens: any}}\n"  # padded batches may flip a tie
            "params: {temperature: 0, max_new_tokens: 8, ignore_eos: true}\n"
            "prompts:\n" + "".join(f"  - {json.dumps(p)}\n" for p in prompts))


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory) -> tuple[ParityRun, dict[str, str]]:
    """The run SIGKILLed once HF has journalled its first batch of 16, then resumed: (the resumed run, the journal
    lines HF had written before the kill)."""
    tmp = tmp_path_factory.mktemp("scale")
    out = tmp / "reports"
    proc = start_parity_run(write_scenario(tmp / "scale.yaml", scenario_text()), out)
    try:
        wait_for(lambda: journal_lines(out, "hf") >= 16, timeout=300)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    run_dir = next(out.iterdir())
    before = (run_dir / "engines" / "hf" / "results.jsonl").read_text().splitlines()
    run = parity("run", "--resume", str(run_dir), env={"LLM_PARITY_PROGRESS_S": "0.2"})
    return ParityRun(run.code, run.stdout, run.stderr, run_dir), {json.loads(x)["case_id"]: x for x in before}


def test_killed_half_way_the_run_resumes_with_what_was_journalled(killed_then_resumed) -> None:
    run, before = killed_then_resumed
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert 16 <= len(before) < CASES  # killed between HF's batches
    reused = re.search(r"(\d+) of 80 results reused", run.stdout)
    assert reused and int(reused.group(1)) >= len(before)
    after = (run.run_dir / "engines" / "hf" / "results.jsonl").read_text().splitlines()
    assert all(line in after for line in before.values())  # reused as written, not recomputed
    assert len(run.results) == 2 * CASES and set(run.results.status) == {"ok"}


def test_vllm_gets_every_case_in_one_call_and_hf_batches_of_16(killed_then_resumed) -> None:
    run, before = killed_then_resumed
    results = run.results.set_index(["engine", "case_id"])
    assert {json.loads(t)["batch_size"] for t in results.loc["vllm"].timings} == {CASES}
    hf_sizes = [json.loads(results.loc[("hf", case)].timings)["batch_size"] for case in before]
    assert set(hf_sizes) == {16}  # the first batch, journalled before the kill


def test_progress_is_plain_lines_with_rate_and_time_left(killed_then_resumed) -> None:
    run, _ = killed_then_resumed
    lines = [line for line in run.stderr.splitlines() if line.startswith("progress ")]
    assert lines, run.stderr[-2000:]
    assert any(re.search(r"progress \w+: \w+, \d+/40 cases, [\d.]+ cases/s, about \d+ (s|min) left", x) for x in lines)
    assert "\r" not in run.stderr
