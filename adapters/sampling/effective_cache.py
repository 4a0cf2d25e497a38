"""Effective params, computed once: an engine's own sampling code is asked what it makes of a request's params, and the
answer is cached on disk under $LLM_PARITY_CACHE/effective/. The key covers everything the answer depends on: the
sampling module's source, its keyword arguments, the engine distribution's version, the model's config and
generation_config.json, the dtype and the params. A warm cache spares a worker importing an engine package it does not
otherwise load (an `openai` engine in the vllm dialect would import vLLM for it)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.scenario.vocabulary import SamplingParams


def _cache_dir() -> Path:
    root = Path(os.environ.get("LLM_PARITY_CACHE") or Path.home() / ".cache" / "llm-parity").expanduser()
    return root / "effective"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def cache_key(module: Any, kwargs: dict[str, Any], model_path: str, dtype: str, params: SamplingParams) -> str:
    model = Path(model_path)
    # the module's source and that of the modules it declares its answers depend on (SOURCES: the adapter's
    # translation, beam-search knowledge), so an edit to any of them is never answered from an old entry
    files = [Path(m.__file__) for m in (module, *map(importlib.import_module, getattr(module, "SOURCES", ())))]
    parts = {
        "source": hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest(),
        "kwargs": kwargs, "dtype": dtype, "params": params.model_dump(mode="json"), "model": str(model),
        "versions": {d: _version(d) for d in getattr(module, "DISTRIBUTIONS", ())},
        "files": {name: hashlib.sha256((model / name).read_bytes()).hexdigest()
                  for name in ("config.json", "generation_config.json") if (model / name).exists()},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def effective_for(module_name: str, kwargs: dict[str, Any], model_path: str, dtype: str,
                  params: SamplingParams) -> dict[str, Any]:
    """Effective.model_dump() for these params, from the cache or from the engine's code (then cached). Never
    raises: a failure is a note in the answer, since effective params are information, not a result."""
    try:
        module = importlib.import_module(module_name)
        path = _cache_dir() / f"{cache_key(module, kwargs, model_path, dtype, params)}.json"
        if path.exists():
            return json.loads(path.read_text())
        answer = module.effective(Path(model_path), params, dtype, **kwargs).model_dump(mode="json")
    except Exception as exc:  # informational: never fails a case
        return {"notes": [f"effective params not computed: {' '.join(f'{type(exc).__name__}: {exc}'.split())[:400]}"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(answer))
    os.replace(tmp, path)
    return answer
