"""Preflight of a scenario's LoRA adapters, before any engine loads: the adapter is named or a readable PEFT folder,
the engine applies adapters at all, its rank is within the engine's limit and its target modules are ones the engine
can adapt (each refusal quoting the engine's own rule, adapters.contract.LoraRules); an adapter made for another
base model (its modules' shapes) is refused where the base model's folder can be read without preparing it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from adapters.contract import EngineDescription


def lora_problem(value: str | None, model: str, name: str, description: EngineDescription) -> str | None:
    """Why engine `name` cannot apply adapter `value` to `model` (one sentence with the fix), or None."""
    from harness.models import catalog, lora

    if value is None:
        return None
    problem = lora.problem(value)
    if problem:
        return problem
    rules = description.lora
    if rules is None:
        return (f"engine {name} ({description.name}) cannot apply a LoRA adapter: give it `lora: none` and a merged "
                f"model (`model: {model}+{value}`), or leave it out")
    if rules.package and importlib.util.find_spec(rules.package) is None:
        return (f"engine {name} ({description.name}) applies LoRA adapters with {rules.package}, which is not "
                "installed: pip install 'llm-parity[lora]'")
    if value in lora.ADAPTERS and lora.ADAPTERS[value].base != model:
        return f"{value} is an adapter of {lora.ADAPTERS[value].base}, not of {model}"
    if value in lora.ADAPTERS:
        return None  # built on first use, for its base: rank 8 on every projection
    info = lora.read(catalog.adapter_folder(value))
    if rules.ranks is not None and info.rank > max(rules.ranks):
        return (f"{value} has rank {info.rank}, above what {description.name} takes ({rules.source}: ranks "
                f"{', '.join(map(str, rules.ranks))})")
    unsupported = sorted(set(info.targets) - set(rules.modules or info.targets))
    if unsupported:
        return (f"{value} adapts {', '.join(unsupported)}, which {description.name} cannot adapt ({rules.source}: "
                f"{', '.join(rules.modules or ())})")
    return shape_problem(value, info, model)


def shape_problem(value: str, info, model: str) -> str | None:
    """The adapter's A and B shapes against the base weights they adapt, where the base's folder is already on disk
    (a path, or a named model already prepared); None when they fit or cannot be read yet."""
    from safetensors import safe_open

    from harness.core.user_paths import expanded
    from harness.models import catalog, lora

    folder = catalog.MODELS[model].folder("float32") if model in catalog.MODELS else expanded(Path(model))
    weights = folder / "model.safetensors"
    if not weights.exists():
        return None
    said = f" (its adapter_config.json names {info.base} as its base)" if info.base else ""
    keys = set(lora.tensor_names(weights))
    with safe_open(str(weights), "np") as base:
        for module, (a, b) in lora.pairs(info.path).items():
            key = f"{module}.weight"
            if key not in keys:
                return f"{value} adapts {module}, which {model} does not have: an adapter of another model{said}"
            out_features, in_features = base.get_slice(key).get_shape()
            if a.shape[1] != in_features or b.shape[0] != out_features:
                return (f"{value} adapts {module} as a [{b.shape[0]}, {a.shape[1]}] weight, {model} has it "
                        f"[{out_features}, {in_features}]: an adapter of another model{said}")
    return None
