"""The real-engine suite: the bundled models are prepared once per session (named models would be prepared on first
use anyway; doing it here keeps that time out of the first test's timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core.fork_server import ENV_VAR
from tests.helpers import ROOT


@pytest.fixture(scope="session", autouse=True)
def prepared_models() -> None:
    from harness import models

    models.prepare("smollm2-135m")
    models.prepare("tiny-llama")


@pytest.fixture(scope="session", autouse=True)
def fork_server(tmp_path_factory) -> Iterator[Path]:
    """Every `parity` command of the suite forks its engine workers, sampling-code runs and `python -m` servers from
    one process that imported torch, transformers and vLLM once (harness.core.fork_server), instead of each importing
    them again: 8-16 s of CPU less per HF or vLLM worker on 2 cores. test_forked_workers holds forked and spawned
    workers to the same results."""
    socket_path = tmp_path_factory.mktemp("fork-server") / "server.sock"
    server = subprocess.Popen([sys.executable, "-m", "harness.core.fork_server", str(socket_path)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert server.stdout.readline().startswith("fork server: ready"), "the fork server did not start"
    os.environ[ENV_VAR] = str(socket_path)
    yield socket_path
    del os.environ[ENV_VAR]
    server.terminate()
    server.wait(30)
