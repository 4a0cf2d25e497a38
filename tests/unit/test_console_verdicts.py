"""What a run prints of its verdicts: a large run's problems first, a line for what it leaves out, and lists of case
ids cut to one readable line (summary.md and the report keep every row)."""

from __future__ import annotations

import pandas as pd

from harness.render import markdown
from harness.render.console import console
from harness.verdicts.tokens import CONSOLE_ROWS, FAMILY


def verdicts(count: int, diverged: set[int]) -> pd.DataFrame:
    return pd.DataFrame([{"case_id": f"q{i}", "engine": "b", "verdict": "diverged" if i in diverged else "match",
                          "expected": i not in diverged, "first_divergence": 1 if i in diverged else -1,
                          "max_abs_logprob_delta": 0.0, "explanation": "x"} for i in range(count)])


def printed(rows: pd.DataFrame) -> list[str]:
    with console.capture() as captured:
        FAMILY.print(rows, "a")
    return captured.get().splitlines()


def test_a_small_run_prints_every_row_in_run_order() -> None:
    lines = printed(verdicts(CONSOLE_ROWS, {3}))
    rows = [line.split(" | ")[0].strip("| ") for line in lines if line.startswith("| q")]
    assert rows == [f"q{i}" for i in range(CONSOLE_ROWS)]
    assert not any(line.startswith("...") for line in lines)


def test_a_large_run_prints_its_problems_first_and_says_what_it_left_out() -> None:
    lines = printed(verdicts(1024, {700, 1000, 1023}))
    rows = [line.split(" | ")[0].strip("| ") for line in lines if line.startswith("| q")]
    assert len(rows) == CONSOLE_ROWS and rows[:4] == ["q700", "q1000", "q1023", "q0"]
    assert lines[-1] == ("... and 974 more rows, 0 of them not as expected (problems come first): every row is in "
                         "summary.md and the report")


def test_more_problems_than_rows_are_counted_in_the_last_line() -> None:
    lines = printed(verdicts(200, set(range(0, 200, 2))))
    assert lines[-1].startswith("... and 150 more rows, 50 of them not as expected")


def test_case_lists_are_cut_to_one_line() -> None:
    assert markdown.some(["a", "b"]) == "a, b"
    assert markdown.some([f"q{i}" for i in range(1024)]) == "q0, q1, q2, q3, q4, q5, q6, q7 and 1,016 more"
