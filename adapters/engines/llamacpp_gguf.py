"""GGUF files for the llama.cpp engines, built once from the weights the HF engine loads.

A llama.cpp engine reads GGUF, not the HF folder. So that HF vs llama.cpp compares numerics only, and llama.cpp F32
vs a quantised variant compares quantisation only, every variant comes from the model folder's own safetensors:

  f32, f16   written here with the `gguf` package, as llama.cpp's converter writes the architecture (WRITERS: one
             description per HF model_type: the GGUF architecture, its hyperparameters from config.json, and which
             tensors change how: a Llama's q and k projections permuted into llama.cpp's rope layout, Gemma's norm
             weights stored as 1 + w); a mixture of experts' weights stacked per block and projection
             [n_expert, rows, cols] (stacked_experts); tensors renamed by gguf's own name map; the tokenizer from the
             GGUF a named model ships (checked to be the folder's tokenizer); f16 keeps 1-D tensors (norms) and
             routers in f32, as llama.cpp's converter does; a scaled rope as llama.cpp's converter writes it (linear
             and yarn as rope.scaling keys, llama3 as a rope_freqs tensor, LongRoPE as rope_factors_long/_short
             tensors with its attention factor), a rope llama.cpp would compute differently refused in one line
  q8_0, q4_k_m  llama.cpp's own quantiser (llama_model_quantize) on the f32 file
  bundled    the GGUF file the named model was converted from (its `source_gguf`: SmolLM2's Q4_1, Gemma 3's Q4_K_M),
             as shipped

Files live in the model cache (<cache>/models/<name>/gguf/ for named models, <cache>/gguf/<folder>-<hash>/ for any
other folder), are written under a temporary name and renamed, and are built under a lock, so engines that start
side by side build each file once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

import numpy as np

from harness.models import gguf_header
from harness.models.families import rope_parameters

if TYPE_CHECKING:
    from harness.models.catalog import NamedModel

FULL_PRECISION = {"f32": 0, "f16": 1}  # variant -> GGUF general.file_type (llama_ftype ALL_F32, MOSTLY_F16)
QUANTISED = {"q8_0": 7, "q4_k_m": 15}  # variant -> llama_ftype for llama_model_quantize
BUNDLED = "bundled"
VARIANTS = (*FULL_PRECISION, *QUANTISED, BUNDLED)


def rope_layout(rows: np.ndarray, n_head: int) -> np.ndarray:
    """HF -> llama.cpp for a q or k projection weight [n_head*d, in]: within each head, rows (j, j + d/2) become
    (2j, 2j + 1) (llama.cpp's rope rotates adjacent pairs, HF's rotate_half the two halves of a head)."""
    head_dim = rows.shape[0] // n_head
    return rows.reshape(n_head, 2, head_dim // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


Hparams = dict[str, int | float | str | list[bool]]  # GGUFWriter setter name (add_<key>) -> value
Transform = Callable[[np.ndarray, Hparams], np.ndarray]

PLAIN_ROPES = frozenset({"default", "linear", "yarn"})  # rope scalings every llama.cpp graph applies (ggml_rope_ext)
# the Llama graph also multiplies each frequency's wavelength by a per-layer factor tensor: llama3's rope_freqs, and
# LongRoPE's rope_factors_long / rope_factors_short (loaded when the file's rope.scaling.type is longrope)
LLAMA_ROPES = PLAIN_ROPES | {"llama3", "longrope"}


@dataclass(frozen=True)
class Architecture:
    """How llama.cpp's converter writes one HF model_type: the GGUF architecture (a gguf.MODEL_ARCH member, which
    also picks gguf's tensor-name map), the hyperparameters it writes (refusing a config whose math llama.cpp's graph
    for that architecture would not reproduce), the tensors it changes: (GGUF name suffix, transform), and the HF
    rope types whose scaling llama.cpp's graph for that architecture reproduces (others are refused)."""

    gguf_arch: str
    hparams: Callable[[dict], Hparams]
    transforms: tuple[tuple[str, Transform], ...] = ()
    ropes: frozenset[str] = PLAIN_ROPES


