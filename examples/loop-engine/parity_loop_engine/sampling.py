"""The loop engine's sampling code, for `parity params`: what it really does with a request's params. It is the
engine's own translate(), so the table can never disagree with what the engine runs."""

from __future__ import annotations

from pathlib import Path

from harness.core.types import Effective
from harness.core.vocabulary import SamplingParams

DISTRIBUTIONS = ("transformers",)


def effective(model_path: Path, params: SamplingParams, dtype: str) -> Effective:
    from parity_loop_engine import translate

    native = translate(params).native_params
    return Effective(decoding="greedy", repetition_penalty=1.0, repetition_scope="none", frequency_penalty=0.0,
                     presence_penalty=0.0, max_new_tokens=native["max_new_tokens"],
                     min_new_tokens=native["min_new_tokens"], logits_dtype="float32",
                     processors=["log_softmax in float32", "argmax"],
                     notes=[w for w in translate(params).warnings if "NOT APPLIED" in w])
