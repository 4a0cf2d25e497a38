"""Suite-wide scheduling: `make test` runs two pytest-xdist processes that take whole test files (--dist loadfile)
in collection order (--no-loadscope-reorder: by default xdist would order files by their number of tests, which puts
the many quick unit files first and the few-test engine files, minutes each, last). The slowest files go first and
the quick ones fill the gaps at the end, so no process runs a long file alone while the other has finished. Test time
per file measured on this 2-core machine, 2026-11-26, two processes (seconds; 2,773 s in all, 23 min 20 s):
tiny_families 253, servers 241, gemma3_workflow 202, sampling_semantics 186, resume 166, ray 148, invariance 147,
llamacpp 145, explain 142, beam_search 132, gemma3_explain 128, shipped_scenarios 122, gemma3_llamacpp 74,
worker_failures 72; since then servers lost a vLLM server start (about 60 s), sampling_semantics about 45 s,
shipped_scenarios a run (explain's run of bf16-greedy.yaml serves), worker_failures about 17 s. The order within a
file, and which tests run, do not change."""

from __future__ import annotations

import sys

import pytest

# The test processes import transformers, vLLM and lmdeploy's request models, and with them (through torch's compiler
# modules) triton, whose extension prints a "nanobind: leaked ..." block at interpreter exit after the summary. Nothing
# here runs triton: marked not installed, as in every `parity` command (harness/cli.py).
sys.modules.setdefault("triton", None)

SLOWEST_FIRST = ("test_tiny_families.py", "test_gemma3_workflow.py", "test_servers.py", "test_resume.py",
                 "test_ray.py", "test_invariance.py", "test_llamacpp.py", "test_explain.py",
                 "test_sampling_semantics.py", "test_beam_search.py", "test_gemma3_explain.py",
                 "test_shipped_scenarios.py", "test_gemma3_llamacpp.py", "test_worker_failures.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: every other file keeps its place
