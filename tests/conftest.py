"""Suite-wide scheduling: `make test` runs two pytest-xdist processes that take whole test files (--dist loadfile)
in collection order (--no-loadscope-reorder: by default xdist would order files by their number of tests, which puts
the many quick unit files first and the few-test engine files, minutes each, last). The slowest files go first and
the quick ones fill the gaps at the end, so no process runs a long file alone while the other has finished. Test time
per file measured on this 2-core machine, 2026-11-26, with three processes (seconds): tiny_families 428, servers 385,
resume 360, ray 344, gemma3_workflow 287, sampling_semantics 272, llamacpp 237, invariance 218, explain 190,
beam_search 189, gemma3_explain 169, shipped_scenarios 147, gemma3_llamacpp 110 (24 min 22 s for 4,305 s of test
time). The order within a file, and which tests run, do not change."""

from __future__ import annotations

import sys

import pytest

# The test processes import transformers, vLLM and lmdeploy's request models, and with them (through torch's compiler
# modules) triton, whose extension prints a "nanobind: leaked ..." block at interpreter exit after the summary. Nothing
# here runs triton: marked not installed, as in every `parity` command (harness/cli.py).
sys.modules.setdefault("triton", None)

SLOWEST_FIRST = ("test_tiny_families.py", "test_servers.py", "test_resume.py", "test_ray.py",
                 "test_gemma3_workflow.py", "test_sampling_semantics.py", "test_llamacpp.py", "test_invariance.py",
                 "test_explain.py", "test_beam_search.py", "test_gemma3_explain.py", "test_shipped_scenarios.py",
                 "test_gemma3_llamacpp.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: every other file keeps its place