def original_context(config: dict, rope: dict) -> int:
    """The context the scaled rope was trained for: original_max_position_embeddings in the rope's parameters
    (transformers 5) or at the top of config.json (older files)."""
    value = rope.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
    if value is None:
        _refuse(config, f"{rope['rope_type']} rope scaling without original_max_position_embeddings")
    return int(value)


def rope_factor(config: dict, rope: dict) -> float:
    """The scaling factor as HF reads it: `factor`, else max_position_embeddings over the original context (how
    transformers' yarn and longrope fill a missing factor)."""
    if rope.get("factor") is not None:
        return float(rope["factor"])
    return config.get("max_position_embeddings", 2048) / original_context(config, rope)


def rope_scaling(config: dict) -> Hparams:
    """llama.cpp's rope scaling keys for the config's rope (none for default rope and for llama3, whose scaling is
    the rope_freqs tensor rope_tensors writes): linear -> type and factor; yarn -> type, factor, original context
    and the betas the config sets (as llama.cpp's converter writes them); longrope -> type,
    original context (the length llama.cpp compares its context with to choose the long or short factors) and the
    attention factor HF scales cos and sin by. Refuses what llama.cpp would compute differently."""
    rope = rope_parameters(config)
    kind = rope["rope_type"]
    if kind == "linear":
        return {"rope_scaling_type": "linear", "rope_scaling_factor": rope_factor(config, rope)}
    if kind == "yarn":
        return yarn_scaling(config, rope)
    if kind == "longrope":
        return {"rope_scaling_type": "longrope", "rope_scaling_orig_ctx_len": original_context(config, rope),
                "rope_scaling_attn_factors": longrope_attention_factor(config, rope)}
    _require(kind in LLAMA_ROPES, config, f"rope type '{kind}' has no llama.cpp equivalent (llama.cpp scales rope "
             "as none, linear, yarn, longrope or by llama3's per-frequency factors)")
    return {}


YARN_KEYS = (("beta_fast", "rope_scaling_yarn_beta_fast"), ("beta_slow", "rope_scaling_yarn_beta_slow"))


def yarn_scaling(config: dict, rope: dict) -> Hparams:
    """YaRN's keys. llama.cpp computes YaRN's attention factor itself (0.1 ln(factor) + 1, transformers' default)
    and ramps between its correction dimensions rounded outwards (transformers' truncate: true); a config that sets
    its own attention factor, mscale or an untruncated ramp would be computed differently, so it is refused."""
    _require(rope.get("truncate", True), config, "yarn with truncate: false (llama.cpp always rounds YaRN's "
             "correction range outwards)")
    own = [key for key in ("attention_factor", "mscale", "mscale_all_dim") if rope.get(key) is not None]
    _require(not own, config, f"yarn with its own {', '.join(own)} (llama.cpp's llama graph computes the attention "
             "factor from the scaling factor alone)")
    out: Hparams = {"rope_scaling_type": "yarn", "rope_scaling_factor": rope_factor(config, rope),
                    "rope_scaling_orig_ctx_len": original_context(config, rope)}
    out.update({setter: float(rope[key]) for key, setter in YARN_KEYS if rope.get(key) is not None})
    return out


def longrope_attention_factor(config: dict, rope: dict) -> float:
    """LongRoPE's attention factor as transformers computes it: the config's attention_factor, else
    sqrt(1 + ln(factor) / ln(original context)) for a factor above 1."""
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    factor = rope_factor(config, rope)
    return math.sqrt(1 + math.log(factor) / math.log(original_context(config, rope))) if factor > 1 else 1.0


def rope_tensors(config: dict) -> dict[str, np.ndarray]:
    """The rope tensors llama.cpp's converter generates beside the checkpoint's (generate_extra_tensors), by GGUF
    name: llama3 -> rope_freqs (each frequency's wavelength factor), longrope -> rope_factors_long and
    rope_factors_short (the config's lists); none for other ropes."""
    rope = rope_parameters(config)
    half = rope_dimensions(config) // 2
    if rope["rope_type"] == "llama3":
        return {"rope_freqs.weight": llama3_factors(config, rope, half)}
    if rope["rope_type"] != "longrope":
        return {}
    factors = {f"rope_factors_{kind}.weight": np.asarray(rope.get(f"{kind}_factor") or [], dtype=np.float32)
               for kind in ("long", "short")}
    sizes = sorted({len(f) for f in factors.values()})
    _require(sizes == [half], config, f"longrope's long_factor and short_factor must have {half} entries (half the "
             f"rotated dimensions), not {' and '.join(map(str, sizes))}")
    return factors


