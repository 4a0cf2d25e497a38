"""Suite-wide scheduling: `make test` runs two pytest-xdist processes that take whole test files (--dist loadfile) in
collection order. Files in alphabetical order leave the slowest ones (tiny families, servers, sampling semantics) for
the end, where one process can run a five-minute file alone while the other has finished; the slowest files go first
instead. Test time per file measured on this 2-core machine, 2026-11-25 (seconds): tiny_families 325,
sampling_semantics 251, servers 232, gemma3_workflow 194, invariance 188, ray 180, llamacpp 177, resume 177. The
order within a file, and which tests run, do not change."""

from __future__ import annotations

import pytest

SLOWEST_FIRST = ("test_tiny_families.py", "test_sampling_semantics.py", "test_servers.py", "test_gemma3_workflow.py",
                 "test_invariance.py", "test_ray.py", "test_llamacpp.py", "test_resume.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: every other file keeps its place
