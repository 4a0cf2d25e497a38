"""Where engine workers run: here, as subprocesses (the local executor, the default), or as actors of a Ray cluster
(harness.executors.ray_cluster). Either way harness.executors.engine_runs drives each worker the same way and the driver
writes the run directory; an executor only supplies worker handles and says how many engines run at once.

A command picks its executor once (`--executor`, `--ray-address`) and runs inside `using(...)`; everything below it
asks `current()`. Outside a command (the library used directly) engines run locally, each in a worker of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, Protocol

from harness.executors.local_process import WorkerHandle
from harness.executors.local_thread import WorkerThread
from harness.executors.worker_pool import WorkerPool
from harness.plan.plans import EnginePlan
from harness.plan.resources import ActorResources

ExecutorName = Literal["local", "ray"]


class Worker(Protocol):
    """One engine worker as the executor loop sees it (harness.executors.local_process.WorkerHandle is the local
    one)."""

    spawned_at: float | None  # time.monotonic() of the worker's machine when its process was spawned

    @property
    def pid(self) -> int | None: ...
    def start(self) -> None: ...
    def send(self, message: dict[str, Any]) -> None: ...
    def receive(self, timeout: float) -> dict[str, Any]: ...
    def stop(self, grace: float = 30.0) -> None: ...
    def kill(self) -> None: ...


class Executor(Protocol):
    name: str
    # the command's idle workers, each kept to serve the next engine of its kind (harness.executors.worker_pool);
    # None: every engine gets a worker of its own
    workers: WorkerPool | None

    def worker(self, plan: EnginePlan) -> Worker: ...

    def parallel(self, plans: list[EnginePlan]) -> int:
        """Engines run at once when the command does not say (--parallel)."""

    def check(self, needs: dict[str, ActorResources]) -> None:
        """Refuse, before anything starts, engines (name -> resources) this executor can never run
        (EngineUnavailable)."""

    def close(self) -> None: ...


class LocalExecutor:
    """Subprocess workers on this machine (a thread for a client of a server the harness does not start); engines
    run at once: cores / threads per engine."""

    name = "local"

    def __init__(self, keep_workers: bool = False):
        self.workers = WorkerPool() if keep_workers else None

    def worker(self, plan: EnginePlan) -> Worker:
        if plan.attached_client:
            return WorkerThread(plan.name, plan.workdir / "worker.log")
        return WorkerHandle(plan.name, plan.python, plan.threads, plan.workdir / "worker.log", plan.import_paths)

    def parallel(self, plans: list[EnginePlan]) -> int:
        return max(1, (os.cpu_count() or 1) // max((p.threads for p in plans), default=1))

    def check(self, needs: dict[str, ActorResources]) -> None:
        return None

    def close(self) -> None:
        if self.workers:
            self.workers.close()


_stack: list[Executor] = [LocalExecutor()]


def current() -> Executor:
    return _stack[-1]


@contextmanager
def using(name: ExecutorName, address: str | None = None) -> Iterator[Executor]:
    """Run a command's engines on `name` (ray: attach to `address`, or start a Ray instance on this machine)."""
    if name == "local":
        if address:
            from harness.core.errors import ConfigError

            raise ConfigError("--ray-address is for --executor ray: drop it, or add --executor ray")
        executor: Executor = LocalExecutor(keep_workers=True)
    else:
        from harness.executors.ray_cluster import RayExecutor

        executor = RayExecutor.connect(address)
    _stack.append(executor)
    try:
        yield executor
    finally:
        _stack.pop()
        executor.close()


@contextmanager
def kept_loaded(keys: Iterable[tuple | None]) -> Iterator[None]:
    """For its duration, the command's idle workers holding one of these configurations (EnginePlan.load_key) stay
    loaded for a later plan of the same configuration; released after (harness.executors.worker_pool)."""
    pool = current().workers
    keys = list(keys)
    if pool is not None:
        pool.expect(keys)
    try:
        yield
    finally:
        release_loaded(keys)


def release_loaded(keys: Iterable[tuple | None]) -> None:
    """These configurations are not needed again in this command (see kept_loaded)."""
    pool = current().workers
    if pool is not None:
        pool.release(keys)
