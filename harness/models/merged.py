"""A base model with a LoRA adapter merged into its weights, named `<model>+<adapter>` (each part a named model or
adapter, or a path): built once into the model cache (float32 and bfloat16 folders), each adapted weight W replaced by
W + scale * B A in float64 before it is stored. A merged model is a model, not an option: an engine runs it through
its own `model:` while others apply the adapter at serving time (vllm#5148: the adapter differs from the merged
model at temperature 0)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SEPARATOR = "+"


def split(model: str) -> tuple[str, str] | None:
    """(base, adapter) of a merged model's name; None for any other model."""
    if SEPARATOR not in model or Path(model).exists():
        return None
    base, _, adapter = model.rpartition(SEPARATOR)
    return (base, adapter) if base and adapter else None


def merge(base_folder: Path, adapter_folder: Path, out: Path) -> None:
    """Write the merged weights in float32 and bfloat16 beside the base's other files (config, tokenizer), in the
    base's own files: a sharded base stays sharded, shard by shard (one shard in memory at a time)."""
    import torch
    from safetensors.torch import load_file, save_file

    from harness.core.errors import ConfigError
    from harness.models import lora, weight_files

    files = weight_files.files(base_folder)
    if not files:
        raise ConfigError(weight_files.missing_problem(base_folder))
    info = lora.read(adapter_folder)
    pairs = {f"{module}.weight": ab for module, ab in lora.pairs(adapter_folder).items()}
    unknown = sorted(set(pairs) - set(weight_files.shapes(base_folder)))
    if unknown:
        raise ValueError(f"{adapter_folder}: adapts {unknown[0].removesuffix('.weight')}, which {base_folder} does "
                         "not have")
    variants = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    sizes = dict.fromkeys(variants, 0)
    for dtype in variants:
        (out / dtype).mkdir(parents=True)
        for item in base_folder.iterdir():
            if item.is_file() and item not in files and item.name not in (weight_files.INDEX, "source.json"):
                shutil.copy2(item, out / dtype / item.name)
        _set_dtype(out / dtype / "config.json", dtype)
    for file in files:
        weights = load_file(str(file))
        for key in pairs.keys() & weights.keys():
            a, b = (torch.from_numpy(t).double() for t in pairs[key])
            weights[key] = (weights[key].double() + info.scale * b @ a).to(torch.float32)
        for dtype, torch_dtype in variants.items():
            stored = {k: v.to(torch_dtype).contiguous() for k, v in weights.items()}
            save_file(stored, str(out / dtype / file.name), metadata={"format": "pt"})
            sizes[dtype] += sum(t.numel() * t.element_size() for t in stored.values())
    if (base_folder / weight_files.INDEX).exists():
        for dtype, size in sizes.items():
            index = {"metadata": {"total_size": size}, "weight_map": weight_files.weight_map(base_folder)}
            (out / dtype / weight_files.INDEX).write_text(json.dumps(index, indent=2))


def _set_dtype(config_path: Path, dtype: str) -> None:
    config = json.loads(config_path.read_text())
    config["torch_dtype" if "torch_dtype" in config else "dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=2))
