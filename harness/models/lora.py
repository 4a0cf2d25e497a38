"""LoRA adapters: the named tiny adapters the project builds (seeded, like the tiny models), how an adapter folder is
read, and why one cannot be used. An adapter is a PEFT folder: adapter_config.json (rank `r`, `lora_alpha`,
`target_modules`, `use_rslora`, `base_model_name_or_path`) and adapter_model.safetensors with, per adapted module,
its A and B (and B's bias, or an embedding's pair: harness.models.lora_tensors); the module's output becomes
base(x) + scale * B(A(x)), scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).

The named adapters adapt every projection of every layer (q, k, v, o, gate, up, down) with rank 8, alpha 16, and
B drawn away from zero (PEFT initialises it to zero, which would make an adapter that changes nothing): each
module's update B A is scaled to a tenth of its base weight's norm, so an engine that drops one module shows.
lora-tiny-llama-rslora is one saved with use_rslora (scale alpha / sqrt(r)), other weights (its own seed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.models import lora_tensors
from harness.models.lora_tensors import PARTS, ModuleUpdate, module_keys

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HEAD = "lm_head"  # the output projection, which a base may tie to its input embedding
UPDATE_NORM = 0.1  # ||scale * B A|| / ||W|| of every adapted module of a named adapter
# adapter_config.json settings beyond plain LoRA, which the merge and the GGUF writer do not reproduce
UNSUPPORTED = ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "fan_in_fan_out", "bias")


@dataclass(frozen=True)
class NamedAdapter:
    name: str
    base: str  # the named model it adapts
    rank: int = 8
    alpha: int = 16
    seed: int = 0
    rslora: bool = False  # saved with use_rslora: scale alpha / sqrt(r)

    @property
    def scale(self) -> float:
        return self.alpha / (self.rank ** 0.5 if self.rslora else self.rank)

    @property
    def description(self) -> str:
        return (f"random rank-{self.rank} {'rsLoRA' if self.rslora else 'LoRA'} adapter (alpha {self.alpha}) on every "
                f"projection of {self.base}, seeded")


ADAPTERS = {a.name: a for a in (NamedAdapter("lora-smollm2", "smollm2-135m"),
                                NamedAdapter("lora-tiny-llama", "tiny-llama"),
                                NamedAdapter("lora-tiny-llama-rslora", "tiny-llama", seed=1, rslora=True))}


@dataclass(frozen=True)
class AdapterInfo:
    """What adapter_config.json and the weights' names say about an adapter."""

    path: Path
    rank: int
    alpha: float
    rslora: bool
    targets: tuple[str, ...]  # module names adapted (q_proj, ..., embed_tokens, lm_head), as the weights have them
    base: str  # base_model_name_or_path ('' if not given)
    biased: tuple[str, ...] = ()  # module names whose lora_B has a bias (PEFT's lora_bias)

    @property
    def scale(self) -> float:
        return self.alpha / (self.rank ** 0.5 if self.rslora else self.rank)


def folder_problem(path: Path) -> str | None:
    """Why a folder is not a usable LoRA adapter (a sentence naming the file and the fix), or None."""
    if not path.is_dir():
        return f"{path} is not a folder: give a PEFT adapter folder (adapter_config.json, {WEIGHTS})"
    for name in (CONFIG, WEIGHTS):
        if not (path / name).exists():
            return f"{path} has no {name}: save the adapter with PEFT's save_pretrained (safetensors)"
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{path / CONFIG} is not readable JSON ({exc})"
    if not isinstance(config, dict):
        return f"{path / CONFIG} holds {json.dumps(config)[:40]}, not a JSON object: save the adapter with PEFT"
    if config.get("peft_type", "LORA") != "LORA":
        return f"{path / CONFIG}: peft_type is {config.get('peft_type')!r}; only LORA adapters are compared"
    value_problem = _config_value_problem(config)
    if value_problem:
        return f"{path / CONFIG}: {value_problem}"
    unsupported = [key for key in UNSUPPORTED if config.get(key) not in (None, False, {}, [], "none")]
    if unsupported:
        return (f"{path / CONFIG}: {', '.join(unsupported)} set; only LoRA with one rank and alpha and nothing "
                "trained beyond its A and B (and B's bias) is compared")
    try:
        shapes = tensor_shapes(path / WEIGHTS)
    except Exception as exc:  # safetensors raises its own error types for a file that is not safetensors
        return f"{path / WEIGHTS} is not a readable safetensors file ({type(exc).__name__}: {exc})"
    modules, stray = module_keys(list(shapes))
    if stray:
        return (f"{path / WEIGHTS}: {stray[0]} is not a LoRA tensor the harness applies ({', '.join(PARTS)}, each "
                "with its pair): an adapter is applied whole or not at all")
    if not modules:
        return f"{path / WEIGHTS} holds no LoRA tensors: save the adapter with PEFT's save_pretrained"
    weights_problem = _weights_problem(shapes, config["r"])
    return weights_problem and f"{path / WEIGHTS}: {weights_problem}"