def llama3_factors(config: dict, rope: dict, half: int) -> np.ndarray:
    """Llama 3's rope scaling as llama.cpp holds it: one factor per frequency that divides it (transformers'
    _compute_llama3_parameters): high frequencies kept, low ones divided by `factor`, a smooth band between. The
    original context is the rope parameters' (llama.cpp's converter reads it from the top of config.json, 8192 when
    absent: transformers 5 writes it inside rope_parameters)."""
    base = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    factor, low, high = (float(rope.get(k, d)) for k, d in (("factor", 8.0), ("low_freq_factor", 1.0),
                                                             ("high_freq_factor", 4.0)))
    original = original_context(config, rope)
    inv_freq = 1.0 / base ** (np.arange(0, 2 * half, 2, dtype=np.float32) / np.float32(2 * half))
    wavelength = 2 * math.pi / inv_freq.astype(np.float64)
    smooth = (original / wavelength - low) / (high - low)
    band = 1 / ((1 - smooth) / factor + smooth)
    factors = np.where(wavelength < original / high, 1.0, np.where(wavelength > original / low, factor, band))
    return factors.astype(np.float32)


def rope_dimensions(config: dict) -> int:
    """The rotated width of a head (head_dim, else hidden_size / heads)."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def hparams(config: dict) -> Hparams:
    """llama.cpp's Llama hyperparameters from an HF config.json (rope_theta under rope_parameters in newer files),
    with the rope scaling keys of a scaled rope (rope_scaling)."""
    heads = config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}
    return {
        "block_count": config["num_hidden_layers"], "context_length": config.get("max_position_embeddings", 2048),
        "embedding_length": config["hidden_size"], "feed_forward_length": config["intermediate_size"],
        "head_count": heads, "head_count_kv": config.get("num_key_value_heads") or heads,
        "rope_freq_base": float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
        "layer_norm_rms_eps": float(config.get("rms_norm_eps", 1e-6)), "vocab_size": config["vocab_size"],
        "rope_dimension_count": rope_dimensions(config), **rope_scaling(config),
    }


GEMMA3_SWA_PERIOD = 6  # llama.cpp's gemma3 default: in every 6 layers, 5 sliding then 1 full (load_swa_pattern)
GEMMA3_SWA_ROPE_BASE = 10000.0  # llama.cpp's rope base of sliding layers when the GGUF names none


def gemma3_hparams(config: dict) -> Hparams:
    """llama.cpp's gemma3 hyperparameters, the keys its converter writes (conversion/gemma.py, Gemma3Model), plus the
    sliding layers' pattern and rope base only where they differ from llama.cpp's defaults."""
    layers, head_dim = config["num_hidden_layers"], config["head_dim"]
    rope = config["rope_parameters"]
    _require(config.get("query_pre_attn_scalar", head_dim) == head_dim, config,
             "llama.cpp scales attention by 1/sqrt(head_dim), not by query_pre_attn_scalar")
    _require(config.get("attn_logit_softcapping") is None, config, "llama.cpp's gemma3 graph has no attention "
             "soft-capping")
    _require(all(r.get("rope_type", "default") == "default" for r in rope.values()), config,
             "rope scaling is not written here")
    out: Hparams = {
        "context_length": config["max_position_embeddings"], "embedding_length": config["hidden_size"],
        "block_count": layers, "feed_forward_length": config["intermediate_size"],
        "head_count": config["num_attention_heads"], "layer_norm_rms_eps": float(config["rms_norm_eps"]),
        "key_length": head_dim, "value_length": head_dim,
        "rope_freq_base": float(rope["full_attention"]["rope_theta"]),
        "sliding_window": config["sliding_window"], "head_count_kv": config["num_key_value_heads"]}
    sliding = [kind == "sliding_attention" for kind in config["layer_types"]]
    if sliding != [i % GEMMA3_SWA_PERIOD < GEMMA3_SWA_PERIOD - 1 for i in range(layers)]:
        out["sliding_window_pattern"] = sliding
    if float(rope["sliding_attention"]["rope_theta"]) != GEMMA3_SWA_ROPE_BASE:
        out["rope_freq_base_swa"] = float(rope["sliding_attention"]["rope_theta"])
    if config.get("final_logit_softcapping"):
        out["final_logit_softcapping"] = float(config["final_logit_softcapping"])
    return out


def n_experts(config: dict) -> int:
    """Routed experts per block (Mixtral's config names them num_local_experts, Qwen's num_experts)."""
    return int(config.get("num_local_experts") or config.get("num_experts") or 0)


def moe_hparams(config: dict) -> Hparams:
    """The Llama hyperparameters plus the mixture of experts' (what llama.cpp's converter writes for Mixtral as a
    Llama): experts per block and chosen per token. llama.cpp's llama graph routes by softmax over the router logits,
    keeps the top k and renormalises their weights, as Mixtral does (and, as for Mistral, attends without a sliding
    window)."""
    _require(n_experts(config) > 0 and config.get("num_experts_per_tok", 0) > 0, config,
             "no expert count or experts per token in config.json")
    return {**hparams(config), "expert_count": n_experts(config),
            "expert_used_count": config["num_experts_per_tok"]}


def qwen3_moe_hparams(config: dict) -> Hparams:
    """llama.cpp's qwen3moe hyperparameters: moe_hparams plus the experts' own width and the head width (q/k norms
    act per head); its graph always renormalises the chosen experts' weights, and every layer is a MoE block."""
    _require(config.get("norm_topk_prob", False), config,
             "llama.cpp's qwen3moe graph always renormalises the chosen experts' weights (norm_topk_prob false)")
    _require(not config.get("mlp_only_layers") and config.get("decoder_sparse_step", 1) == 1, config,
             "llama.cpp's qwen3moe graph has a MoE block in every layer (mlp_only_layers, decoder_sparse_step)")
    _require(not config.get("use_sliding_window"), config, "llama.cpp's qwen3moe graph has no sliding window")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {**moe_hparams(config), "expert_feed_forward_length": config["moe_intermediate_size"],
            "key_length": head_dim, "value_length": head_dim}


