"""Which waiting engine takes a free slot (harness.executors.start_next): a slot goes first to an engine that needs no
second worker of a kind already running; a second one starts only with --parallel or a core to spare."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.executors import start_next
from harness.executors.start_next import next_to_start, start_order
from harness.executors.worker_pool import Idle, WorkerPool

HF, VLLM = ("hf",), ("vllm",)


def run(name: str, key: tuple | None, pieces: bool = False, leaves_state: bool = False) -> SimpleNamespace:
    plan = SimpleNamespace(name=name, reuse_key=key, threads=1, fed_in_pieces=pieces, leaves_state=leaves_state,
                           load_key=None, after=None, after_done=False)
    return SimpleNamespace(plan=plan)


@pytest.fixture
def busy_machine(monkeypatch):
    monkeypatch.setattr(start_next, "spare_cores", lambda: 0.0)


@pytest.fixture
def idle_machine(monkeypatch):
    monkeypatch.setattr(start_next, "spare_cores", lambda: 8.0)


def test_an_engine_of_another_kind_goes_before_a_second_worker_of_a_running_kind(busy_machine) -> None:
    waiting = [run("hf-fault", HF), run("vllm", VLLM)]
    assert next_to_start(waiting, [run("hf", HF)], WorkerPool(), False).plan.name == "vllm"


def test_on_a_busy_machine_same_kind_engines_wait_for_the_running_ones_worker(busy_machine) -> None:
    assert next_to_start([run("hf-fault", HF)], [run("hf", HF)], WorkerPool(), False) is None


def test_an_idle_worker_of_the_kind_is_taken_at_once(busy_machine) -> None:
    pool = WorkerPool()
    pool.idle.append(Idle(worker=object(), reuse_key=HF, loaded=None))
    assert next_to_start([run("hf-fault", HF)], [run("hf", HF)], pool, False).plan.name == "hf-fault"


def test_a_second_worker_starts_on_an_idle_machine_or_when_parallel_was_set(busy_machine, monkeypatch) -> None:
    waiting, running = [run("hf-fault", HF)], [run("hf", HF)]
    assert next_to_start(waiting, running, WorkerPool(), True).plan.name == "hf-fault"
    monkeypatch.setattr(start_next, "spare_cores", lambda: 1.0)
    assert next_to_start(waiting, running, WorkerPool(), False).plan.name == "hf-fault"


def test_engines_never_reused_and_executors_without_a_pool_start_in_order(busy_machine) -> None:
    assert next_to_start([run("server", None)], [run("other", None)], WorkerPool(), False).plan.name == "server"
    assert next_to_start([run("hf-fault", HF)], [run("hf", HF)], None, False).plan.name == "hf-fault"


def test_start_order_puts_engines_fed_in_pieces_first_and_state_leavers_last(idle_machine) -> None:
    runs = [run("patched", HF, leaves_state=True), run("vllm", VLLM), run("hf", HF, pieces=True)]
    assert [r.plan.name for r in sorted(runs, key=start_order)] == ["hf", "vllm", "patched"]


def test_a_plan_whose_configuration_an_idle_worker_holds_loaded_starts_first(busy_machine) -> None:
    warm = run("hf-traces", HF)
    warm.plan.load_key = ("hf", "float32")
    pool = WorkerPool()
    pool.idle.append(Idle(worker=object(), reuse_key=HF, loaded=("hf", "float32")))
    assert next_to_start([run("vllm", VLLM), warm], [], pool, False).plan.name == "hf-traces"


def test_spare_cores_are_the_idle_share_of_the_last_moment_not_the_load_average(monkeypatch) -> None:
    """Right after another command the 1-minute load average still reads busy; the CPU time left idle now decides."""
    readings = iter([(1000, 2000), (1150, 2200)])  # 150 of the last 200 ticks idle
    monkeypatch.setattr(start_next, "_idle_and_total", lambda: next(readings))
    monkeypatch.setattr(start_next, "usable_cores", lambda: 2.0)
    monkeypatch.setattr(start_next, "SAMPLE_S", 0.0)
    monkeypatch.setattr(start_next, "_last", (-10.0, 0.0))
    monkeypatch.setattr(start_next.os, "getloadavg", lambda: (2.0, 2.0, 2.0))  # busy by the old measure
    assert start_next.spare_cores() == pytest.approx(1.5)
    assert start_next.spare_cores() == pytest.approx(1.5)  # fresh: not sampled again
