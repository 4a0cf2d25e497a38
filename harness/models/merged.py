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


def merge_problem(base: dict[str, tuple[int, ...]], adapter_folder: Path, label: str, model: str) -> str | None:
    """Why the adapter cannot be merged into a base with these weights (tensor name -> shape) although an engine can
    apply it at serving time: a lora_B.bias on a module the base has no bias for (the merged model would need a
    tensor its architecture does not load); else None."""
    from harness.models import lora
    from harness.models.lora_tensors import module_keys

    modules, _ = module_keys(lora.tensor_names(adapter_folder / lora.WEIGHTS))
    unbiased = sorted(m for m, keys in modules.items() if keys.bias and f"{m}.bias" not in base)
    if unbiased:
        return (f"{label} has a lora_B.bias for {unbiased[0]}, which has no bias in {model}: a merged model cannot "
                "hold it; apply the adapter at serving time (`lora:`) instead")
    return None


def merge(base_folder: Path, adapter_folder: Path, out: Path) -> None:
    """Write the merged weights in float32 and bfloat16 beside the base's other files (config, tokenizer), in the
    base's own files: a sharded base stays sharded, shard by shard (one shard in memory at a time). A base that ties
    lm_head to its input embedding is untied where the adapter changes either (PEFT adapts each on its own): the
    merged model saves its own lm_head.weight, beside the embedding, and says tie_word_embeddings false. A module
    whose own weight the adapter saves (PEFT's save_embedding_layers) starts from that weight, as PEFT loads it."""
    import torch
    from safetensors.torch import load_file, save_file

    from harness.core.errors import ConfigError
    from harness.models import lora, weight_files

    files = weight_files.files(base_folder)
    if not files:
        raise ConfigError(weight_files.missing_problem(base_folder))
    info, shapes = lora.read(adapter_folder), weight_files.shapes(base_folder)
    problem = lora.shape_problem(str(adapter_folder), info, shapes, str(base_folder)) or \
        merge_problem(shapes, adapter_folder, str(adapter_folder), str(base_folder))
    if problem:
        raise ConfigError(problem)
    updates = lora.updates(adapter_folder)
    tied = lora.tied_embedding(shapes)
    untie = tied is not None and (lora.HEAD in updates or tied.removesuffix(".weight") in updates)
    variants = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    sizes = dict.fromkeys(variants, 0)
    weight_map = weight_files.weight_map(base_folder) if (base_folder / weight_files.INDEX).exists() else {}
    for dtype in variants:
        (out / dtype).mkdir(parents=True)
        for item in base_folder.iterdir():
            if item.is_file() and item not in files and item.name not in (weight_files.INDEX, "source.json"):
                shutil.copy2(item, out / dtype / item.name)
        _set_config(out / dtype / "config.json", dtype, untie)
    for file in files:
        weights = load_file(str(file))
        if untie and tied in weights:  # lm_head starts as the embedding it was tied to, in the embedding's file
            weights[f"{lora.HEAD}.weight"] = weights[tied].clone()
            weight_map = {**weight_map, f"{lora.HEAD}.weight": file.name} if weight_map else {}
        for module, update in updates.items():
            key = lora.base_weight(module, shapes) if not untie or module != lora.HEAD else f"{module}.weight"
            if key in weights:  # on the module's own weight where the adapter saves it, as PEFT loads it
                weight = weights[key] if update.base is None else torch.from_numpy(update.base)
                weights[key] = _added(weight, info.scale, update)
            if update.bias is not None and f"{module}.bias" in weights:
                bias = torch.from_numpy(update.bias).double() * info.scale
                weights[f"{module}.bias"] = (weights[f"{module}.bias"].double() + bias).to(torch.float32)
        for dtype, torch_dtype in variants.items():
            stored = {k: v.to(torch_dtype).contiguous() for k, v in weights.items()}
            save_file(stored, str(out / dtype / file.name), metadata={"format": "pt"})
            sizes[dtype] += sum(t.numel() * t.element_size() for t in stored.values())
    if weight_map:
        for dtype, size in sizes.items():
            index = {"metadata": {"total_size": size}, "weight_map": weight_map}
            (out / dtype / weight_files.INDEX).write_text(json.dumps(index, indent=2))


def _added(weight, scale: float, update):
    """weight + scale * B A in float64, stored in float32 (an embedding's update transposed to [vocab, hidden])."""
    import torch

    delta = torch.from_numpy(update.b).double() @ torch.from_numpy(update.a).double()
    return (weight.double() + scale * (delta.T if update.embedding else delta)).to(torch.float32)


def _set_config(config_path: Path, dtype: str, untie: bool) -> None:
    """The merged folder's config.json: its dtype, and untied embeddings where lm_head got weights of its own."""
    config = json.loads(config_path.read_text())
    config["torch_dtype" if "torch_dtype" in config else "dtype"] = dtype
    if untie:
        config["tie_word_embeddings"] = False
    config_path.write_text(json.dumps(config, indent=2))