def _require(holds: bool, config: dict, why: str) -> None:
    if not holds:
        _refuse(config, why)


def _refuse(config: dict, why: str) -> NoReturn:
    """One line saying why the config's model cannot be written for llama.cpp."""
    raise RuntimeError(f"gguf: cannot write model type '{config.get('model_type')}': {why}; give the engine a GGUF "
                       "file (option gguf: PATH)")


def _count(value: int | float | str | list[bool]) -> int:
    """A head count from the Hparams (a list there is sliding_window_pattern's, a string rope_scaling_type's)."""
    if isinstance(value, (list, str)):
        raise TypeError(f"a head count, not {value!r}")
    return int(value)


def _rope_q(weight: np.ndarray, h: Hparams) -> np.ndarray:
    return rope_layout(weight, _count(h["head_count"]))


def _rope_kv(weight: np.ndarray, h: Hparams) -> np.ndarray:
    return rope_layout(weight, _count(h["head_count_kv"]))


def _one_plus(weight: np.ndarray, h: Hparams) -> np.ndarray:
    """Gemma's RMSNorm scales by (1 + w) (computed in float32); llama.cpp multiplies by the stored weight."""
    return weight + np.float32(1.0)


ROUTER = "ffn_gate_inp.weight"  # a mixture of experts' router: kept in f32 by llama.cpp's converter and quantiser
LLAMA_ROPE = (("attn_q.weight", _rope_q), ("attn_k.weight", _rope_kv))

WRITERS = {  # HF model_type -> how llama.cpp's converter writes it
    "llama": Architecture("LLAMA", hparams, LLAMA_ROPE, LLAMA_ROPES),
    # mistral: written as a Llama, as llama.cpp's converter does; llama.cpp's llama graph has no sliding window, so a
    # Mistral whose window is shorter than the sequence attends further than in HF (explain names it)
    "mistral": Architecture("LLAMA", hparams, LLAMA_ROPE, LLAMA_ROPES),
    # qwen2: NEOX rope (no permutation), q/k/v biases (gguf's tensor map names them)
    "qwen2": Architecture("QWEN2", hparams),
    # gemma3: NEOX rope (llama.cpp rotates the two halves of a head, as HF does): no permutation
    "gemma3_text": Architecture("GEMMA3", gemma3_hparams, (("norm.weight", _one_plus),), frozenset({"default"})),
    # mixtral: written as a Llama with stacked experts (ffn_{gate,up,down}_exps) and a router (ffn_gate_inp), as
    # llama.cpp's converter does
    "mixtral": Architecture("LLAMA", moe_hparams, LLAMA_ROPE, LLAMA_ROPES),
    # qwen3_moe: NEOX rope (no permutation), per-head q/k norms, stacked experts of their own width
    "qwen3_moe": Architecture("QWEN3MOE", qwen3_moe_hparams),
}


