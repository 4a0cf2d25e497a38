"""Runs each engine's cases in its own worker (a local subprocess or a Ray actor: harness.executors.choice); every
result is journaled to disk, by the driver, as it arrives.

A worker that fails to load, dies, or exceeds its timeout turns the cases it owed into engine-error results.
The cases after them go to a restarted worker (up to MAX_RESTARTS times), so one bad case does not sink a run.
Where the executor allows it, the worker of a finished engine serves the next engine of its kind
(harness.executors.worker_pool), and a free slot goes to the engine that needs no second worker of a running kind
(harness.executors.start_next).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from harness.core.types import Request, Result, TraceRequest, TraceResult
from harness.executors import choice
from harness.executors.choice import Executor, Worker
from harness.executors.local_process import WorkerGone, WorkerTimeout
from harness.executors.start_next import next_to_start, start_order
from harness.executors.worker_pool import WorkerPool
from harness.plan.plans import EnginePlan
from harness.rundir.journal import JOURNAL, save_engine_info

MAX_RESTARTS = 2


@dataclass
class EngineOutcome:
    name: str
    results: dict[str, Result | TraceResult] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    load_s: list[float] = field(default_factory=list)
    model_loads: int = 0  # engines constructed (0: it was served by an engine a previous plan left loaded)
    worker_pids: list[int] = field(default_factory=list)
    restarts: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # the first worker's: process start, imports, load

    def info(self) -> dict:
        """Everything but the results: what engines/<name>/engine.json keeps for a resumed run."""
        return {"versions": self.versions, "load_s": self.load_s, "model_loads": self.model_loads,
                "worker_pids": self.worker_pids, "restarts": self.restarts, "phases": self.phases}


Progress = Callable[[str, str], None]  # (engine name, event): "loading" | "ready" | "case" | "done"


class Recorded:
    """Every run's results as they are recorded, for the runs that need another's first (EnginePlan.after)."""

    def __init__(self) -> None:
        self.results: dict[str, dict[str, Result | TraceResult]] = {}
        self.finished: set[str] = set()
        self.changed = threading.Condition()

    def add(self, name: str, result: Result | TraceResult) -> None:
        with self.changed:
            self.results.setdefault(name, {})[result.case_id] = result
            self.changed.notify_all()

    def finish(self, name: str) -> None:
        with self.changed:
            self.finished.add(name)
            self.changed.notify_all()

    def wait(self, name: str, case_ids: list[str], stopped: threading.Event) -> dict[str, Result | TraceResult]:
        """The named run's results for these cases, once it has them all or has finished (missing: none came)."""
        def ready() -> bool:
            return name in self.finished or set(case_ids) <= set(self.results.get(name, {}))

        with self.changed:
            while not ready() and not stopped.is_set():
                self.changed.wait(0.25)
            got = self.results.get(name, {})
            return {c: got[c] for c in case_ids if c in got}


