"""Effective params, computed once: an engine's own sampling code is asked what it makes of a request's params, and the
answer is cached on disk under $LLM_PARITY_CACHE/effective/. The key covers everything the answer depends on: the
sampling module's source, its keyword arguments, the engine distribution's version, the model's config and
generation_config.json, the dtype and the params. A warm cache spares a worker importing an engine package it does not
otherwise load (an `openai` engine in the vllm dialect would import vLLM for it). A cold one is filled off the
results' path: `InBackground` computes an engine run's answers from load, while the engine generates (in a thread, or
in a child process for a server's client), and workers that need the same answer at once (two engines with the same
sampling code) wait for the first one's, not compute it twice."""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.core.forked_process import run_module
from harness.core.vocabulary import SamplingParams

CHILD_TIMEOUT_S = 600  # a sampling-code process that answers nothing in this long is abandoned (a note)


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
    # the module's source, the shared helpers and Effective's fields, and the modules it declares its answers depend
    # on (SOURCES: the adapter's translation, beam-search knowledge): an edit to any is never answered from an old entry
    depends = ("adapters.sampling.common", "harness.core.types", *getattr(module, "SOURCES", ()))
    files = [Path(m.__file__) for m in (module, *map(importlib.import_module, depends))]
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


def _entry(module_name: str, kwargs: dict[str, Any], model_path: str, dtype: str,
           params: SamplingParams) -> tuple[Any, Path]:
    module = importlib.import_module(module_name)
    return module, _cache_dir() / f"{cache_key(module, kwargs, model_path, dtype, params)}.json"


def _not_computed(exc: BaseException | str) -> dict[str, Any]:
    what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return {"notes": [f"effective params not computed: {' '.join(what.split())[:400]}"]}


def cached(module_name: str, kwargs: dict[str, Any], model_path: str, dtype: str,
           params: SamplingParams) -> dict[str, Any] | None:
    """The cached answer, or None (also when the sampling module cannot be imported: the caller computes)."""
    try:
        path = _entry(module_name, kwargs, model_path, dtype, params)[1]
        return json.loads(path.read_text()) if path.exists() else None
    except Exception:  # unreadable entry or module: computing it again says what is wrong
        return None


def effective_for(module_name: str, kwargs: dict[str, Any], model_path: str, dtype: str,
                  params: SamplingParams) -> dict[str, Any]:
    """Effective.model_dump() for these params, from the cache or from the engine's code (then cached). Never
    raises: a failure is a note in the answer, since effective params are information, not a result."""
    try:
        module, path = _entry(module_name, kwargs, model_path, dtype, params)
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
        return _not_computed(exc)


class InBackground:
    """The effective params of an engine run's requests, computed in a daemon thread started at once, so that the engine
    generates meanwhile; `get` waits for one answer. `apart`: answers not in the cache are computed in a child
    process (`adapters.sampling.worker`), for a worker that has not loaded the engine package itself (a server's
    client): importing it in the worker's own thread would hold the interpreter lock its requests need."""

    def __init__(self, module_name: str, kwargs: dict[str, Any], model_path: str, dtype: str,
                 params: list[SamplingParams], apart: bool = False):
        self._code = (module_name, kwargs, model_path, dtype)
        self._distinct = {p.model_dump_json(): p for p in params}
        self._answers: dict[str, Future] = {key: Future() for key in self._distinct}
        compute = self._compute_apart if apart else self._compute
        threading.Thread(target=self._run, args=(compute,), daemon=True, name="effective-params").start()

    def _run(self, compute: Callable[[], None]) -> None:
        try:
            compute()
        except Exception as exc:  # never leave an answer unset: its result would wait for it forever
            for answer in self._answers.values():
                if not answer.done():
                    answer.set_result(_not_computed(exc))

    def _compute(self) -> None:
        for key, params in self._distinct.items():
            self._answers[key].set_result(effective_for(*self._code, params))

    def _compute_apart(self) -> None:
        missing = {}
        for key, params in self._distinct.items():
            answer = cached(*self._code, params)
            if answer is None:
                missing[key] = params
            else:
                self._answers[key].set_result(answer)
        if missing:
            for key, answer in self._in_child(missing).items():
                self._answers[key].set_result(answer)

    def _in_child(self, missing: dict[str, SamplingParams]) -> dict[str, dict[str, Any]]:
        module_name, kwargs, model_path, dtype = self._code
        job = {"task": "effective", "module": module_name, "kwargs": kwargs, "model_path": model_path, "dtype": dtype,
               "cached": True, "items": [{"case_id": key, "params": p.model_dump(mode="json")}
                                         for key, p in missing.items()]}
        proc = run_module(sys.executable, "adapters.sampling.worker", json.dumps(job), CHILD_TIMEOUT_S,
                          dict(os.environ), Path.cwd())
        try:
            items = {i["case_id"]: i["effective"] for i in json.loads(proc.stdout.splitlines()[-1])["items"]}
        except (IndexError, KeyError, TypeError, ValueError):  # a child that crashed or printed no answer
            tail = " | ".join(proc.stderr.splitlines()[-2:])
            return {key: _not_computed(f"the sampling code's process exited {proc.returncode}: {tail}")
                    for key in missing}
        return {key: items.get(key) or _not_computed("no answer for these params") for key in missing}

    def covers(self, params: Iterable[SamplingParams]) -> bool:
        return all(p.model_dump_json() in self._answers for p in params)

    def get(self, params: SamplingParams) -> dict[str, Any]:
        return self._answers[params.model_dump_json()].result()
