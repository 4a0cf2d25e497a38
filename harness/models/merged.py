"""A base model with a LoRA adapter merged into its weights, named `<model>+<adapter>` (each part a named model or
adapter, or a path): built once into the model cache (float32 and bfloat16 folders), each adapted weight W replaced by
W + scale * B A in float64 before it is stored. A merged model is a model, not an option: an engine runs it through
its own `model:` while others apply the adapter at serving time (vllm#5148: the adapter differs from the merged
model at temperature 0)."""

from __future__ import annotations

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
    """Write the merged weights in float32 and bfloat16 beside the base's other files (config, tokenizer)."""
    import torch
    from safetensors.torch import load_file, save_file

    from harness.models import lora

    info = lora.read(adapter_folder)
    weights = load_file(str(base_folder / "model.safetensors"))
    for module, (a, b) in lora.pairs(adapter_folder).items():
        key = f"{module}.weight"
        if key not in weights:
            raise ValueError(f"{adapter_folder}: adapts {module}, which {base_folder} does not have")
        update = info.scale * torch.from_numpy(b).double() @ torch.from_numpy(a).double()
        weights[key] = (weights[key].double() + update).to(torch.float32)
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        folder = out / dtype
        folder.mkdir(parents=True)
        for item in base_folder.iterdir():
            if item.is_file() and item.name not in ("model.safetensors", "source.json"):
                shutil.copy2(item, folder / item.name)
        save_file({k: v.to(torch_dtype).contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        if dtype == "bfloat16":
            _set_dtype(folder / "config.json", "bfloat16")


def _set_dtype(config_path: Path, dtype: str) -> None:
    import json

    config = json.loads(config_path.read_text())
    config["torch_dtype" if "torch_dtype" in config else "dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=2))
