"""Idle worker processes of finished engines, kept for the next plans of the same command.

Two ways a finished plan's worker serves again:
- still loaded: a later plan of the same configuration (EnginePlan.load_key: the run's engine tracing its cases for
  `parity explain`, a drift pass, the reference's logits pass for `parity transplant`) takes the engine as loaded
  (Engine.reuse), with no model load at all. A command says beforehand which configurations it will need again and
  how many more times (expect); only those stay loaded while idle, each later plan that takes one counting one use
  off, so an engine nobody will ask for again does not hold its memory (or a server its port) for the rest of the
  command. A patched engine is kept this way too: the patch is part of its configuration, so only its own later
  plans take it. Where memory is short (memory_tight), nothing stays loaded.
- unloaded: an engine whose description allows it (EngineDescription.worker_reuse: HF, in-process vLLM) leaves no
  process-wide state behind once closed, so its worker can load the next engine of its kind (EnginePlan.reuse_key):
  on a small model most of a worker's start is importing torch and the engine package (5-6 s of CPU for HF, 8-10 s
  for vLLM with its sampler's compiled kernel), which a reused worker pays once.
The pool lives as long as the command's executor. A worker that failed, timed out or was interrupted is never given
back.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from harness.executors.local_process import WorkerGone, WorkerHandle
from harness.plan.plans import EnginePlan, LoadKey


@dataclass
class Idle:
    worker: WorkerHandle
    reuse_key: tuple | None  # the kind of engine it can load next (None: only its own configuration)
    loaded: LoadKey | None  # the configuration it holds loaded (None: unloaded)


class WorkerPool:
    def __init__(self) -> None:
        self.idle: list[Idle] = []
        self.expected: Counter = Counter()  # configuration -> how many later plans of the command will take it
        self.lock = threading.Lock()

    def expect(self, keys: Iterable[tuple | None]) -> None:
        """Configurations (load keys) later plans of this command will need, a key once per plan: their workers stay
        loaded when idle until those plans have taken them."""
        with self.lock:
            self.expected.update(k for k in keys if k is not None)

    def take(self, plan: EnginePlan, wanted: Callable[[], set] = set) -> tuple[WorkerHandle, bool] | None:
        """A live idle worker for this plan, now writing to the plan's log, and whether it holds the plan's
        configuration loaded; None: start one. wanted(): the load keys of the plans still waiting, whose loaded
        workers are left for them."""
        with self.lock:
            for entry in self._alive():
                if plan.load_key is not None and entry.loaded == plan.load_key:
                    if self.expected[plan.load_key] > 0:
                        self.expected[plan.load_key] -= 1  # one expected use, taken
                    return self._taken(entry, plan, loaded=True)
            if plan.reuse_key is None:
                return None
            for entry in sorted(self._alive(), key=lambda e: self.expected[e.loaded] > 0):
                if entry.reuse_key == plan.reuse_key and self._may_unload(entry, plan, wanted()):
                    return self._taken(entry, plan, loaded=False)
        return None

    def _may_unload(self, entry: Idle, plan: EnginePlan, wanted: set) -> bool:
        """Whether a plan of another configuration may take this idle worker, unloading what it holds: not what a
        waiting plan wants, nor a configuration a later phase expects of the same model as the plan's (its own
        scenario's: that model would be loaded twice); a later phase's configuration of another model gives way (a
        matrix of models would otherwise hold a process per model)."""
        held = entry.loaded
        if held is None:
            return True
        if held in wanted:
            return False
        return not (self.expected[held] > 0 and plan.load_key is not None and
                    held.model_path == plan.load_key.model_path)

    def _alive(self) -> list[Idle]:
        self.idle = [e for e in self.idle if e.worker.process is not None and e.worker.process.poll() is None]
        return list(self.idle)

    def _taken(self, entry: Idle, plan: EnginePlan, loaded: bool) -> tuple[WorkerHandle, bool]:
        self.idle.remove(entry)
        entry.worker.log_path = plan.workdir / "worker.log"
        return entry.worker, loaded

    def has_idle(self, key: tuple) -> bool:
        """Whether a worker kept for plans of this reuse key is waiting (it may have died meanwhile: take says)."""
        with self.lock:
            return any(e.reuse_key == key for e in self.idle)

    def holds(self, load_key: tuple | None) -> bool:
        """Whether an idle worker holds this configuration loaded."""
        with self.lock:
            return load_key is not None and any(e.loaded == load_key for e in self.idle)

    def give(self, plan: EnginePlan, worker: object) -> bool:
        """Keep the worker of a plan that finished cleanly: loaded if a later plan expects its configuration, else
        unloaded for the next engine of its kind; False: stop it yourself."""
        if not isinstance(worker, WorkerHandle):
            return False
        reuse_key = None if plan.leaves_state else plan.reuse_key
        if plan.load_key is not None and self.expected[plan.load_key] > 0 and not memory_tight():
            entry = Idle(worker, reuse_key, plan.load_key)
        elif reuse_key is not None:
            try:
                worker.send({"op": "unload"})
            except WorkerGone:
                return False
            entry = Idle(worker, reuse_key, None)
        else:
            return False
        with self.lock:
            self.idle.append(entry)
        return True

    def release(self, keys: Iterable[tuple | None]) -> None:
        """The uses expect() announced for these keys are over, taken or not: the idle workers of configurations no
        longer expected unload (or stop, where none of another configuration could use them)."""
        with self.lock:
            self.expected.subtract(k for k in keys if k is not None)
            self.expected = +self.expected  # counts at or below zero dropped
            held = [e for e in self.idle if e.loaded is not None and self.expected[e.loaded] <= 0]
            for entry in held:
                entry.loaded = None
            stop = [e for e in held if e.reuse_key is None]
            self.idle = [e for e in self.idle if e not in stop]
        for entry in held:
            if entry not in stop:
                try:
                    entry.worker.send({"op": "unload"})
                except WorkerGone:
                    entry.worker.kill()
        stop_together([entry.worker for entry in stop])

    def close(self, kill: bool = False) -> None:
        """Stop the idle workers (kill: at once, the user interrupted)."""
        with self.lock:
            workers = [e.worker for e in self.idle]
            self.idle.clear()
            self.expected.clear()
        if kill:
            for worker in workers:
                worker.kill()
        else:
            stop_together(workers)


def stop_together(workers: list[WorkerHandle]) -> None:
    """Stop workers side by side: each closes its engine and ends while the others do (one after the other, a
    command's end waited for the sum: 3.9 s for an HF and a vLLM worker of Gemma 3, against 2.7 s for the slower)."""
    for worker in workers:
        worker.ask_to_stop()
    for worker in workers:
        worker.await_stop()


def memory_tight() -> bool:
    """Whether this machine's available memory is low enough that an idle engine should not keep its model loaded
    (less than 4 GiB or a fifth of the memory free): it is loaded again when its configuration is needed."""
    try:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/meminfo")}
    except (OSError, ValueError, IndexError):
        return False
    available, total = info.get("MemAvailable", 0), info.get("MemTotal", 0)
    return available < max(4 << 30, total // 5)
