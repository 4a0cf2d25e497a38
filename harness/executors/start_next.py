"""Which waiting engine takes a free slot of the command's parallel engines.

A second worker of a kind already running costs a whole import and load (5-6 s of CPU for HF, 8-10 s for vLLM on a
small model), where waiting for the running engine's worker costs nothing once it is kept
(harness.executors.worker_pool). So a slot goes first to an engine that needs no load at all (an idle worker holds
its configuration loaded), then to one whose worker is no second one: of a kind not running, of a kind with an idle
worker, or one that is never reused. Failing that, a second worker starts only when the user set --parallel, or when
the machine has a core to spare for it now: on an idle machine same-kind engines run side by side, on a busy one (a
CI box, a test suite) they queue for the one worker, which on a saturated machine finishes them no later and for
less CPU and memory. "Now" is the CPU time left idle over the last half second, within the cores this process may
use (its CPU affinity and its cgroup's quota): the 1-minute load average, used before, still counted the command
that had just ended, and made two engines of one kind run one after the other on an idle machine (1.50x the same
work done by two plain processes side by side).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
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
    unstarted = {run.plan.name for run in waiting}
    unfinished = unstarted | {run.plan.name for run in running}
    waiting = [run for run in waiting  # its dependency first (or done)
               if run.plan.after not in (unfinished if run.plan.after_done else unstarted)]
    if not waiting:
        return None
    if pool is None:
        return waiting[0]
    warm = next((run for run in waiting if pool.holds(run.plan.load_key)), None)
    if warm is not None:  # its engine is loaded and idle: it starts with no load at all
        return warm
    busy = {run.plan.reuse_key for run in running}
    for run in waiting:
        key = run.plan.reuse_key
        if key is None or key not in busy or pool.has_idle(key):
            return run
    first = waiting[0]
    return first if parallel_set or spare_cores() >= first.plan.threads else None


SAMPLE_S = 0.5  # how long the machine's idle time is watched before a second worker of a running kind starts
FRESH_S = 2.0  # a reading this recent answers again (the scheduler asks each time it looks at a free slot)
_last: tuple[float, float] = (-FRESH_S, 0.0)  # (when, spare cores)


def spare_cores() -> float:
    """Cores idle now: the share of CPU time the machine left idle over the last SAMPLE_S, times the cores this
    process may use."""
    global _last
    if time.monotonic() - _last[0] < FRESH_S:
        return _last[1]
    before = _idle_and_total()
    time.sleep(SAMPLE_S)
    after = _idle_and_total()
    if before is None or after is None or after[1] <= before[1]:
        spare = usable_cores() - os.getloadavg()[0]  # no /proc/stat: the load average is all there is
    else:
        spare = usable_cores() * (after[0] - before[0]) / (after[1] - before[1])
    _last = (time.monotonic(), spare)
    return spare


def _idle_and_total() -> tuple[int, int] | None:
    """The machine's idle (idle + iowait) and total CPU time so far, in clock ticks, from /proc/stat."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return fields[3] + fields[4], sum(fields[:8])


def usable_cores() -> float:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota (cgroup v2 cpu.max)."""
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    return min(cores, int(quota) / int(period)) if quota != "max" else cores
