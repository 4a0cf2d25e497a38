"""A model folder's weights as HF saves them: one model.safetensors, or shards named by model.safetensors.index.json
(its weight_map: tensor name -> shard file), as most published models ship. Every reader of a folder's weights (the
adapter shape check, named adapters, merged models, the GGUF writer) goes through here, so a sharded folder is read
like a single file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.core.errors import ConfigError

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


def files(folder: Path) -> list[Path]:
    """The folder's weight files: model.safetensors, else the shards its index names, in the index's order; [] when
    it has neither (weights in another format, or none). A broken index is a one-line ConfigError."""
    if (folder / SINGLE).exists():
        return [folder / SINGLE]
    if not (folder / INDEX).exists():
        return []
    return list(dict.fromkeys(folder / name for name in weight_map(folder).values()))


def weight_map(folder: Path) -> dict[str, str]:
    """model.safetensors.index.json's tensor name -> shard file name, each shard checked to be there."""
    index = folder / INDEX
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{index} is not readable JSON ({exc}): save the model again with save_pretrained") from None
    mapping = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(mapping, dict) or not mapping or not all(isinstance(v, str) for v in mapping.values()):
        raise ConfigError(f"{index}: weight_map must map each tensor name to its shard file; save the model again "
                          "with save_pretrained")
    missing = sorted({name for name in mapping.values() if not (folder / name).is_file()})
    if missing:
        raise ConfigError(f"{index}: weight_map names {', '.join(missing)}, which {folder} does not have: copy "
                          "every shard of the model")
    return mapping


def shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over every weight file of the folder, from the files' headers alone."""
    from safetensors import safe_open

    found: dict[str, tuple[int, ...]] = {}
    for file in files(folder):
        with safe_open(str(file), "np") as handle:
            names = list(handle.keys())  # a file handle, not a mapping: keys() is how it lists its tensors
            found.update({name: tuple(handle.get_slice(name).get_shape()) for name in names})
    return found


def load(folder: Path) -> dict[str, Any]:
    """Every tensor of the folder (all shards), as numpy arrays."""
    from safetensors.numpy import load_file

    tensors: dict[str, Any] = {}
    for file in files(folder):
        tensors.update(load_file(str(file)))
    return tensors


def missing_problem(folder: Path) -> str:
    """The sentence for a folder without safetensors weights, with the fix."""
    return (f"{folder} has no {SINGLE} or {INDEX}: save the model with save_pretrained (safetensors) to merge an "
            "adapter into it or write it as GGUF")
