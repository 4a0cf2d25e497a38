"""How the harness's child processes live: the environment an engine process starts with, and dying with the
parent that started it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

from harness.core.paths import PROJECT_ROOT

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies, so nothing outlives the run that started it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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
