"""Where the GGUF files of a model folder live and how they are written safely: in the model cache
(<cache>/models/<name>/gguf/ for named and merged models, <cache>/gguf/<folder>-<hash>/ for any other folder), under
a temporary name renamed into place, under a lock, so engines that start side by side build each file once. Which
variants there are, and the `bundled` one: the GGUF file a named model was converted from."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.models.catalog import NamedModel

FULL_PRECISION = {"f32": 0, "f16": 1}  # variant -> GGUF general.file_type (llama_ftype ALL_F32, MOSTLY_F16)
QUANTISED = {"q8_0": 7, "q4_k_m": 15}  # variant -> llama_ftype for llama_model_quantize
BUNDLED = "bundled"
VARIANTS = (*FULL_PRECISION, *QUANTISED, BUNDLED)


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


def atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
