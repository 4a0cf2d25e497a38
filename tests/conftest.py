"""Suite-wide scheduling: `make test` runs two pytest-xdist processes that take whole test files (--dist loadfile)
in collection order (--no-loadscope-reorder: by default xdist would order files by their number of tests, which puts
the many quick unit files first and the few-test engine files, minutes each, last). The slowest files go first and
the quick ones fill the gaps at the end, so no process runs a long file alone while the other has finished (the
suite is CPU-bound: 1-4% of the two cores idle over a run, most of it that end). Test time per file, from a fresh
clone of 16f0951 on 2026-11-27 on an AVX2 EPYC, two processes (seconds): servers 344, ray 305, sampling_semantics 288,
gemma3_workflow 254, resume 231, explain 228, gemma3_explain 209, llamacpp 205, invariance 146, beam_search 141,
fuzz_inputs 123, core_install 122, tiny_families 104, gemma3_llamacpp 77, worker_failures 71, lmdeploy_parts 68,
shipped_scenarios 65, faults 61, forked_workers 55, html_report 51; benchmarks (every script of benchmarks/ at its
smallest setting) took 287 s alone on 2026-12-02. test_ray starts third, not first: its cluster then starts after
gemma3_workflow's own Ray instance (its first test) has ended. The order within a file, and which tests
run, do not change."""

from __future__ import annotations

import sys

import pytest

# The test processes import transformers, vLLM and lmdeploy's request models, and with them (through torch's compiler
# modules) triton, whose extension prints a "nanobind: leaked ..." block at interpreter exit after the summary. Nothing
# here runs triton: marked not installed, as in every `parity` command (harness/cli.py).
sys.modules.setdefault("triton", None)

SLOWEST_FIRST = ("test_gemma3_workflow.py", "test_servers.py", "test_ray.py", "test_benchmarks.py",
                 "test_sampling_semantics.py", "test_resume.py", "test_explain.py", "test_gemma3_explain.py",
                 "test_llamacpp.py", "test_invariance.py", "test_beam_search.py", "test_fuzz_inputs.py",
                 "test_core_install.py", "test_tiny_families.py", "test_gemma3_llamacpp.py",
                 "test_worker_failures.py", "test_lmdeploy_parts.py", "test_shipped_scenarios.py", "test_faults.py",
                 "test_forked_workers.py", "test_html_report.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: every other file keeps its place


def pytest_terminal_summary(terminalreporter) -> None:
    """Beside --durations' slowest tests: each test file's total (setup, call and teardown of its tests), slowest
    first, so a file's shared engine start shows with the tests that use it."""
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::")[0]
                totals[path] = totals.get(path, 0.0) + report.duration
    if not totals:
        return
    terminalreporter.write_sep("=", f"test files by time (of {sum(totals.values()):.0f} s in all)")
    for path, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
