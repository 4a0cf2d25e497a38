"""The suite's own layout: pytest imports test files by basename (the tests folders are not packages), so two test
files of one name in different folders fail to import when one process collects both, as `make test`'s workers do."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_a_basename_of_its_own() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1]
