"""Preflight of a scenario's LoRA adapters, before any engine loads: the adapter is named or a readable PEFT folder,
the engine applies adapters at all, its rank is within the engine's limit, its target modules are ones the engine
can adapt and a lora_B.bias is there only where the engine applies one (each refusal quoting the engine's own rule,
adapters.contract.LoraRules); an adapter made for another base model (its modules' shapes) is refused where the base
model's folder can be read without preparing it."""

from __future__ import annotations

import importlib.util

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
    fit = catalog.adapter_fit_problem(model, value)
    if fit or value in lora.ADAPTERS:
        return fit  # a named adapter is built on first use, for its base: rank 8 on every projection
    info = lora.read(catalog.adapter_folder(value))
    if rules.ranks is not None and info.rank > max(rules.ranks):
        return (f"{value} has rank {info.rank}, above what {description.name} takes ({rules.source}: ranks "
                f"{', '.join(map(str, rules.ranks))})")
    unsupported = sorted(set(info.targets) - set(rules.modules or info.targets))
    if unsupported:
        return (f"{value} adapts {', '.join(unsupported)}, which {description.name} cannot adapt ({rules.source}: "
                f"{', '.join(rules.modules or ())})")
    if info.biased and rules.bias is False:
        return (f"{value} has a lora_B.bias ({', '.join(info.biased)}; PEFT's lora_bias), which {description.name} "
                f"does not apply ({rules.source}): give the engine `lora: none` or an adapter without it")
    return None
