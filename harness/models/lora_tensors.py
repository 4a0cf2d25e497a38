"""The tensors of a PEFT LoRA adapter's safetensors file, per adapted module, and the update each makes to its base
model. PEFT names them `base_model.model.<module>.<part>`:

  lora_A.weight [r, in], lora_B.weight [out, r]       a linear module: W x + scale * B A x
  lora_B.bias [out] (PEFT's lora_bias)                 adds scale * bias to that module's output
  lora_embedding_A [r, vocab], lora_embedding_B [hidden, r]   an embedding: E gains scale * (B A)^T [vocab, hidden]
  base_layer.weight                                    the module's own weight, which PEFT saves for an adapted
                                                       embedding or lm_head (save_embedding_layers) and loads in place
                                                       of the base model's

Every tensor of the file is one of these, or the adapter is refused (DoRA's magnitude vectors, modules_to_save copies
or base weights would otherwise be dropped without a word): an adapter is applied whole or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "base_model.model."
LINEAR_A, LINEAR_B, BIAS = "lora_A.weight", "lora_B.weight", "lora_B.bias"
EMBEDDING_A, EMBEDDING_B = "lora_embedding_A", "lora_embedding_B"
BASE = "base_layer.weight"
PARTS = (LINEAR_A, LINEAR_B, BIAS, EMBEDDING_A, EMBEDDING_B, BASE)


@dataclass(frozen=True)
class ModuleKeys:
    """The names of one adapted module's tensors in the adapter's file."""

    a: str
    b: str
    bias: str | None  # lora_B.bias, if the adapter has one for this module
    embedding: bool  # lora_embedding_A/B: the module is an embedding
    base: str | None = None  # base_layer.weight, the module's own weight saved with the adapter


def module_keys(names: list[str]) -> tuple[dict[str, ModuleKeys], list[str]]:
    """(base module name (model.layers.0.self_attn.q_proj) -> its tensors' names, the names that are no LoRA tensor
    this module reads or lack their other half)."""
    found: dict[str, dict[str, str]] = {}
    stray = []
    for name in names:
        part = next((p for p in PARTS if name.endswith(f".{p}")), None)
        if part is None:
            stray.append(name)
            continue
        found.setdefault(name.removesuffix(f".{part}").removeprefix(PREFIX), {})[part] = name
    modules = {}
    for module, parts in found.items():
        linear, embedding = {LINEAR_A, LINEAR_B} <= parts.keys(), {EMBEDDING_A, EMBEDDING_B} <= parts.keys()
        if linear == embedding or len(parts) > 2 + (BIAS in parts) + (BASE in parts) or (embedding and BIAS in parts):
            stray += sorted(parts.values())  # half a pair, both kinds, or a bias without its linear pair
            continue
        a, b = (LINEAR_A, LINEAR_B) if linear else (EMBEDDING_A, EMBEDDING_B)
        modules[module] = ModuleKeys(parts[a], parts[b], parts.get(BIAS), embedding, parts.get(BASE))
    return modules, stray


@dataclass(frozen=True)
class ModuleUpdate:
    """One adapted module's tensors (numpy): A and B as PEFT stores them, B's bias and the module's own weight if the
    adapter saves them."""

    a: Any
    b: Any
    bias: Any | None
    embedding: bool
    base: Any | None = None


def updates(folder: Path, file: str) -> dict[str, ModuleUpdate]:
    """Every adapted module's tensors in the adapter folder's safetensors file (one module_keys() accepted whole)."""
    from safetensors.numpy import load_file

    tensors = load_file(str(folder / file))
    modules, _ = module_keys(list(tensors))
    return {module: ModuleUpdate(tensors[keys.a], tensors[keys.b], tensors[keys.bias] if keys.bias else None,
                                 keys.embedding, tensors[keys.base] if keys.base else None)
            for module, keys in modules.items()}
