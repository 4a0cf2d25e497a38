"""The vLLM engine's load, in this process: what it leaves behind when LLM() raises, and what it spares a fresh
machine."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.engines.vllm_offline import Engine
from harness import models
from harness.core.types import EngineSetup

pytestmark = pytest.mark.engines


@contextmanager
def environment_kept() -> Iterator[None]:
    """The variables the engine sets for vLLM, taken back for the tests after this one."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_a_failed_load_removes_its_socket_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No close() follows a constructor that raised, so the constructor itself removes the socket directory it made
    under /tmp (for a run directory too deep for a Unix socket's 107 bytes)."""
    made: list[Path] = []
    mkdtemp = tempfile.mkdtemp

    def recorded(*args, **kwargs) -> str:
        made.append(Path(mkdtemp(*args, **kwargs)))
        return str(made[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", recorded)
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)  # vLLM may ask for it while TMPDIR is the run's
    workdir = tmp_path / ("a-run-directory-too-deep-for-a-socket-" * 2)
    setup = EngineSetup(name="v", model_path=models.resolve("tiny-llama", "float32"), dtype="float32",
                        options={"max_model_len": 1_000_000}, workdir=workdir)  # the model holds 1,024 positions
    with environment_kept(), pytest.raises(Exception, match="max_model_len"):
        Engine(setup)
    sockets = [p for p in made if p.name.startswith("parity-rpc-")]
    assert sockets and not any(p.exists() for p in sockets)


def test_a_new_architecture_is_inspected_without_a_second_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM inspects a model class it has not cached in a subprocess that imports vLLM again (30 s of CPU on this
    machine, per architecture, on every fresh machine); the engine inspects it in its own process, and vLLM still
    caches what it found."""
    from vllm.model_executor.models import registry

    model_path = models.resolve("tiny-llama", "float32")
    registry._try_inspect_model_cls.cache_clear()  # what an earlier test of this process inspected
    monkeypatch.setenv("LLM_PARITY_CACHE", str(tmp_path / "fresh"))  # vLLM's cache under it starts empty
    commands: list[list[str]] = []
    run = subprocess.run

    def recorded(command: list[str], *args, **kwargs) -> subprocess.CompletedProcess:
        commands.append(list(command))
        return run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recorded)
    with environment_kept():
        Engine(EngineSetup(name="v", model_path=model_path, dtype="float32", workdir=tmp_path / "run")).close()
    assert not [c for c in commands if "vllm.model_executor.models.registry" in c], commands
    cached = tmp_path / "fresh/compile/vllm/modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json"
    assert cached.exists(), "vLLM did not cache the inspected model class"
