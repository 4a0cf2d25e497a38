"""What the fuzz tests share: hypothesis settings, the missing interpreter that keeps engines from starting, and the
check every fuzzed command is held to (exit 0 or a documented error exit, one line on error, never a traceback)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings

NOWHERE = "/nonexistent/python"  # an engine whose interpreter is missing: a run stops at exit 3, nothing starts
OK_CODES = {0, 2, 3}


def fuzz_settings(examples: int):
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example])


def check(done, path: Path | None = None) -> None:
    """Exit 0 or a documented error exit; on error one line, naming the file when the input was a file."""
    assert not done.traceback, done.traceback
    assert done.code in OK_CODES, (done.code, done.stdout[-1500:], done.stderr[-1500:])
    assert "Traceback" not in done.stdout + done.stderr
    if done.code != 0:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        if path is not None and done.code == 2:
            assert str(path) in lines[0], lines[0]


def validated(path: Path, odd: list[str] | None):
    """`parity validate` in-process: exit 0 where the change is usable (odd []), exit 2 in one line naming the
    scenario and every word of `odd` where it is not (odd None: either, never a traceback)."""
    from helpers import parity_in_process

    done = parity_in_process("validate", str(path))
    check(done, path)
    if odd is None:
        assert done.code in (0, 2), done.stderr
    elif odd:
        assert done.code == 2, (odd, done.stdout)
        assert all(word in done.stderr for word in odd), (odd, done.stderr)
    else:
        assert done.code == 0, done.stderr
    return done
