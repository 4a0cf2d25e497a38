"""What one engine worker needs from a machine: CPUs, GPUs, memory and Ray custom resources. The Ray executor asks
the cluster for it per actor, `parity run --plan` packs it onto nodes; the local executor only uses the CPUs to decide
how many engines run at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GB = 1024 ** 3


@dataclass(frozen=True)
class ActorResources:
    cpus: float = 1.0
    gpus: float = 0.0
    memory_gb: float | None = None
    custom: dict[str, float] = field(default_factory=dict)

    def ray_options(self) -> dict[str, Any]:
        """Keyword arguments of a Ray actor's .options()."""
        options: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.memory_gb:
            options["memory"] = int(self.memory_gb * GB)
        if self.custom:
            options["resources"] = dict(self.custom)
        return options

    def amounts(self) -> dict[str, float]:
        """In Ray's resource names (CPU, GPU, memory in bytes, custom ones as named)."""
        out = {"CPU": self.cpus, "GPU": self.gpus, **self.custom}
        if self.memory_gb:
            out["memory"] = self.memory_gb * GB
        return {k: v for k, v in out.items() if v}

    def __str__(self) -> str:
        parts = [f"{self.cpus:g} CPU"] + ([f"{self.gpus:g} GPU"] if self.gpus else [])
        parts += [f"{self.memory_gb:g} GB"] if self.memory_gb else []
        return ", ".join(parts + [f"{k}: {v:g}" for k, v in sorted(self.custom.items())])


def fits(needed: dict[str, float], available: dict[str, float]) -> bool:
    """Whether amounts (Ray resource names) fit into what a node has."""
    return all(available.get(name, 0.0) + 1e-9 >= amount for name, amount in needed.items())


def engine_resources(threads: int, needs_cuda: bool, override: Any | None) -> ActorResources:
    """An engine's resources: cpus = its threads, one GPU if it needs CUDA, each overridden by the scenario's
    `resources:` block (harness.scenario.spec.Resources) where given."""
    base = ActorResources(cpus=float(threads), gpus=1.0 if needs_cuda else 0.0)
    if override is None:
        return base
    return ActorResources(cpus=override.cpus if override.cpus is not None else base.cpus,
                          gpus=override.gpus if override.gpus is not None else base.gpus,
                          memory_gb=override.memory_gb, custom=dict(override.custom))
