"""How the harness's child processes live: the environment an engine process starts with, dying with the parent
that started it, and being stopped with every process of their group."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn, Protocol

from harness.core.paths import PROJECT_ROOT

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies, so nothing outlives the run that started it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def exit_before_finalisation(code: int) -> NoReturn:
    """End this process with `code` once its work is done, without the interpreter's finalisation: exit handlers run
    (an engine core's shutdown among them) and Python's and C's standard streams are flushed, but threads still
    running are not waited for (the harness's own are daemons, done by then). Tearing down torch's and vLLM's
    modules took 0.8-1.1 s of a Gemma 3 worker's end, which the harness waited for; there triton (imported with vLLM)
    also prints its "nanobind: leaked ..." report into whatever stderr is: a worker's log, the tail of an error
    message."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # closed by the module, or its reader gone
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)  # what native code printed through C's buffered stdout (fd 1 is the log)
    os._exit(code)


def worker_env(threads: int, import_paths: list[str] = ()) -> dict[str, str]:
    """Explicit threads for every engine process (default OpenMP spin-waiting makes CPU runs 10-50x slower).
    import_paths (the scenario's folder) go on PYTHONPATH, so a model patch next to a scenario is importable."""
    env = dict(os.environ)
    env.update({
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "passive",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), *import_paths, env.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
        # torch's inductor (vLLM compiles its logprob-rank kernel with it) rebuilds a precompiled C++ header in every
        # process whose temp folder lacks one, even when the kernel itself is cached: 8-10 s of g++ per vLLM server
        # start, whose TMPDIR is its run's folder (a cached kernel needs no header; a new one compiles without)
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
    })
    return env


class Child(Protocol):
    """A child process leading a process group of its own (subprocess.Popen, harness.core.forked_process)."""

    pid: int

    def poll(self) -> int | None: ...


def stop_group(process: Child, grace_s: float, kill_grace_s: float = 5.0) -> None:
    """SIGTERM the process group `process` leads, then SIGKILL what is left of it after grace_s: returns once the
    leader has ended and no process of its group is left (an engine it started among them), or kill_grace_s after the
    SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_grace_s)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return  # nothing of the group is left
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if process.poll() is not None and not group_alive(process.pid):
                return
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether a process of the process group pgid still runs (a zombie, dead but not yet collected by its parent, does
    not: an orphan's is collected by init, which in a container may take seconds)."""
    return any(group == pgid and state != "Z" for _, state, _, group in _processes())


def descendants(pid: int) -> list[int]:
    """Every living process below pid (children, their children...), read from /proc; whatever session or process
    group they moved to (a server is started in a session of its own)."""
    parents: dict[int, list[int]] = {}
    for child, _, parent, _ in _processes():
        parents.setdefault(parent, []).append(child)
    found, todo = [], list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += parents.get(child, [])
    return found


def stop_descendants(grace_s: float = 5.0) -> None:
    """SIGTERM every process this one started (and theirs), then SIGKILL what is left after grace_s: what an engine
    whose load failed had started (an engine core, a server) must not outlive it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = descendants(os.getpid())
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            _reap_children()
            alive = [pid for pid in alive if _running(pid)]
            time.sleep(0.05)
        if not alive:
            return


def _processes() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state, parent's pid, process group) of every process, read from /proc."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(command)", which may hold spaces
            yield int(stat.parent.name), fields[0], int(fields[1]), int(fields[2])
        except (OSError, IndexError):
            continue  # gone meanwhile


def _reap_children() -> None:
    """Collect exited children of this process, so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