def writer_for(config: dict) -> Architecture:
    """How to write the config's model type, refusing a rope whose scaling that architecture's graph would not
    apply (llama.cpp reads llama3's and LongRoPE's factor tensors in its llama graph only)."""
    model_type = config.get("model_type")
    if model_type not in WRITERS:
        raise RuntimeError(f"gguf: no GGUF writer for model type '{model_type}' (known: {', '.join(WRITERS)}): give "
                           "the engine a GGUF file (option gguf: PATH)")
    arch = WRITERS[model_type]
    kind = rope_parameters(config)["rope_type"]
    _require(kind in arch.ropes or kind not in LLAMA_ROPES, config, f"{kind} rope scaling is not written for "
             f"llama.cpp's {arch.gguf_arch.lower()} graph (it applies {', '.join(sorted(arch.ropes))} only)")
    return arch


EXPERT = re.compile(r"(?P<block>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight")


def stacked_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors with a mixture of experts' weights as llama.cpp holds them: one [n_expert, rows, cols] stack per
    block and projection, named `<block>.experts.<proj>.weight` (the name gguf's map knows). Per-expert weights
    (`<block>.experts.<e>.<proj>.weight`, as checkpoints store them) are stacked in expert order; transformers 5's
    fused stack of gate and up (`<block>.experts.gate_up_proj` [n_expert, 2*ffn, hidden], gate first) is split in
    two. Every other tensor is left as it is."""
    out: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, weight in tensors.items():
        if match := EXPERT.fullmatch(name):
            experts.setdefault(f"{match['block']}.{match['proj']}.weight", {})[int(match["expert"])] = weight
        elif name.endswith(".experts.gate_up_proj"):
            block = name.removesuffix(".gate_up_proj")
            out[f"{block}.gate_proj.weight"], out[f"{block}.up_proj.weight"] = np.split(weight, 2, axis=1)
        elif name.endswith(".experts.down_proj"):
            out[f"{name}.weight"] = weight
        else:
            out[name] = weight
    for name, by_id in experts.items():
        if sorted(by_id) != list(range(len(by_id))):
            raise RuntimeError(f"gguf: the experts of {name} are numbered {sorted(by_id)}, not 0..{len(by_id) - 1}")
        out[name] = np.stack([by_id[i] for i in range(len(by_id))])
    return out


def gguf_name(hf_name: str, n_layers: int, arch: str = "LLAMA") -> str | None:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight (gguf's own tensor-name map for the
    gguf.MODEL_ARCH member `arch`); None if unknown."""
    import gguf

    mapping = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch), n_layers)
    return mapping.get_name(hf_name, try_suffixes=(".weight", ".bias"))


def cache_dir(model_path: Path) -> Path:
    """Where a model folder's GGUF variants live: beside a cached model's dtype folders (a named or a merged model),
    else under the cache by folder."""
    from harness.models.catalog import cache_root, models_root
    from harness.models.weight_files import SINGLE, files

    first = next(iter(files(Path(model_path))), Path(model_path) / SINGLE)
    weights = first.resolve().parent  # a linked named model: its source's
    root = models_root().resolve()
    if weights.is_relative_to(root):
        return weights.parent / "gguf"  # models/<name>/float32 -> models/<name>/gguf
    digest = hashlib.sha1(str(weights).encode()).hexdigest()[:10]
    return cache_root() / "gguf" / f"{weights.name}-{digest}"


def variant_path(model_path: Path, variant: str) -> Path:
    if variant == BUNDLED:
        return bundled_source(model_path)
    return cache_dir(model_path) / f"{variant}.gguf"


