"""Effective params are computed once per answer, off the results' path: the disk cache, its lock across processes
and the background computation a worker starts when a batch arrives."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.contract import SamplingCode
from adapters.sampling.effective_cache import InBackground, effective_for
from harness.core.paths import PROJECT_ROOT
from harness.core.vocabulary import SamplingParams

MODULE = "tests.unit.slow_sampling_code"
ASK = ("from adapters.sampling.effective_cache import effective_for;"
       "from harness.core.vocabulary import SamplingParams;"
       "effective_for('tests.unit.slow_sampling_code', {{}}, '{model}', 'float32', SamplingParams(temperature=0.5))")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("LLM_PARITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COUNT_FILE", str(tmp_path / "count"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "generation_config.json").write_text('{"top_k": 20}')
    return tmp_path


def computations(tmp: Path) -> int:
    count = tmp / "count"
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_two_processes_asking_at_once_compute_the_answer_once(isolated: Path):
    ask = [sys.executable, "-c", ASK.format(model=isolated / "model")]
    procs = [subprocess.Popen(ask, cwd=PROJECT_ROOT) for _ in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert computations(isolated) == 1


def test_background_answers_match_and_the_caller_is_not_held(isolated: Path):
    params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.5), SamplingParams(temperature=0.9)]
    started = time.monotonic()
    background = InBackground(MODULE, {}, str(isolated / "model"), "float32", params)
    assert time.monotonic() - started < 0.5  # the computation runs in its thread
    answers = [background.get(p) for p in params]
    assert computations(isolated) == 2  # once per distinct params
    assert answers[0] == answers[1] == effective_for(MODULE, {}, str(isolated / "model"), "float32", params[0])
    assert answers[2]["temperature"] == 0.9 and computations(isolated) == 2  # the last call came from the cache


def test_a_failing_sampling_code_is_a_note_not_an_error(isolated: Path):
    answer = InBackground("no_such_sampling_module", {}, str(isolated / "model"), "float32",
                          [SamplingParams()]).get(SamplingParams())
    assert answer["notes"][0].startswith("effective params not computed: ModuleNotFoundError")


def test_apart_computes_in_a_child_process_once_then_answers_from_the_cache(isolated: Path):
    params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.9)]
    answers = [InBackground(MODULE, {}, str(isolated / "model"), "float32", params, apart=True).get(p) for p in params]
    assert computations(isolated) == 2 and [a["temperature"] for a in answers] == [0.5, 0.9]
    again = InBackground(MODULE, {}, str(isolated / "model"), "float32", params, apart=True)
    assert [again.get(p) for p in params] == answers and computations(isolated) == 2


def test_a_child_that_cannot_run_the_sampling_code_is_a_note(isolated: Path):
    answer = InBackground("no_such_sampling_module", {}, str(isolated / "model"), "float32", [SamplingParams()],
                          apart=True).get(SamplingParams())
    assert "sampling code's process exited 1" in answer["notes"][0] and "ModuleNotFoundError" in answer["notes"][0]


def test_one_params_job_serves_several_engines_and_a_repeat_computes_nothing(isolated: Path):
    """`parity params` sends the engines that share an interpreter and sampling module to one process, each item with
    its own kwargs, model and dtype, through the cache a run fills."""
    from harness.semantics.jobs import SamplingJob

    other = isolated / "other-model"
    other.mkdir()
    (other / "generation_config.json").write_text('{"top_k": 7}')
    items = [{"case_id": "a", "params": {"temperature": 0.5}, "model_path": str(isolated / "model")},
             {"case_id": "b", "params": {"temperature": 0.5}, "model_path": str(other), "dtype": "bfloat16"}]
    job = SamplingJob("effective", "one, two", SamplingCode(MODULE, {}), isolated / "model", "float32", items,
                      cached=True)
    answers = [item["effective"] for item in job.run()["items"]]
    assert computations(isolated) == 2  # the same params for two models and dtypes: two answers
    assert [a["temperature"] for a in answers] == [0.5, 0.5]
    assert [item["effective"] for item in job.run()["items"]] == answers and computations(isolated) == 2