class EngineRun:
    def __init__(self, plan: EnginePlan, progress: Progress, executor: Executor, label: str,
                 pool: WorkerPool | None = None, wanted: Callable[[], set] = set, recorded: Recorded | None = None):
        self.plan, self.executor, self.label, self.pool = plan, executor, label, pool
        self.wanted = wanted  # the load keys of the plans still waiting to start (their loaded workers are theirs)
        self.recorded = recorded or Recorded()
        self.progress = lambda event: progress(label, event)
        self.outcome = EngineOutcome(plan.name)
        self.worker: Worker | None = None
        self.stopped = threading.Event()
        self.journal = None
        self.result_type = TraceResult if plan.op == "trace" else Result

    def _record(self, result: Result | TraceResult) -> None:
        self.outcome.results[result.case_id] = result
        self.recorded.add(self.plan.name, result)
        self.journal.write(json.dumps(result.model_dump(mode="json")) + "\n")
        self.journal.flush()
        self.progress("case")

    def _fail(self, requests: list[Request], error: str) -> None:
        for request in requests:
            if request.case_id not in self.outcome.results:
                self._record(self.result_type.engine_error(request.case_id, self.plan.name,
                                                           f"engine error: {error}"))

    def _start_worker(self) -> None:
        self.progress("loading")
        taken = self.pool.take(self.plan, self.wanted) if self.pool else None
        if taken is not None:
            kept, loaded = taken
            try:
                self._load(kept, reused=True, keep=loaded)
                return
            except WorkerGone:  # died while idle, or the load failed there: the engine gets a fresh worker
                kept.kill()
        worker = self.executor.worker(self.plan)
        worker.start()
        self._load(worker, reused=False)

    def _load(self, worker: Worker, reused: bool, keep: bool = False) -> None:
        """Load the plan's engine in the worker (keep: the worker holds this configuration loaded already, and the
        engine serves the plan as it is if it can)."""
        plan = self.plan
        self.worker = worker
        if self.worker.pid is not None:  # a worker thread has none
            self.outcome.worker_pids.append(self.worker.pid)
            (plan.workdir / "worker.pid").write_text(str(self.worker.pid))
        self.worker.send({"op": "load", "factory": plan.factory, "setup": plan.setup.model_dump(mode="json"),
                          "sampling": plan.sampling, "package": plan.package, "params": _distinct_params(plan),
                          "log": str(plan.workdir / "worker.log") if reused else None, "keep": keep})
        message = self.worker.receive(plan.load_timeout)
        if message["event"] != "ready":
            raise WorkerGone(f"could not load: {message.get('error', message)}")
        self.outcome.versions = message["versions"]
        self.outcome.load_s.append(message["load_s"])
        self.outcome.model_loads += bool(message.get("model_loaded", True))
        if not self.outcome.phases:
            phases = message.get("phases", {})
            spawned = self.worker.spawned_at  # by the clock of the worker's own machine, as main_at is
            started = 0.0 if reused else phases.get("main_at", spawned) - spawned
            self.outcome.phases = {"process_start_s": started, "imports_s": phases.get("imports_s", 0.0),
                                   "load_s": phases.get("load_s", 0.0)}
        if plan.op == "generate":  # what a resumed run needs of an engine it does not start again
            save_engine_info(plan.workdir, self.outcome.info())
        self.progress("ready")

    def _run_batch(self, batch: list[Request] | list[TraceRequest]) -> None:
        self.worker.send({"op": self.plan.op, "requests": [r.model_dump(mode="json") for r in batch]})
        owed = {r.case_id for r in batch}
        while True:
            message = self.worker.receive(self.plan.case_timeout * max(1, len(owed)))
            if message["event"] == "result":
                result = self.result_type.model_validate(message["result"])
                owed.discard(result.case_id)
                self._record(result)
            elif message["event"] == "case_error":
                owed.discard(message["case_id"])
                self._record(self.result_type.engine_error(message["case_id"], self.plan.name,
                                                           f"engine error: {message['error']}"))
            elif message["event"] == "batch_done":
                return

    def run(self) -> EngineOutcome:
        pending = self.plan.batches()
        self.plan.workdir.mkdir(parents=True, exist_ok=True)
        self.journal = open(self.plan.workdir / ("traces.jsonl" if self.plan.op == "trace" else JOURNAL), "a")
        finished = False
        try:
            while pending and not self.stopped.is_set():
                batch = pending.pop(0)
                try:
                    if self.worker is None:
                        self._start_worker()
                    batch = self._after_dependency(batch)
                    if batch:
                        self._run_batch(batch)
                except (WorkerGone, WorkerTimeout) as exc:
                    if self.stopped.is_set():
                        break  # interrupted: unfinished cases stay missing, reported as not run
                    error = f"timed out ({exc}); worker killed" if isinstance(exc, WorkerTimeout) else str(exc)
                    self._fail(batch, error)
                    self._discard_worker()
                    if self.outcome.restarts >= MAX_RESTARTS:
                        self._fail([r for b in pending for r in b],
                                   f"not run: the worker failed {MAX_RESTARTS + 1} times ({error})")
                        pending = []
                    self.outcome.restarts += 1
            finished = not self.stopped.is_set()
        finally:
            if self.worker is not None:
                if not (finished and self.pool and self.pool.give(self.plan, self.worker)):
                    self.worker.stop()
                self.worker = None  # stopped, or kept for another engine: this run no longer owns it
            self.journal.close()
            self.recorded.finish(self.plan.name)
            self.progress("done")
        return self.outcome

    def _after_dependency(self, batch: list) -> list:
        """The batch's requests whose dependency (EnginePlan.after) succeeded, once it has answered them; the others
        are recorded as not run, with the dependency's error."""
        if self.plan.after is None:
            return batch
        got = self.recorded.wait(self.plan.after, [r.case_id for r in batch], self.stopped)
        ready = []
        for request in batch:
            result = got.get(request.case_id)
            if result is not None and result.status == "ok":
                ready.append(request)
            elif not self.stopped.is_set():
                why = result.error if result is not None else "no result"
                self._record(self.result_type.engine_error(request.case_id, self.plan.name,
                                                           f"not run: {self.plan.after} failed on this case ({why})"))
        return ready

    def _discard_worker(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def abort(self) -> None:
        """Called from the main thread on Ctrl-C: stop dispatching and kill the worker now."""
        self.stopped.set()
        worker = self.worker  # its thread may drop it meanwhile, having stopped it
        if worker is not None:
            worker.kill()


def run_engines(plans: list[EnginePlan], parallel: int | None, progress: Progress, recorded: Recorded | None = None,
                stop: threading.Event | None = None) -> tuple[dict[str, EngineOutcome], bool]:
    """Run all plans (of one scenario: their names differ), `parallel` engines at a time (None: as the current
    executor decides). Returns the outcomes by plan name and whether the user interrupted (or `stop` was set).
    recorded: the results of plans run by another call (EnginePlan.after may name them), shared with it."""
    outcomes, interrupted = run_plans(plans, parallel, progress, [p.name for p in plans], recorded, stop)
    return {plan.name: outcome for plan, outcome in zip(plans, outcomes, strict=True)}, interrupted


def run_plans(plans: list[EnginePlan], parallel: int | None, progress: Progress, labels: list[str],
              recorded: Recorded | None = None,
              stop: threading.Event | None = None) -> tuple[list[EngineOutcome], bool]:
    """Run plans of one or several scenarios on the current executor; each reports progress under its label.
    Returns the outcomes in plan order and whether the user interrupted: Ctrl-C in the main thread, or `stop` set
    from another thread (a call running in a thread of its own gets no KeyboardInterrupt)."""
    executor = choice.current()
    executor.check({plan.name: plan.resources for plan in plans})
    workers = executor.workers
    waiting: list[EngineRun] = []
    recorded = recorded or Recorded()
    runs = [EngineRun(plan, progress, executor, label, workers, lambda: {r.plan.load_key for r in waiting}, recorded)
            for plan, label in zip(plans, labels, strict=True)]
    slots = max(1, parallel or executor.parallel(plans))
    waiting[:], running, futures = sorted(runs, key=start_order), {}, []
    pool = ThreadPoolExecutor(max_workers=slots)
    interrupted = False
    try:
        while waiting or running:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            while waiting and len(running) < slots:
                run = next_to_start(waiting, running.values(), workers, parallel is not None)
                if run is None:  # the next engines wait for the worker of their kind
                    break
                waiting.remove(run)
                future = pool.submit(run.run)
                running[future], futures = run, futures + [future]
            # returns when a run ends (its slot, or its kept worker, is free); Ctrl-C lands between waits
            for future in wait(running, timeout=0.25, return_when=FIRST_COMPLETED).done:
                del running[future]
    except KeyboardInterrupt:
        interrupted = True
        for run in runs:  # every run stops first: none takes its worker's death for an engine error
            run.stopped.set()
        for run in runs:
            run.abort()
        wait(futures, timeout=30)  # workers are dead: the engine threads wind up at once
    finally:
        if workers and interrupted:
            workers.close(kill=True)
    pool.shutdown(wait=False, cancel_futures=True)
    for future in futures:
        if future.done() and not future.cancelled() and future.exception() is not None:
            raise future.exception()
    return [run.outcome for run in runs], interrupted


def _distinct_params(plan: EnginePlan) -> list[dict]:
    """The distinct params of a generate plan's requests: its worker answers their effective params once, from load."""
    if plan.op != "generate":
        return []
    return list({r.params.model_dump_json(): r.params.model_dump(mode="json") for r in plan.requests}.values())
