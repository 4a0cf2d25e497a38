"""Suite-wide scheduling: `make test` runs two pytest-xdist processes that take whole test files (--dist loadfile)
in collection order (--no-loadscope-reorder: by default xdist would order files by their number of tests, which puts
the many quick unit files first and the few-test engine files, minutes each, last). The slowest files go first and
the quick ones fill the gaps at the end, so neither process runs a long file alone while the other has finished.
Test time per file measured on this 2-core machine, 2026-11-26 (seconds, workers reused within a command): servers
313, tiny_families 301, ray 287, sampling_semantics 256, resume 191, gemma3_workflow 190, llamacpp 146, beam_search
146, explain 136, invariance 117, gemma3_explain 116, shipped_scenarios 102, gemma3_llamacpp 85; the suite took 27 min
1 s for 3,222 s of test time, so the two processes ended within seconds of each other. The order within a file, and
which tests run, do not change."""

from __future__ import annotations

import pytest

SLOWEST_FIRST = ("test_servers.py", "test_tiny_families.py", "test_ray.py", "test_sampling_semantics.py",
                 "test_resume.py", "test_gemma3_workflow.py", "test_llamacpp.py", "test_beam_search.py",
                 "test_explain.py", "test_invariance.py", "test_gemma3_explain.py", "test_shipped_scenarios.py",
                 "test_gemma3_llamacpp.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: every other file keeps its place
