"""Each engine of a scenario resolved once: the folder of its model in its dtype (a named model prepared on first use),
the adapter it applies, and its load key. A command resolves the engines it runs once it has chosen them
(LoadedScenario.with_resolved); planning (harness.plan) only assembles plans from these records."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from adapters.contract import EngineDescription
from harness.core.types import LoraSetup

ModelResolver = Callable[[str, str, str], Path]  # (model, dtype, origin) -> its folder: harness.models.resolve


class LoadKey(NamedTuple):
    """What an engine loads: plans with equal keys may share one loaded engine."""

    factory: str
    python: str | None
    threads: int
    folder: str  # the scenario's folder (on the worker's import path)
    model_path: str
    dtype: str
    options: str  # as sorted JSON
    lora: str = ""  # the adapter's folder, where the engine applies one
    weights_dtype: str = ""  # the weights rounded to this dtype before computing in `dtype` (ResolvedEngine)


@dataclass(frozen=True)
class ResolvedEngine:
    """One engine of a scenario as its worker loads it."""

    name: str
    model: str  # the scenario's value (a name or a path): what a Ray node resolves for itself
    model_folder: Path
    dtype: str
    lora: LoraSetup | None
    options: dict[str, Any]
    load_key: LoadKey
    weights_dtype: str | None = None  # the weights rounded to this dtype in memory before computing in `dtype`

    def with_options(self, options: dict[str, Any]) -> ResolvedEngine:
        """Another configuration of the engine (an invariance knob's options): the same model and adapter."""
        return replace(self, options=options, load_key=self.load_key._replace(options=_options_key(options)))

    def computing_in(self, dtype: str) -> ResolvedEngine:
        """The same model folder and weights, rounded to this engine's dtype in memory, computed in another dtype:
        the noise floor (its arithmetic in higher precision, its weights the run's own)."""
        return replace(self, dtype=dtype, weights_dtype=self.dtype,
                       load_key=self.load_key._replace(dtype=dtype, weights_dtype=self.dtype))


def resolve_engine(name: str, model: str, dtype: str, adapter: str | None, description: EngineDescription,
                   python: str | None, threads: int, options: dict[str, Any], scenario_file: Path,
                   resolve: ModelResolver) -> ResolvedEngine:
    """Engine `name` of the scenario in `scenario_file`, as the scenario configures it (adapter: its `lora:` value)."""
    folder = resolve(model, dtype, str(scenario_file))
    lora = lora_setup(adapter, description) if adapter is not None else None
    key = LoadKey(description.factory, python, threads, str(scenario_file.parent.resolve()), str(folder), dtype,
                  _options_key(options), lora.path if lora else "")
    return ResolvedEngine(name, model, folder, dtype, lora, options, key)


def lora_setup(value: str, description: EngineDescription) -> LoraSetup:
    """The adapter an engine applies at serving time (the scenario checked it can), as its worker is given it."""
    from harness.models import catalog, lora

    folder = catalog.adapter_folder(value)
    rank = lora.read(folder).rank
    rules = description.lora
    allowed = [r for r in (rules.ranks if rules and rules.ranks else ()) if r >= rank]
    return LoraSetup(path=str(folder), name=lora.served_name(value), rank=rank, max_rank=min(allowed, default=rank))


def _options_key(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)
