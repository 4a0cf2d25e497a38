"""The command's idle workers (harness.executors.worker_pool): a plan of a configuration a later phase expects keeps
its engine loaded for it; a plan of another configuration never unloads what a later phase expects of its own model,
but may take a worker of another model's; released configurations unload. Workers here are idle processes, no
engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.executors import worker_pool
from harness.executors.local_process import WorkerHandle
from harness.executors.worker_pool import WorkerPool
from harness.plan.plans import EnginePlan, LoadKey


def key(model: str, dtype: str = "float32", options: str = "{}") -> LoadKey:
    return LoadKey("adapters.engines.hf:Engine", None, 1, "/scenarios", model, dtype, options)


def plan(tmp_path: Path, load_key: LoadKey, leaves_state: bool = False) -> EnginePlan:
    from harness.core.types import EngineSetup

    setup = EngineSetup(name="e", model_path=Path(load_key.model_path), dtype=load_key.dtype, workdir=tmp_path)
    return EnginePlan(engine="hf", factory=load_key.factory, package=None, sampling=None, setup=setup, python=None,
                      threads=1, batch_size=1, requests=[], load_timeout=1, case_timeout=1, reuse_key=("hf",),
                      load_key=load_key, leaves_state=leaves_state)


@pytest.fixture
def idle_worker(tmp_path: Path):
    """A WorkerHandle whose process is a plain idle one (it reads and ignores the pool's messages)."""
    made = []

    def make() -> WorkerHandle:
        handle = WorkerHandle("w", None, 1, tmp_path / "worker.log")
        handle.process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                                          text=True)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        handle.process.kill()
        handle.process.wait()


@pytest.fixture(autouse=True)
def roomy(monkeypatch):
    monkeypatch.setattr(worker_pool, "memory_tight", lambda: False)


def test_an_expected_configuration_stays_loaded_for_its_next_plan(tmp_path: Path, idle_worker) -> None:
    pool, worker = WorkerPool(), idle_worker()
    pool.expect([key("/m")])
    assert pool.give(plan(tmp_path, key("/m")), worker) and pool.holds(key("/m"))
    assert pool.take(plan(tmp_path, key("/m"))) == (worker, True)


def test_a_configuration_nobody_expects_is_unloaded_for_the_next_engine_of_its_kind(tmp_path: Path,
                                                                                     idle_worker) -> None:
    pool, worker = WorkerPool(), idle_worker()
    assert pool.give(plan(tmp_path, key("/m")), worker) and not pool.holds(key("/m"))
    assert pool.take(plan(tmp_path, key("/other"))) == (worker, False)


def test_what_a_later_phase_expects_of_the_same_model_is_not_unloaded(tmp_path: Path, idle_worker) -> None:
    """A patched copy of the reference's model takes no worker holding the reference's configuration: its traces
    would load the model again. Another model's may go: a matrix of models would hold a process per model."""
    pool, worker = WorkerPool(), idle_worker()
    pool.expect([key("/m"), key("/n")])
    pool.give(plan(tmp_path, key("/m")), worker)
    assert pool.take(plan(tmp_path, key("/m", options='{"patch": "f:g"}'))) is None
    assert pool.take(plan(tmp_path, key("/n"))) == (worker, False)


def test_a_patched_engine_is_kept_only_for_its_own_configuration(tmp_path: Path, idle_worker) -> None:
    pool, worker = WorkerPool(), idle_worker()
    patched = key("/m", options='{"patch": "f:g"}')
    pool.expect([patched])
    assert pool.give(plan(tmp_path, patched, leaves_state=True), worker)
    assert pool.take(plan(tmp_path, key("/other"))) is None
    assert pool.take(plan(tmp_path, patched, leaves_state=True)) == (worker, True)


def test_released_configurations_unload_or_stop(tmp_path: Path, idle_worker) -> None:
    pool, kind, patched = WorkerPool(), idle_worker(), idle_worker()
    patched_key = key("/m", options='{"patch": "f:g"}')
    pool.expect([key("/m"), patched_key])
    pool.give(plan(tmp_path, key("/m")), kind)
    pool.give(plan(tmp_path, patched_key, leaves_state=True), patched)
    pool.release([key("/m"), patched_key])
    assert not pool.holds(key("/m")) and pool.has_idle(("hf",))  # unloaded, kept for its kind
    assert patched.process.wait(timeout=40) is not None  # stopped: nothing else may use it


def test_with_memory_tight_nothing_stays_loaded(tmp_path: Path, idle_worker, monkeypatch) -> None:
    monkeypatch.setattr(worker_pool, "memory_tight", lambda: True)
    pool = WorkerPool()
    pool.expect([key("/m")])
    pool.give(plan(tmp_path, key("/m")), idle_worker())
    assert not pool.holds(key("/m"))


def test_each_expected_use_is_counted_off_when_taken(tmp_path: Path, idle_worker) -> None:
    """Expected once: the plan that takes the loaded engine uses that up, and its worker, given back, unloads (the
    noise floor then loads in the reference's worker, unloaded after its trace)."""
    pool, worker = WorkerPool(), idle_worker()
    pool.expect([key("/m")])
    pool.give(plan(tmp_path, key("/m")), worker)
    assert pool.take(plan(tmp_path, key("/m"))) == (worker, True)
    pool.give(plan(tmp_path, key("/m")), worker)
    assert not pool.holds(key("/m"))
    assert pool.take(plan(tmp_path, key("/m", dtype="float64"))) == (worker, False)


def test_closing_the_pool_stops_its_workers_side_by_side(tmp_path: Path) -> None:
    """Each worker is told to stop before the pool waits for any: the second hears its close while the first is
    still ending (each here takes a second to end, writing when it heard the close and when it ended; both are
    reading their stdin before the pool closes)."""
    pool, processes = WorkerPool(), []
    ending = ("import sys, time; print('ready', flush=True); sys.stdin.read(); "
              "open(sys.argv[1], 'w').write(repr(time.time())); time.sleep(1); "
              "open(sys.argv[2], 'w').write(repr(time.time()))")
    try:
        for name in ("a", "b"):
            handle = WorkerHandle(name, None, 1, tmp_path / f"{name}.log")
            handle.process = subprocess.Popen([sys.executable, "-c", ending, str(tmp_path / f"{name}.heard"),
                                               str(tmp_path / f"{name}.ended")], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, text=True)
            processes.append(handle.process)
            assert handle.process.stdout.readline() == "ready\n"
            pool.give(plan(tmp_path, key(f"/{name}")), handle)
        pool.close()
    finally:
        for process in processes:
            process.kill()
            process.wait()
            process.stdout.close()
    heard = [float((tmp_path / f"{n}.heard").read_text()) for n in ("a", "b")]
    ended = [float((tmp_path / f"{n}.ended").read_text()) for n in ("a", "b")]
    assert max(heard) < min(ended)
