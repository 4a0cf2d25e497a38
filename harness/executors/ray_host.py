"""The node side of the Ray executor: one actor per engine worker, living on whichever node Ray placed it.

The actor prepares the scenario's model from that node's own cache (LLM_PARITY_CACHE there; a named model is built from
installed packages, never downloaded) or reads a path the scenario marked as shared, starts the ordinary worker process
(harness.executors.worker_main, in the engine's interpreter) in a scratch folder of the node (LLM_PARITY_SCRATCH there),
and relays the worker protocol. It opens no path of the driver's: the driver sends what the worker needs (the load
message, the scenario folder's Python modules) and fetches what the worker wrote (traces, its log) in chunks. A server
the worker starts runs on this node, bound to 127.0.0.1 unless the scenario says otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from harness.core.paths import PROJECT_ROOT
from harness.executors.local_process import WorkerGone, WorkerHandle, WorkerTimeout

SCRATCH_ENV = "LLM_PARITY_SCRATCH"
GONE, TIMEOUT = "__gone__", "__timeout__"  # receive()'s events for a dead worker and for no answer in time


def parity_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("llm-parity")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def scratch_root() -> Path:
    return Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / "llm-parity-ray")


def node_model(model: str, dtype: str, shared: bool) -> Path:
    """The scenario's model on this node: a named model from this node's cache (prepared once: preparing takes a
    lock, so two actors on one node do not build it twice), or a path every node mounts."""
    from harness.models.catalog import MODELS, resolve

    if model in MODELS:
        return resolve(model, dtype, "scenario")
    if not shared:
        raise RuntimeError(f"model: {model} is a path of the driver's machine: on a Ray cluster put it on storage "
                           "every node mounts and set model_shared: true in the scenario, or use a named model")
    path = Path(model).expanduser()
    if not (path / "config.json").exists():
        raise RuntimeError(f"model: {model} (model_shared) has no config.json on node {socket.gethostname()}: mount "
                           "it there")
    return path


class EngineHost:
    """Constructed by Ray on a node; every method runs there. Calls arrive one at a time (a plain actor)."""

    def __init__(self, name: str, python: str | None, threads: int, modules: dict[str, str], run_id: str):
        self.name, self.threads = name, threads
        self.python = python or sys.executable
        self.folder = scratch_root() / f"{run_id}-{name}-{uuid.uuid4().hex[:8]}"
        self.workdir = self.folder / "engine"
        self.workdir.mkdir(parents=True)
        imports = self.folder / "imports"
        imports.mkdir()
        for filename, source in modules.items():  # the scenario folder's modules (model patches)
            (imports / filename).write_text(source)
        self.import_paths = [str(imports)] if modules else []
        self.model_path: Path | None = None
        self.worker: WorkerHandle | None = None

    def describe(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "actor_pid": os.getpid(), "version": parity_version(), "project": str(PROJECT_ROOT),
                "scratch": str(self.folder)}

    def prepare_model(self, model: str, dtype: str, shared: bool) -> str:
        self.model_path = node_model(model, dtype, shared)
        return str(self.model_path)

    def start_worker(self) -> tuple[int, float]:
        """The worker's pid, and when it was spawned by this node's monotonic clock."""
        if not os.path.exists(self.python):
            raise RuntimeError(f"python: {self.python} does not exist on node {socket.gethostname()}: build the "
                               "engine's environment there (parity env create) or give a path that exists on every "
                               "node")
        self.worker = WorkerHandle(self.name, self.python, self.threads, self.workdir / "worker.log",
                                   self.import_paths)
        self.worker.start()
        return self.worker.pid, self.worker.spawned_at

    def send(self, message: dict[str, Any]) -> str | None:
        """Relay one message; the load message's paths become this node's. Returns why the worker is gone, if it
        is."""
        if message.get("op") == "load":
            setup = {**message["setup"], "model_path": str(self.model_path), "workdir": str(self.workdir)}
            message = {**message, "setup": setup}
        try:
            self.worker.send(message)
        except WorkerGone as exc:
            return str(exc)
        return None

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            return self.worker.receive(timeout)
        except WorkerGone as exc:
            return {"event": GONE, "error": str(exc)}
        except WorkerTimeout as exc:
            return {"event": TIMEOUT, "error": str(exc)}

    def read(self, path: str, offset: int, size: int) -> bytes:
        """A piece of a file the worker wrote (a trace, its log), for the driver to copy in chunks."""
        full = Path(path)
        if self.folder not in full.parents:
            raise RuntimeError(f"{path} is not in this actor's scratch folder")
        with open(full, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def stop(self, grace: float) -> None:
        if self.worker is not None:
            self.worker.stop(grace)

    def kill_worker(self) -> None:
        if self.worker is not None:
            self.worker.kill()

    def cleanup(self) -> None:
        """Remove the scratch folder once the driver has what it needs from it."""
        shutil.rmtree(self.folder, ignore_errors=True)
