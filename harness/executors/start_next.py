"""Which waiting engine takes a free slot of the command's parallel engines.

A second worker of a kind already running costs a whole import and load (5-6 s of CPU for HF, 8-10 s for vLLM on a
small model), where waiting for the running engine's worker costs nothing once it is kept
(harness.executors.worker_pool). So a slot goes first to an engine whose worker is no second one: of a kind not
running, of a kind with an idle worker, or one that is never reused. Failing that, a second worker starts only when
the user set --parallel, or when the machine has a core to spare for it (load average): on an idle machine same-kind
engines still run side by side, on a busy one (a CI box, a test suite) they queue for the one worker, which on a
saturated machine finishes them no later and for less CPU and memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Protocol

from harness.executors.worker_pool import WorkerPool
from harness.plan.plans import EnginePlan


class Startable(Protocol):
    plan: EnginePlan


def start_order(run: Startable) -> tuple[bool, bool]:
    """Engines fed their cases in pieces start first: with fewer engines at once than engines, the longest one
    starting last would run alone at the end (256 cases through vLLM, its server and HF, two at a time: 1.17x the
    plain engines side by side with HF started last, 0.91x with HF first). Engines that leave state in their worker
    start last, so the workers of the others are reused before theirs."""
    return run.plan.leaves_state, not run.plan.fed_in_pieces


def next_to_start(waiting: list[Startable], running: Iterable[Startable], pool: WorkerPool | None,
                  parallel_set: bool) -> Startable | None:
    """The waiting run (in start order) to start in a free slot; None: leave the slot free until a run ends."""
    if pool is None:
        return waiting[0]
    busy = {run.plan.reuse_key for run in running}
    for run in waiting:
        key = run.plan.reuse_key
        if key is None or key not in busy or pool.has_idle(key):
            return run
    first = waiting[0]
    return first if parallel_set or spare_cores() >= first.plan.threads else None


def spare_cores() -> float:
    """Cores not busy over the last minute, by the load average."""
    return (os.cpu_count() or 1) - os.getloadavg()[0]
