"""A sampling-code module for tests/unit/test_effective_cache.py: the generic dialect's answer, slowly, with each
computation recorded in $COUNT_FILE, so a test can see how many times an answer was computed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from adapters.sampling import dialect
from harness.core.types import Effective
from harness.core.vocabulary import SamplingParams

DISTRIBUTIONS = ()


def effective(model_path: Path, params: SamplingParams, dtype: str) -> Effective:
    with open(os.environ["COUNT_FILE"], "a") as count:
        count.write("computed\n")
    time.sleep(1.0)
    return dialect.effective(model_path, params, dtype)