def named_model(model_path: Path) -> NamedModel | None:
    """The catalog entry whose cache a model folder's GGUF variants live in, or
    None for a folder that is not a named model."""
    from harness.models.catalog import MODELS, models_root

    folder = cache_dir(model_path)
    return MODELS.get(folder.parent.name) if folder.parent.parent == models_root().resolve() else None


def bundled_source(model_path: Path) -> Path:
    """The GGUF file a named model was converted from, as shipped (its catalog entry's source_gguf)."""
    model = named_model(model_path)
    if model is None or model.source_gguf is None:
        raise RuntimeError(f"gguf: bundled: {model_path} was not converted from a GGUF file; use one of "
                           f"{', '.join(v for v in VARIANTS if v != BUNDLED)}")
    return model.source_gguf()


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure(model_path: Path, variant: str) -> Path:
    """The variant's GGUF file, built first if missing (a quantised one from the f32 file, itself built if needed)."""
    path = variant_path(model_path, variant)
    if variant == BUNDLED or path.exists():
        return path
    with locked(path.parent):  # another engine may be building it: wait, then find it built
        return _build(model_path, variant)


def _build(model_path: Path, variant: str) -> Path:
    """Build one variant (the caller holds the folder's lock)."""
    path = variant_path(model_path, variant)
    if path.exists():
        return path
    if variant in FULL_PRECISION:
        atomic_write(path, lambda tmp: write_full_precision(model_path, tmp, variant))
    else:
        source = _build(model_path, "f32")
        atomic_write(path, lambda tmp: quantise(source, tmp, variant))
    return path


def weights(model_path: Path, gguf: str) -> str:
    """The weights a llama.cpp engine with option `gguf` runs, in words: the file and its real tensor-type mix."""
    from adapters.engines.gguf_tensors import describe

    path = Path(gguf) if gguf.endswith(".gguf") else variant_path(Path(model_path), gguf)
    if not path.exists():
        return f"{path.name}: not built yet (`parity models prepare` or the first run builds it)"
    return f"{path.name}: {describe(path)}"


