"""Progress when stderr is not a terminal: plain periodic lines per unfinished engine with cases done, rate and time
left, no carriage return, and nothing for a run shorter than the interval. No engine runs."""

from __future__ import annotations

import time

from harness.render import console
from harness.render.console import EngineProgress


def test_plain_lines_name_cases_done_rate_and_time_left(capsys, monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    progress = EngineProgress(interval=10)
    assert progress.plain  # pytest's stderr is not a terminal
    progress.start(["vllm", "hf"], 100)
    progress.event("vllm", "ready")
    progress.event("hf", "loading")
    for _ in range(25):
        clock[0] += 0.2
        progress.event("vllm", "case")
    assert capsys.readouterr().err == ""  # 5 s in: quiet
    clock[0] += 5
    progress.event("vllm", "case")
    err = capsys.readouterr().err
    assert "progress vllm: ready, 26/100 cases, 2.6 cases/s, about 28 s left" in err
    assert "progress hf: loading, 0/100 cases" in err and "\r" not in err
    progress.event("vllm", "done")
    assert [line for line in progress.lines(clock[0]) if "vllm" in line] == []
    progress.stop()


def test_the_interval_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(console.PROGRESS_ENV, "0.5")
    assert EngineProgress().interval == 0.5
