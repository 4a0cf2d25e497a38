"""GGUF files for the llama.cpp engines, built once from the weights the HF engine loads.

A llama.cpp engine reads GGUF, not the HF folder. So that HF vs llama.cpp compares numerics only, and llama.cpp F32
vs a quantised variant compares quantisation only, every variant comes from the model folder's own safetensors:

  f32, f16   written here with the `gguf` package: the folder's tensors renamed to llama.cpp's names, q and k
             projections permuted into llama.cpp's rope layout (pairs (j, j+d/2) of a head become (2j, 2j+1)), the
             hyperparameters from config.json and the tokenizer from the GGUF the bundled model ships (checked to be
             the folder's tokenizer); f16 keeps 1-D tensors (norms) in f32, as llama.cpp's converter does
  q8_0, q4_k_m  llama.cpp's own quantiser (llama_model_quantize) on the f32 file
  bundled    the GGUF file the named model was converted from (SmolLM2's Q4_1), as shipped

Files live in the model cache (<cache>/models/<name>/gguf/ for named models, <cache>/gguf/<folder>-<hash>/ for any
other folder), are written under a temporary name and renamed, and are built under a lock, so engines that start
side by side build each file once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np

FULL_PRECISION = {"f32": 0, "f16": 1}  # variant -> GGUF general.file_type (llama_ftype ALL_F32, MOSTLY_F16)
QUANTISED = {"q8_0": 7, "q4_k_m": 15}  # variant -> llama_ftype for llama_model_quantize
BUNDLED = "bundled"
VARIANTS = (*FULL_PRECISION, *QUANTISED, BUNDLED)
ARCHITECTURES = ("llama",)  # HF model_type values whose tensors this writer knows (the Llama layout)


def rope_layout(rows: np.ndarray, n_head: int) -> np.ndarray:
    """HF -> llama.cpp for a q or k projection weight [n_head*d, in]: within each head, rows (j, j + d/2) become
    (2j, 2j + 1) (llama.cpp's rope rotates adjacent pairs, HF's rotate_half the two halves of a head)."""
    head_dim = rows.shape[0] // n_head
    return rows.reshape(n_head, 2, head_dim // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def hf_layout(activations: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp -> HF for q/k activations [positions, n_head*d] (the inverse of rope_layout on the last axis)."""
    positions, width = activations.shape
    head_dim = width // n_head
    return activations.reshape(positions, n_head, head_dim // 2, 2).swapaxes(2, 3).reshape(positions, width)


def hparams(config: dict) -> dict[str, int | float]:
    """llama.cpp's Llama hyperparameters from an HF config.json (rope_theta under rope_parameters in newer files)."""
    heads = config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}
    return {
        "block_count": config["num_hidden_layers"], "context_length": config.get("max_position_embeddings", 2048),
        "embedding_length": config["hidden_size"], "feed_forward_length": config["intermediate_size"],
        "head_count": heads, "head_count_kv": config.get("num_key_value_heads") or heads,
        "rope_freq_base": float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
        "rms_eps": float(config.get("rms_norm_eps", 1e-6)), "vocab_size": config["vocab_size"],
        "rope_dimension_count": config.get("head_dim") or config["hidden_size"] // heads,
    }


