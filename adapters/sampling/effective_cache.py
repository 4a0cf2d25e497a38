"""Effective params, computed once: an engine's own sampling code is asked what it makes of a request's params, and the
answer is cached on disk under $LLM_PARITY_CACHE/effective/. The key covers everything the answer depends on: the
sampling module's source, its keyword arguments, the engine distribution's version, the model's config and
generation_config.json, the dtype and the params. A warm cache spares a worker importing an engine package it does not
otherwise load (an `openai` engine in the vllm dialect would import vLLM for it). A cold one is filled off the
results' path: `InBackground` computes a batch's answers in a thread while the engine generates, and workers that need
the same answer at once (two engines with the same sampling code) wait for the first one's, not compute it twice."""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
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


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Held while this process computes the answer at `path`: another process asking for it waits, then reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def effective_for(module_name: str, kwargs: dict[str, Any], model_path: str, dtype: str,
                  params: SamplingParams) -> dict[str, Any]:
    """Effective.model_dump() for these params, from the cache or from the engine's code (then cached). Never
    raises: a failure is a note in the answer, since effective params are information, not a result."""
    try:
        module = importlib.import_module(module_name)
        path = _cache_dir() / f"{cache_key(module, kwargs, model_path, dtype, params)}.json"
        if path.exists():
            return json.loads(path.read_text())
        with _exclusive(path):
            if path.exists():  # computed by another worker while this one waited
                return json.loads(path.read_text())
            answer = module.effective(Path(model_path), params, dtype, **kwargs).model_dump(mode="json")
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(answer))
            os.replace(tmp, path)
            return answer
    except Exception as exc:  # informational: never fails a case
        return {"notes": [f"effective params not computed: {' '.join(f'{type(exc).__name__}: {exc}'.split())[:400]}"]}


class InBackground:
    """The effective params of a batch's requests, computed one distinct params after another in a daemon thread
    started at once, so that the engine generates meanwhile. `get` waits for one answer."""

    def __init__(self, module_name: str, kwargs: dict[str, Any], model_path: str, dtype: str,
                 params: list[SamplingParams]):
        self._code = (module_name, kwargs, model_path, dtype)
        self._distinct = {p.model_dump_json(): p for p in params}
        self._answers: dict[str, Future] = {key: Future() for key in self._distinct}
        threading.Thread(target=self._compute, daemon=True, name="effective-params").start()

    def _compute(self) -> None:
        module_name, kwargs, model_path, dtype = self._code
        for key, params in self._distinct.items():
            self._answers[key].set_result(effective_for(module_name, kwargs, model_path, dtype, params))

    def get(self, params: SamplingParams) -> dict[str, Any]:
        return self._answers[params.model_dump_json()].result()
