"""`parity run --plan FILE`: what a model x engine x config matrix would ask of a cluster, without running it.

The scenarios are planned exactly as a run plans them (one actor per engine configuration: the scenario's engines
and the invariance configurations), with no model resolved and nothing tokenised. The plan file describes the target
cluster (node groups) and gives per-case costs measured on its hardware; each actor's time is its engine's load plus
its requests' costs. Actors are then placed longest first, each on the node where it can start earliest with the
resources it asks for, which is the schedule a Ray cluster given all of them at once can reach at best.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.core.errors import ConfigError
from harness.plan import invariance_checks
from harness.plan.plans import EnginePlan, select_engines
from harness.plan.requests import plan_engines
from harness.plan.resources import GB, ActorResources, fits
from harness.scenario.spec import LoadedScenario
from harness.scenario.yaml_source import YamlSource


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodeGroup(_Strict):
    name: str
    count: int = Field(1, ge=1)
    cpus: float = Field(gt=0)
    gpus: float = Field(0, ge=0)
    memory_gb: float | None = Field(None, gt=0)
    custom: dict[str, float] = Field(default_factory=dict)  # Ray custom resources the nodes declare


class Cost(_Strict):
    """Measured on the target hardware. model and engine are shell patterns (engine: the engine type, e.g. vllm);
    the first entry that matches an actor prices it."""

    model: str = "*"
    engine: str = "*"
    load_s: float = Field(ge=0)  # start the engine and load the model
    case_s: float = Field(ge=0)  # each request
    token_s: float = Field(0, ge=0)  # each generated token (max_new_tokens x samples), on top of case_s


class PlanFile(_Strict):
    nodes: list[NodeGroup] = Field(min_length=1)
    costs: list[Cost] = Field(min_length=1)


@dataclass(frozen=True)
class Actor:
    scenario: str
    name: str  # the engine configuration (an engine of the scenario, or engine~option=value)
    engine: str
    model: str
    resources: ActorResources
    requests: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class Placement:
    actor: Actor
    node: str
    start: float

    @property
    def end(self) -> float:
        return self.start + self.actor.seconds


def read_plan_file(path: Path) -> PlanFile:
    source = YamlSource(path)
    if not isinstance(source.data, dict):
        raise source.error((), "a plan file is a mapping with nodes: and costs:")
    try:
        return PlanFile(**source.data)
    except ValidationError as exc:
        raise source.validation_error(exc) from None


def actors(scenarios: list[LoadedScenario], engines: list[str] | None, costs: list[Cost], where: Path
           ) -> list[Actor]:
    """Every engine configuration of every scenario, priced."""
    out = []
    for scenario in scenarios:
        scenario = scenario.with_engines(select_engines(scenario, engines))
        for plan in _plans(scenario):
            tokens = sum(r.params.max_new_tokens * r.num_samples for r in plan.requests)
            cost = _cost(costs, plan.model, plan.engine, where)
            out.append(Actor(scenario.name, plan.name, plan.engine, plan.model, plan.resources,
                             len(plan.requests), tokens,
                             cost.load_s + cost.case_s * len(plan.requests) + cost.token_s * tokens))
    return out


def _plans(scenario: LoadedScenario) -> list[EnginePlan]:
    """A run's plans, with prompts left untokenised and the model unresolved (neither changes what runs where)."""
    untokenised = {c.prompt.id: [] for c in scenario.cases}
    placeholder = Path("plan")
    scenario = scenario.with_resolved(resolve=lambda model, dtype, origin: Path(model))
    base = plan_engines(scenario, placeholder, untokenised)
    return invariance_checks.plan(scenario, base, placeholder, [])[0]


def _cost(costs: list[Cost], model: str, engine: str, where: Path) -> Cost:
    for cost in costs:
        if fnmatch.fnmatchcase(model, cost.model) and fnmatch.fnmatchcase(engine, cost.engine):
            return cost
    raise ConfigError(f"{where}: costs: no entry prices model {model} on engine {engine}: add one "
                      f"(model: '{model}', engine: {engine}, load_s, case_s) or a catch-all (model: '*', engine: '*')")


def nodes_of(plan: PlanFile) -> dict[str, dict[str, float]]:
    """Each node of the plan file (groups expanded: gpu-0, gpu-1, ...) with its resources in Ray's names."""
    out = {}
    for group in plan.nodes:
        for i in range(group.count):
            name = f"{group.name}-{i}" if group.count > 1 else group.name
            out[name] = {"CPU": group.cpus, "GPU": group.gpus, **group.custom,
                         **({"memory": group.memory_gb * GB} if group.memory_gb else {})}
    return out


def schedule(planned: list[Actor], nodes: dict[str, dict[str, float]], where: Path) -> list[Placement]:
    """Longest actor first, each on the node where it can start earliest (list scheduling)."""
    placed: dict[str, list[Placement]] = {name: [] for name in nodes}
    out = []
    for actor in sorted(planned, key=lambda a: -a.seconds):
        needed = actor.resources.amounts()
        if not any(fits(needed, capacity) for capacity in nodes.values()):
            raise ConfigError(f"{where}: nodes: none has {actor.resources}, which {actor.scenario}/{actor.name} asks "
                              "for: add such a node group, or change the engine's resources: block")
        best = min(((_earliest(needed, actor.seconds, placed[name], capacity), name)
                    for name, capacity in nodes.items() if fits(needed, capacity)))
        placement = Placement(actor, best[1], best[0])
        placed[best[1]].append(placement)
        out.append(placement)
    return sorted(out, key=lambda p: (p.node, p.start))


def _earliest(needed: dict[str, float], seconds: float, running: list[Placement],
              capacity: dict[str, float]) -> float:
    """The first time from which `needed` fits on a node beside what already runs there, for `seconds`."""
    for start in sorted({0.0, *(p.end for p in running)}):
        points = [start, *(p.start for p in running if start < p.start < start + seconds)]
        if all(fits(needed, _free(capacity, running, t)) for t in points):
            return start
    raise AssertionError("unreachable: an actor fits an empty node")


def _free(capacity: dict[str, float], running: list[Placement], at: float) -> dict[str, float]:
    free = dict(capacity)
    for p in running:
        if p.start <= at < p.end:
            for name, amount in p.actor.resources.amounts().items():
                free[name] = free.get(name, 0.0) - amount
    return free