def gguf_name(hf_name: str, n_layers: int) -> str | None:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight (gguf's own tensor-name map); None if unknown."""
    import gguf

    mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    return mapping.get_name(hf_name, try_suffixes=(".weight", ".bias"))


def cache_dir(model_path: Path) -> Path:
    """Where a model folder's GGUF variants live: beside a named model's folders, else under the cache by folder."""
    from harness.models.catalog import cache_root, models_root

    weights = (Path(model_path) / "model.safetensors").resolve().parent  # a linked named model: its source's
    root = models_root().resolve()
    if weights.is_relative_to(root):
        return root / weights.relative_to(root).parts[0] / "gguf"
    digest = hashlib.sha1(str(weights).encode()).hexdigest()[:10]
    return cache_root() / "gguf" / f"{weights.name}-{digest}"


def variant_path(model_path: Path, variant: str) -> Path:
    if variant == BUNDLED:
        return bundled_source(model_path)
    return cache_dir(model_path) / f"{variant}.gguf"


def bundled_source(model_path: Path) -> Path:
    """The GGUF file a named model was converted from, as shipped (SmolLM2's Q4_1, for the models built on it)."""
    from harness.models.catalog import models_root, smollm2_gguf_path

    if cache_dir(model_path) != models_root().resolve() / "smollm2-135m" / "gguf":
        raise RuntimeError(f"gguf: bundled: {model_path} was not converted from a GGUF file; use one of "
                           f"{', '.join(v for v in VARIANTS if v != BUNDLED)}")
    return smollm2_gguf_path()


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
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
    with _locked(path.parent):  # another engine may be building it: wait, then find it built
        return _build(model_path, variant)


def _build(model_path: Path, variant: str) -> Path:
    """Build one variant (the caller holds the folder's lock)."""
    path = variant_path(model_path, variant)
    if path.exists():
        return path
    if variant in FULL_PRECISION:
        _atomic(path, lambda tmp: write_full_precision(model_path, tmp, variant))
    else:
        source = _build(model_path, "f32")
        _atomic(path, lambda tmp: quantise(source, tmp, variant))
    return path


def prepare(model_path: Path) -> str:
    """Every variant of a model folder (for `parity models prepare`): one line naming what is there."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    if config.get("model_type") not in ARCHITECTURES:
        return f"no GGUF variants: model type '{config.get('model_type')}' has no GGUF writer here"
    built = [ensure(model_path, variant) for variant in (*FULL_PRECISION, *QUANTISED)]
    return f"GGUF variants {', '.join(p.stem for p in built)} in {built[0].parent}"


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@lru_cache(maxsize=2)
def _tokenizer_fields(model_path: Path):
    """The tokenizer.* fields of the bundled GGUF, after checking its vocabulary is the model folder's."""
    import gguf
    from transformers import AutoTokenizer

    from harness.models.catalog import smollm2_gguf_path

    reader = gguf.GGUFReader(smollm2_gguf_path())
    fields = [f for name, f in reader.fields.items() if name.startswith("tokenizer.")]
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = AutoTokenizer.from_pretrained(model_path).get_vocab()
    if len(vocab) != len(tokens) or any(vocab.get(piece) != i for i, piece in enumerate(tokens)):
        raise RuntimeError(f"gguf: the tokenizer of {model_path} is not SmolLM2's, the only one whose GGUF "
                           "tokenizer ships here: give the engine a GGUF file (option gguf: PATH)")
    return fields


def write_full_precision(model_path: Path, out: Path, variant: str) -> None:
    """Write the model folder's weights as an f32 or f16 GGUF (see the module docstring)."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((Path(model_path) / "config.json").read_text())
    if config.get("model_type") not in ARCHITECTURES:
        raise RuntimeError(f"gguf: no GGUF writer for model type '{config.get('model_type')}' (known: "
                           f"{', '.join(ARCHITECTURES)}): give the engine a GGUF file (option gguf: PATH)")
    h = hparams(config)
    tensors = load_file(str(Path(model_path) / "model.safetensors"))
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(Path(model_path).resolve().parent.name)
    writer.add_file_type(FULL_PRECISION[variant])
    writer.add_block_count(h["block_count"])
    writer.add_context_length(h["context_length"])
    writer.add_embedding_length(h["embedding_length"])
    writer.add_feed_forward_length(h["feed_forward_length"])
    writer.add_head_count(h["head_count"])
    writer.add_head_count_kv(h["head_count_kv"])
    writer.add_rope_freq_base(h["rope_freq_base"])
    writer.add_layer_norm_rms_eps(h["rms_eps"])
    writer.add_vocab_size(h["vocab_size"])
    writer.add_rope_dimension_count(h["rope_dimension_count"])
    for field in _tokenizer_fields(model_path):
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type)
    for hf_name, weight in tensors.items():
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # llama.cpp reuses token_embd when the file has no output.weight
        name = gguf_name(hf_name, h["block_count"])
        if name is None:
            raise RuntimeError(f"gguf: no llama.cpp name for tensor {hf_name}")
        weight = weight.astype(np.float32)
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            weight = rope_layout(weight, h["head_count"] if "attn_q" in name else h["head_count_kv"])
        if variant == "f16" and weight.ndim > 1:
            weight = weight.astype(np.float16)
        writer.add_tensor(name, np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


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