def prepare(model_path: Path, build: bool) -> str:
    """Every variant of a model folder (for `parity models prepare`), built now (build) or left for first use: one
    line naming what is there or will be."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    if config.get("model_type") not in WRITERS:
        return f"no GGUF variants: model type '{config.get('model_type')}' has no GGUF writer here"
    variants = (*FULL_PRECISION, *QUANTISED)
    if not build:
        there = [v for v in variants if variant_path(model_path, v).exists()]
        missing = [v for v in variants if v not in there]
        return (f"GGUF variants {', '.join(there)} in {cache_dir(model_path)}" if there else "GGUF variants") + \
            (f"{'; ' if there else ' '}{', '.join(missing)} built on first use (or now: `parity models prepare "
             "--engine-files`)" if missing else "")
    built = [ensure(model_path, variant) for variant in variants]
    return f"GGUF variants {', '.join(p.stem for p in built)} in {built[0].parent}"


def atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _tokenizer_sources(model_path: Path) -> Iterator[Path]:
    """GGUF files whose tokenizer the folder may have: its own named model's source or the one it borrows its
    tokenizer from (tiny-llama: SmolLM2's), then those of the other prepared named models."""
    from harness.models.catalog import MODELS

    own = named_model(model_path)
    for source in (own.source_gguf, own.tokenizer_gguf) if own is not None else ():
        if source is not None:
            yield source()
    for model in MODELS.values():
        if model is not own and model.source_gguf is not None and model.prepared():
            yield model.source_gguf()


def hf_pieces(model: str, tokens: list[str]) -> list[str]:
    """A GGUF vocabulary as HF spells it: a SentencePiece one ("llama") holds user-defined tokens with spaces where HF
    (and SentencePiece) write the word-boundary mark \u2581 (Gemma's runs of spaces, ids 138-167)."""
    return [t.replace(" ", "\u2581") for t in tokens] if model == "llama" else tokens


@lru_cache(maxsize=2)
def _tokenizer_fields(model_path: Path, vocab_size: int) -> list[tuple[str, gguf_header.Value]]:
    """The tokenizer.* fields of the first source GGUF whose vocabulary is the model folder's, id for id. Its token
    count must be the model's vocab_size: llama.cpp's logits have one entry per token (its converter trims
    token_embd to them), so fewer tokens would leave its logits shorter than HF's."""
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(model_path).get_vocab()
    tried = []
    for source in _tokenizer_sources(model_path):
        fields = {key: value for key, value in gguf_header.read(source)[0].items() if key.startswith("tokenizer.")}
        tokens = hf_pieces(str(fields["tokenizer.ggml.model"].value),
                           cast(list[str], fields["tokenizer.ggml.tokens"].value))
        tried.append(source.name)
        if len(vocab) == len(tokens) and all(vocab.get(piece) == i for i, piece in enumerate(tokens)):
            if len(tokens) != vocab_size:
                raise RuntimeError(f"gguf: {source.name} has {len(tokens)} tokens, the model {vocab_size} logits: "
                                   "llama.cpp would trim token_embd and its logits would not line up with HF's")
            return list(fields.items())
    raise RuntimeError(f"gguf: the tokenizer of {model_path} is not that of any GGUF shipped here (tried: "
                       f"{', '.join(tried) or 'none'}): give the engine a GGUF file (option gguf: PATH)")


def write_full_precision(model_path: Path, out: Path, variant: str) -> None:
    """Write the model folder's weights as an f32 or f16 GGUF (see the module docstring)."""
    import gguf

    from harness.models import weight_files

    config = json.loads((Path(model_path) / "config.json").read_text())
    arch = writer_for(config)
    h = arch.hparams(config)
    if not weight_files.files(Path(model_path)):
        raise RuntimeError(f"gguf: {weight_files.missing_problem(Path(model_path))}")
    tensors = stacked_experts(weight_files.load(Path(model_path)))  # every shard of a sharded folder
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, arch.gguf_arch)])
    writer.add_name(Path(model_path).resolve().parent.name)
    writer.add_file_type(FULL_PRECISION[variant])
    for key, value in h.items():
        getattr(writer, f"add_{key}")(gguf.RopeScalingType(value) if key == "rope_scaling_type" else value)
    for key, field in _tokenizer_fields(Path(model_path), config["vocab_size"]):
        kind, *element = (gguf.GGUFValueType(t) for t in field.types)
        writer.add_key_value(key, field.value, kind, element[0] if element else None)
    for hf_name, weight in tensors.items():
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # llama.cpp reuses token_embd when the file has no output.weight
        name = gguf_name(hf_name, config["num_hidden_layers"], arch.gguf_arch)
        if name is None:
            raise RuntimeError(f"gguf: no llama.cpp name for tensor {hf_name}")
        writer.add_tensor(name, np.ascontiguousarray(stored(weight, name, arch, h, variant)))
    for name, factors in rope_tensors(config).items():  # 1-D: f32 in every variant, as llama.cpp's converter keeps
        writer.add_tensor(name, factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def stored(weight: np.ndarray, name: str, arch: Architecture, h: Hparams, variant: str) -> np.ndarray:
    """An HF tensor as the GGUF holds it: float32, transformed as the architecture says, in f16 for f16 except 1-D
    ones (norms) and routers (ffn_gate_inp), which llama.cpp's converter keeps in f32."""
    weight = weight.astype(np.float32)
    for suffix, transform in arch.transforms:
        if name.endswith(suffix):
            weight = transform(weight, h)
    half = variant == "f16" and weight.ndim > 1 and not name.endswith(ROUTER)
    return weight.astype(np.float16) if half else weight


def quantise(source: Path, out: Path, variant: str) -> None:
    """llama.cpp's own quantiser (llama_model_quantize, as the llama-quantize tool calls it)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTISED[variant]
    params.nthread = int(os.environ.get("OMP_NUM_THREADS", "1"))
    log = out.parent / f"{variant}.quantize.log"  # llama.cpp's report (types chosen, fallbacks) goes here
    with open(log, "w") as sink, _c_output_to(sink):
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if status != 0:
        raise RuntimeError(f"gguf: llama_model_quantize {source.name} -> {variant} failed (status {status}); "
                           f"see {log}")


@contextmanager
def _c_output_to(sink) -> Iterator[None]:
    """Point the process's stdout and stderr file descriptors (where llama.cpp's C code logs) at a file."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
