"""Idle worker processes of finished engines, kept for the next engine of the same kind in the same command.

An engine whose description allows it (EngineDescription.worker_reuse: HF, in-process vLLM) leaves no process-wide
state behind once closed, so its worker can load the next one: on a small model most of a worker's start is importing
torch and the engine package (5-6 s of CPU for HF, 8-10 s for vLLM with its sampler's compiled kernel), which a
reused worker pays once. The pool lives as long as the command's executor, so explain's traces, drift passes and the
transplant reuse the workers of the run before them. A kept worker unloads its engine at once, freeing its memory.
A plan that may leave state behind (a patch) can take a worker but never gives it back; a worker that failed, timed
out or was interrupted is never given back either.
"""

from __future__ import annotations

import threading

from harness.executors.local_process import WorkerGone, WorkerHandle
from harness.plan.plans import EnginePlan


class WorkerPool:
    def __init__(self) -> None:
        self.idle: dict[tuple, list[WorkerHandle]] = {}
        self.lock = threading.Lock()

    def take(self, plan: EnginePlan) -> WorkerHandle | None:
        """A live idle worker for this plan, now writing to the plan's log; None: start one."""
        if plan.reuse_key is None:
            return None
        with self.lock:
            workers = self.idle.get(plan.reuse_key, [])
            while workers:
                worker = workers.pop()
                if worker.process is not None and worker.process.poll() is None:
                    worker.log_path = plan.workdir / "worker.log"
                    return worker
        return None

    def has_idle(self, key: tuple) -> bool:
        """Whether a worker kept for plans of this reuse key is waiting (it may have died meanwhile: take says)."""
        with self.lock:
            return bool(self.idle.get(key))

    def give(self, plan: EnginePlan, worker: object) -> bool:
        """Keep the worker of a plan that finished cleanly for the next plan of its kind; False: stop it yourself."""
        if plan.reuse_key is None or plan.leaves_state or not isinstance(worker, WorkerHandle):
            return False
        try:
            worker.send({"op": "unload"})
        except WorkerGone:
            return False
        with self.lock:
            self.idle.setdefault(plan.reuse_key, []).append(worker)
        return True

    def close(self, kill: bool = False) -> None:
        """Stop the idle workers (kill: at once, the user interrupted)."""
        with self.lock:
            workers = [w for group in self.idle.values() for w in group]
            self.idle.clear()
        for worker in workers:
            worker.kill() if kill else worker.stop()