def _config_value_problem(config: dict[str, Any]) -> str | None:
    """The rank, alpha and rsLoRA switch as the merge and the engines read them, or the first that is not."""
    rank, alpha, rslora = config.get("r"), config.get("lora_alpha"), config.get("use_rslora")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        return f"r (the rank) is {rank!r}; it must be a positive integer"
    if "lora_alpha" in config and (not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha > 0
                                   or alpha == float("inf")):
        return f"lora_alpha is {alpha!r}; it must be a positive number (the scale is lora_alpha / r)"
    if rslora is not None and not isinstance(rslora, bool):
        return f"use_rslora is {rslora!r}; it must be true or false"
    return None


def _weights_problem(shapes: dict[str, tuple[list[int], str]], rank: int) -> str | None:
    """Each linear lora_A weight [r, in] and lora_B weight [out, r] of the config's rank, in a floating-point type."""
    ab = {name: shape for name, shape in shapes.items() if name.endswith((".lora_A.weight", ".lora_B.weight"))}
    for name, (shape, dtype) in ab.items():
        if len(shape) != 2 or (shape[0] if ".lora_A." in name else shape[1]) != rank:
            want = "[r, in]" if ".lora_A." in name else "[out, r]"
            return f"{name} has shape {shape}; a LoRA weight is {want} with r = {rank} (adapter_config.json)"
        if not dtype.startswith(("F", "BF")):
            return f"{name} holds {dtype} values; LoRA weights are floating point"
    return None


def shape_problem(label: str, info: AdapterInfo, base: dict[str, tuple[int, ...]], model: str) -> str | None:
    """The adapter's A and B shapes against the base weights they adapt (base: tensor name -> shape over the base
    model's weight files, harness.models.weight_files.shapes), or None when they fit."""
    from safetensors import safe_open

    said = f" (its adapter_config.json names {info.base} as its base)" if info.base else ""
    with safe_open(str(info.path / WEIGHTS), "np") as adapter:
        modules, _ = module_keys(list(adapter.keys()))  # a file handle, not a mapping: shapes from the headers alone
        for module, keys in modules.items():
            key = base_weight(module, base)
            if key is None:
                return f"{label} adapts {module}, which {model} does not have: an adapter of another model{said}"
            a_shape, b_shape = adapter.get_slice(keys.a).get_shape(), adapter.get_slice(keys.b).get_shape()
            rows, cols = b_shape[0], a_shape[1]
            shapes = [(cols, rows) if keys.embedding else (rows, cols)]
            shapes += [tuple(adapter.get_slice(keys.base).get_shape())] if keys.base else []  # its saved own weight
            wrong = next((shape for shape in shapes if shape != tuple(base[key])), None)
            if wrong is not None:
                return (f"{label} adapts {module} as a [{', '.join(map(str, wrong))}] weight, {model} has it "
                        f"[{', '.join(map(str, base[key]))}]: an adapter of another model{said}")
    return None


def base_weight(module: str, base: dict[str, tuple[int, ...]]) -> str | None:
    """The base weight an adapted module's update adds to (among `base`'s tensor names), or None: the module's own,
    or for lm_head on a base that ties it to its input embedding (no lm_head.weight saved) that embedding's."""
    if f"{module}.weight" in base:
        return f"{module}.weight"
    return tied_embedding(base) if module == HEAD else None


