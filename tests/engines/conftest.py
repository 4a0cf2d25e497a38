"""The real-engine suite: the bundled models are prepared once per session (named models would be prepared on first
use anyway; doing it here keeps that time out of the first test's timeout)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def prepared_models() -> None:
    from harness import models

    models.prepare("smollm2-135m")
    models.prepare("tiny-llama")
