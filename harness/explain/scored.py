"""An untraced engine's teacher-forced logprobs (a server's echo or prompt logprobs: adapters' score()) held against
the reference's on the same ids: the log-softmax of the reference's traced logits at the positions that predict the
reference's generated tokens."""

from __future__ import annotations

import numpy as np

from harness.core.numeric import log_softmax
from harness.core.types import Result
from harness.rundir.traces import Trace, row_chunks


def against_reference(scored: Result, reference: Trace) -> str:
    """How far the engine's teacher-forced logprob of each generated token is from the reference's, in words ('' where
    either side has none to compare)."""
    if scored.status != "ok" or "logits" not in reference.tensors:
        return ""
    tokens = [*scored.prompt_ids, *scored.token_ids]
    first, end = reference.span("logits")
    positions = list(range(len(scored.prompt_ids) - 1, len(tokens) - 1))
    if not positions or positions[0] < first or positions[-1] >= end:
        return ""
    theirs = np.asarray(scored.chosen_logprobs, dtype=np.float64)
    ours = np.empty(len(positions))
    for start, stop in row_chunks(len(positions), reference.shape("logits")[1]):
        rows = log_softmax(reference.rows("logits", positions[start], positions[stop - 1] + 1))
        ours[start:stop] = rows[np.arange(stop - start), tokens[positions[start] + 1:positions[stop - 1] + 2]]
    gaps = np.abs(theirs - ours)
    if not np.isfinite(gaps).any():
        return ""
    worst = int(np.nanargmax(gaps))
    return (f"its teacher-forced logprobs of the reference's {len(positions)} tokens are within {gaps[worst]:.3g} of "
            f"the reference's (largest at step {worst})")
