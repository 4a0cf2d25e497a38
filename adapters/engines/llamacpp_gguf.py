"""GGUF files for the llama.cpp engines, built once from the weights the HF engine loads.

A llama.cpp engine reads GGUF, not the HF folder. So that HF vs llama.cpp compares numerics only, and llama.cpp F32
vs a quantised variant compares quantisation only, every variant comes from the model folder's own safetensors (one
file or every shard):

  f32, f16   written here with the `gguf` package (gguf_writer), as llama.cpp's converter writes the architecture
             (gguf_architectures: the GGUF architecture, its hyperparameters from config.json, which tensors change
             how, a mixture of experts' weights stacked, f16 keeping norms and routers in f32), a scaled rope as its
             converter writes it (gguf_rope), tensors renamed by gguf's own name map, the tokenizer from the GGUF a
             named model ships, checked to be the folder's tokenizer (gguf_tokenizer)
  q8_0, q4_k_m  llama.cpp's own quantiser (llama_model_quantize) on the f32 file
  bundled    the GGUF file the named model was converted from (its `source_gguf`: SmolLM2's Q4_1, Gemma 3's Q4_K_M),
             as shipped

Each is built once, into the model cache, under a lock (gguf_cache: where, and how a file is written safely).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from adapters.engines.gguf_architectures import WRITERS, stacked_experts, stored, writer_for
from adapters.engines.gguf_cache import (
    BUNDLED,
    FULL_PRECISION,
    QUANTISED,
    atomic_write,
    cache_dir,
    locked,
    variant_path,
)
from adapters.engines.gguf_rope import rope_tensors
from adapters.engines.gguf_tokenizer import tokenizer_fields
from adapters.engines.gguf_writer import gguf_file, gguf_name


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
    with gguf_file(out, arch.gguf_arch) as writer:
        writer.add_name(Path(model_path).resolve().parent.name)
        writer.add_file_type(FULL_PRECISION[variant])
        for key, value in h.items():
            getattr(writer, f"add_{key}")(gguf.RopeScalingType(value) if key == "rope_scaling_type" else value)
        for key, field in tokenizer_fields(Path(model_path), config["vocab_size"]):
            kind, *element = (gguf.GGUFValueType(t) for t in field.types)
            writer.add_key_value(key, field.value, kind, element[0] if element else None)
        for hf_name, weight in tensors.items():
            if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
                continue  # llama.cpp reuses token_embd when the file has no output.weight
            name = gguf_name(hf_name, config["num_hidden_layers"], arch.gguf_arch)
            if name is None:
                raise RuntimeError(f"gguf: no llama.cpp name for tensor {hf_name}")
            writer.add_tensor(name, np.ascontiguousarray(stored(weight, name, arch, h, variant)))
        for name, factors in rope_tensors(config).items():  # 1-D: f32 in every variant, as llama.cpp's converter
            writer.add_tensor(name, factors)  # keeps them


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
