"""`parity run --plan` and the executor options without a cluster: pricing actors, packing them onto nodes by
resources, one-line errors for plan files and options, and the shipped example matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.errors import ConfigError
from harness.plan.matrix import Actor, Cost, _cost, actors, nodes_of, read_plan_file, schedule
from harness.plan.resources import GB, ActorResources, engine_resources
from harness.scenario.spec import Resources, load

from helpers import ROOT, parity_in_process, write_scenario

EXAMPLE = ROOT / "examples" / "ray-matrix"
PLACE = Path("plan.yaml")


def actor(name: str, seconds: float, **resources) -> Actor:
    return Actor("s", name, "vllm", "m", ActorResources(**resources), 1, 1, seconds)


def test_longest_first_each_where_it_starts_earliest() -> None:
    nodes = {"a": {"CPU": 8, "GPU": 1}, "b": {"CPU": 8, "GPU": 1}}
    placed = schedule([actor("short", 5, gpus=1), actor("long", 10, gpus=1), actor("mid", 6, gpus=1)], nodes, PLACE)
    ends = {p.actor.name: (p.node, p.start, p.end) for p in placed}
    assert ends["long"][1] == 0 and ends["mid"][1] == 0 and ends["long"][0] != ends["mid"][0]
    assert ends["short"] == (ends["mid"][0], 6, 11)  # after mid (free at 6), not after long (free at 10)


def test_actors_share_a_node_while_its_resources_last() -> None:
    nodes = {"n": {"CPU": 4, "GPU": 2}}
    placed = schedule([actor(f"e{i}", 10, cpus=1, gpus=1) for i in range(3)], nodes, PLACE)
    assert sorted(p.start for p in placed) == [0, 0, 10]


def test_custom_resources_and_memory_decide_the_node() -> None:
    nodes = {"small": {"CPU": 8, "memory": 64 * GB}, "big": {"CPU": 8, "memory": 512 * GB, "nvme": 1}}
    placed = schedule([actor("fat", 1, memory_gb=128), actor("disk", 1, custom={"nvme": 1})], nodes, PLACE)
    assert {p.node for p in placed} == {"big"}


def test_an_actor_no_node_can_host_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"plan.yaml: nodes: none has 1 CPU, 4 GPU, which s/x asks for"):
        schedule([actor("x", 1, gpus=4)], {"n": {"CPU": 8, "GPU": 2}}, PLACE)


def test_the_first_matching_cost_prices_an_actor_and_a_gap_names_the_fix() -> None:
    costs = [Cost(model="*70b*", engine="hf", load_s=600, case_s=0), Cost(model="*", engine="hf", load_s=60, case_s=0)]
    assert _cost(costs, "/models/llama-70b", "hf", PLACE).load_s == 600
    assert _cost(costs, "/models/llama-8b", "hf", PLACE).load_s == 60
    with pytest.raises(ConfigError, match=r"plan.yaml: costs: no entry prices model /models/x on engine vllm: add"):
        _cost(costs, "/models/x", "vllm", PLACE)


def test_node_groups_expand_with_ray_resource_names() -> None:
    plan = read_plan_file(EXAMPLE / "cluster-8xh100.yaml")
    nodes = nodes_of(plan)
    assert len(nodes) == 8 and nodes["h100-0"] == {"CPU": 96, "GPU": 8, "memory": 2000 * GB}


def test_a_bad_plan_file_names_file_and_key(tmp_path: Path) -> None:
    bad = write_scenario(tmp_path / "p.yaml", "nodes:\n  - {name: n, cpus: 8, gpu: 1}\ncosts: []\n")
    with pytest.raises(ConfigError) as err:
        read_plan_file(bad)
    message = str(err.value)
    assert str(bad) in message and "gpu" in message and "\n" not in message


def test_resources_block_overrides_the_engines_own_needs() -> None:
    assert engine_resources(4, True, None) == ActorResources(cpus=4, gpus=1)
    override = Resources(gpus=2, memory_gb=80, custom={"a100": 1})
    assert engine_resources(4, True, override) == ActorResources(cpus=4, gpus=2, memory_gb=80, custom={"a100": 1})
    assert engine_resources(4, True, override).ray_options() == {
        "num_cpus": 4, "num_gpus": 2, "memory": 80 * GB, "resources": {"a100": 1}}


def test_the_example_matrix_plans_every_engine_configuration() -> None:
    scenarios = [load(path) for path in sorted((EXAMPLE / "scenarios").glob("*.yaml"))]
    plan = read_plan_file(EXAMPLE / "cluster-8xh100.yaml")
    planned = actors(scenarios, None, plan.costs, EXAMPLE / "cluster-8xh100.yaml")
    per_model = {model: [a for a in planned if a.model == model] for model in {a.model for a in planned}}
    assert len(per_model) == 10 and {len(group) for group in per_model.values()} == {14}  # 5 engines, 9 variants
    assert all((a.resources.gpus == 0) == (a.engine == "hf") for a in planned)
    placed = schedule(planned, nodes_of(plan), PLACE)
    assert max(p.end for p in placed) < sum(a.seconds for a in planned) / 4


def test_plan_prints_actors_schedule_and_estimate() -> None:
    scenario = str(EXAMPLE / "scenarios" / "smollm2-1.7b-instruct.yaml")
    result = parity_in_process("run", "--plan", str(EXAMPLE / "cluster-8xh100.yaml"), scenario)
    assert result.code == 0, result.stdout
    assert "actors" in result.stdout and "schedule on 8 nodes" in result.stdout
    assert "estimated wall time" in result.stdout


def test_ray_address_without_the_ray_executor_is_refused() -> None:
    result = parity_in_process("run", str(ROOT / "scenarios" / "quickstart.yaml"), "--ray-address", "auto")
    assert result.code == 2 and "--ray-address is for --executor ray" in result.stderr


def test_an_address_where_nothing_listens_fails_in_seconds() -> None:
    result = parity_in_process("run", str(ROOT / "scenarios" / "quickstart.yaml"), "--executor", "ray",
                               "--ray-address", "127.0.0.1:1")
    assert result.code == 2 and "nothing listens there" in result.stderr
