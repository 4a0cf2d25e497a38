"""A vLLM engine whose LLM() raises leaves nothing behind: no close() follows a constructor that raised, so the
constructor itself removes the socket directory it made under /tmp (for a run directory too deep for a Unix
socket's 107 bytes)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from adapters.engines.vllm_offline import Engine
from harness import models
from harness.core.types import EngineSetup

pytestmark = pytest.mark.engines


def test_a_failed_load_removes_its_socket_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    saved = dict(os.environ)
    try:
        with pytest.raises(Exception, match="max_model_len"):
            Engine(setup)
    finally:  # the variables the engine set for vLLM, taken back for the tests after this one
        os.environ.clear()
        os.environ.update(saved)
    sockets = [p for p in made if p.name.startswith("parity-rpc-")]
    assert sockets and not any(p.exists() for p in sockets)
