"""Run engines' own sampling code (adapters.sampling.worker) in a subprocess with the engine's interpreter and
thread settings: effective params for `parity params`, processed distributions for the sampler transplant."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.contract import SamplingCode
from harness.core.forked_process import run_module
from harness.core.paths import PROJECT_ROOT
from harness.core.processes import worker_env


class SamplingJobFailed(Exception):
    pass


@dataclass
class SamplingJob:
    task: str  # effective | transplant | beams
    engine: str  # the engine instance's name, for messages
    code: SamplingCode | None
    model_path: Path
    dtype: str
    items: list[dict[str, Any]]
    python: str | None = None
    threads: int = 1
    cached: bool = False  # effective answers through the cache under $LLM_PARITY_CACHE/effective (runs fill it)
    engines: list[str] = field(default_factory=list)  # the engines whose items it carries (a job may serve several)

    def run(self, timeout: float = 600) -> dict[str, Any]:
        if self.code is None:
            return {"unavailable": f"{self.engine} has no sampling code to run here"}
        job = {"task": self.task, "module": self.code.module, "kwargs": self.code.kwargs,
               "model_path": str(self.model_path), "dtype": self.dtype, "items": self.items, "cached": self.cached}
        try:
            proc = run_module(self.python or sys.executable, "adapters.sampling.worker", json.dumps(job), timeout,
                              worker_env(self.threads), PROJECT_ROOT)
        except subprocess.TimeoutExpired:
            raise SamplingJobFailed(f"{self.engine} sampling code did not answer within {timeout:g}s") from None
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode != 0 or not lines:
            tail = " | ".join(line.strip() for line in proc.stderr.splitlines()[-3:])
            raise SamplingJobFailed(f"{self.engine} sampling code failed (exit {proc.returncode}): {tail}")
        return json.loads(lines[-1])