def tied_embedding(base: dict[str, tuple[int, ...]]) -> str | None:
    """The input embedding a base model's lm_head is tied to: its one *embed_tokens.weight where it saves no
    lm_head.weight; None for an untied base."""
    if f"{HEAD}.weight" in base:
        return None
    found = [name for name in base if name.endswith("embed_tokens.weight")]
    return found[0] if len(found) == 1 else None


def read(path: Path) -> AdapterInfo:
    """An adapter folder folder_problem() accepted."""
    config = json.loads((path / CONFIG).read_text())
    modules, _ = module_keys(tensor_names(path / WEIGHTS))
    targets = {module.rsplit(".", 1)[-1] for module in modules}
    biased = {module.rsplit(".", 1)[-1] for module, keys in modules.items() if keys.bias}
    return AdapterInfo(path, int(config["r"]), float(config.get("lora_alpha", config["r"])),
                       bool(config.get("use_rslora", False)), tuple(sorted(targets)),
                       str(config.get("base_model_name_or_path") or ""), tuple(sorted(biased)))


def tensor_shapes(file: Path) -> dict[str, tuple[list[int], str]]:
    """Each tensor of a safetensors file: its shape and dtype (F32, BF16, I8, ...), from the header only."""
    from safetensors import safe_open

    with safe_open(str(file), "np") as handle:
        slices = {name: handle.get_slice(name) for name in handle.keys()}  # noqa: SIM118 (a handle, not a mapping)
        return {name: (part.get_shape(), part.get_dtype()) for name, part in slices.items()}


def tensor_names(file: Path) -> list[str]:
    """The tensor names of a safetensors file (its header only)."""
    from safetensors import safe_open

    with safe_open(str(file), "np") as handle:
        return list(handle.keys())  # a file handle, not a mapping: keys() is how it lists its tensors


def updates(path: Path) -> dict[str, ModuleUpdate]:
    """The adapter's tensors per base module name (model.layers.0.self_attn.q_proj), numpy."""
    return lora_tensors.updates(path, WEIGHTS)


def build(adapter: NamedAdapter, base_folder: Path, out: Path) -> None:
    """Write a named adapter for the base model in base_folder (its float32 folder) into out."""
    import numpy as np
    from safetensors.numpy import save_file

    from harness.models import weight_files

    rng = np.random.default_rng(adapter.seed)
    scale = adapter.scale
    tensors = {}
    weights = weight_files.load(base_folder)
    for key in sorted(k for k in weights if k.endswith(".weight") and k.rsplit(".", 2)[-2] in PROJECTIONS):
        weight = weights[key].astype(np.float64)
        out_features, in_features = weight.shape
        a = rng.standard_normal((adapter.rank, in_features)) / np.sqrt(in_features)
        b = rng.standard_normal((out_features, adapter.rank))
        update = scale * b @ a
        b *= UPDATE_NORM * np.linalg.norm(weight) / np.linalg.norm(update)
        module = key.removesuffix(".weight")
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.astype(np.float32)
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": adapter.base,
              "r": adapter.rank, "lora_alpha": adapter.alpha, "target_modules": list(PROJECTIONS),
              "lora_dropout": 0.0, "bias": "none", "use_rslora": adapter.rslora, "fan_in_fan_out": False,
              "modules_to_save": None, "inference_mode": True}
    (out / CONFIG).write_text(json.dumps(config, indent=2))


def problem(value: str) -> str | None:
    """Why a scenario's `lora:` is neither a named adapter nor a usable PEFT folder (with the fix), or None."""
    if value in ADAPTERS:
        return None
    from harness.core.user_paths import expanded

    why = folder_problem(expanded(Path(value)))
    return why and f"{why}; or use a named adapter ({', '.join(ADAPTERS)})"


def fingerprint(folder: Path) -> str:
    """What a cache built from an adapter folder is keyed by: its path and its weights file's size and time, so an
    adapter retrained in place is not served from a stale merge or GGUF."""
    stat = (folder / WEIGHTS).stat()
    return f"{folder.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def served_name(value: str) -> str:
    """The name requests give the adapter (a server's --lora-modules name): a named adapter's, else its folder's."""
    return value if value in ADAPTERS else Path(value).name or "adapter"
