"""Compare each engine with the reference, per case, vectorised over all cases of a run.

Per (case, engine): first divergent step, chosen-token logprob |delta| over the steps both engines shared, and at the
divergence step the reference's top-2 margin and whether each side's token is in the other's top-k (the rule vLLM's
own tests use). Verdicts: match | benign_tie | diverged | engine_error. Knows nothing about engines.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.core.types import Result

PAD = -1


def _pad_ids(rows: list[list[int]], width: int) -> np.ndarray:
    out = np.full((len(rows), width), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _pad_float(rows: list[list[float]], width: int) -> np.ndarray:
    out = np.full((len(rows), width), np.nan)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _pad_top(rows: list[list[list[float]]], width: int, k: int, fill, dtype) -> np.ndarray:
    """[cases, steps, k] from per-case lists of per-step top-k lists; steps with fewer entries (a server's short
    list, an implied EOS with none) are padded."""
    out = np.full((len(rows), width, k), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if row and len({len(step) for step in row}) == 1:
            arr = np.asarray(row, dtype=dtype)[:, :k]
            out[i, : arr.shape[0], : arr.shape[1]] = arr
            continue
        for j, step in enumerate(row):  # ragged: rare, and short
            out[i, j, : len(step[:k])] = step[:k]
    return out


def compare(reference: list[Result], other: list[Result]) -> pd.DataFrame:
    """Rows aligned by position: reference[i] and other[i] are the same case. Verdicts are match or diverged;
    `tie_candidate` marks divergences where the engine took the reference's runner-up and the reference's token is
    in the engine's top-k: apply_ties() turns those within a margin into benign ties. The runner-up counts ties: a
    token the reference gives the runner-up's logprob is one, whatever its place in the list (bfloat16 logits come in
    steps of 1/8, and three tokens tied first are common)."""
    n = len(reference)
    ref_len = np.array([len(r.token_ids) for r in reference])
    oth_len = np.array([len(r.token_ids) for r in other])
    width = int(max(ref_len.max(initial=0), oth_len.max(initial=0))) + 1
    k = max([len(s) for r in reference + other for s in r.top_ids[:1]] + [1])
    ref_ids, oth_ids = _pad_ids([r.token_ids for r in reference], width), _pad_ids([r.token_ids for r in other], width)
    ref_lp = _pad_float([r.chosen_logprobs for r in reference], width)
    oth_lp = _pad_float([r.chosen_logprobs for r in other], width)
    ref_top_ids = _pad_top([r.top_ids for r in reference], width, k, PAD, np.int64)
    oth_top_ids = _pad_top([r.top_ids for r in other], width, k, PAD, np.int64)
    ref_top_lp = _pad_top([r.top_logprobs for r in reference], width, k, np.nan, np.float64)
    oth_top_lp = _pad_top([r.top_logprobs for r in other], width, k, np.nan, np.float64)

    mismatch = ref_ids != oth_ids
    diverged = mismatch.any(axis=1)
    first = np.where(diverged, mismatch.argmax(axis=1), -1)
    shared = np.arange(width)[None, :] < np.where(diverged, first, np.minimum(ref_len, oth_len))[:, None]
    delta = np.where(shared, np.abs(ref_lp - oth_lp), np.nan)
    known = ~np.isnan(delta)  # shared steps with a logprob on both sides (an implied EOS has none)
    counts = known.sum(axis=1)
    with np.errstate(all="ignore"):
        max_delta = np.where(counts > 0, np.where(known, delta, -np.inf).max(axis=1), np.nan)
        mean_delta = np.where(counts > 0, np.where(known, delta, 0.0).sum(axis=1) / counts, np.nan)

    rows = np.arange(n)
    step = np.maximum(first, 0)
    ref_tok, oth_tok = ref_ids[rows, step], oth_ids[rows, step]
    ref_top, oth_top = ref_top_ids[rows, step], oth_top_ids[rows, step]
    margin = ref_top_lp[rows, step, 0] - (ref_top_lp[rows, step, 1] if k > 1 else np.nan)
    oth_in_ref_top = (ref_top == oth_tok[:, None]).any(axis=1) & (oth_tok != PAD)
    ref_in_oth_top = (oth_top == ref_tok[:, None]).any(axis=1) & (ref_tok != PAD)
    at_oth = ref_top == oth_tok[:, None]
    oth_ref_lp = np.where(at_oth, ref_top_lp[rows, step], -np.inf).max(axis=1)  # -inf: not in the reference's top-k
    runner_up = oth_in_ref_top & (oth_ref_lp >= (ref_top_lp[rows, step, 1] if k > 1 else np.inf))
    # a divergence at the first step shares no step: the drift is read at that step instead, on the reference's token
    # where the engine's top-k holds it (else it stays unmeasured, NaN)
    ref_tok_lp = np.where(oth_top == ref_tok[:, None], oth_top_lp[rows, step], np.nan)
    with np.errstate(all="ignore"):
        at_step = np.abs(ref_lp[rows, step] - np.nanmax(np.where(np.isnan(ref_tok_lp), -np.inf, ref_tok_lp), axis=1))
    max_delta = np.where(diverged & (counts == 0) & np.isfinite(at_step), at_step, max_delta)
    verdict = np.where(diverged, "diverged", "match").astype(object)
    frame = pd.DataFrame({
        "case_id": [r.case_id for r in reference], "engine": [r.engine for r in other],
        "verdict": verdict, "first_divergence": first, "ref_len": ref_len, "engine_len": oth_len,
        "max_abs_logprob_delta": max_delta, "mean_abs_logprob_delta": mean_delta,
        "ref_token": np.where(diverged, ref_tok, PAD), "engine_token": np.where(diverged, oth_tok, PAD),
        "ref_top2_margin": np.where(diverged, margin, np.nan),
        "engine_token_ref_rank": np.where(diverged & oth_in_ref_top, at_oth.argmax(axis=1), -1),
        "engine_token_in_ref_topk": np.where(diverged, oth_in_ref_top, True),
        "ref_token_in_engine_topk": np.where(diverged, ref_in_oth_top, True),
        "tie_candidate": diverged & runner_up & ref_in_oth_top,
        "prompt_ids_equal": [r.prompt_ids == o.prompt_ids for r, o in zip(reference, other, strict=False)],
    })
    frame.loc[~frame["prompt_ids_equal"], "verdict"] = "diverged"
    return frame


def apply_ties(frame: pd.DataFrame, tie_margin: np.ndarray | float, drift_bound: np.ndarray | float = np.inf,
               checked: np.ndarray | bool = True) -> pd.DataFrame:
    """Divergences at a near-tie become benign_tie: the engine took the reference's runner-up (tie_candidate), the
    reference's top-2 margin is within tie_margin, the pair's drift on the steps it shares is within drift_bound
    (an engine drifting further is another computation), and the layer check found no component out of its floor
    (checked). Per row; the margin and bound used are kept in the frame."""
    frame = frame.assign(tie_margin=tie_margin, drift_bound=drift_bound)
    beyond = frame["max_abs_logprob_delta"].to_numpy(dtype=float) > frame["drift_bound"].to_numpy(dtype=float)
    benign = (frame["tie_candidate"] & (frame["ref_top2_margin"] <= frame["tie_margin"]) & ~beyond & checked
              & (frame["verdict"] == "diverged"))
    frame.loc[benign, "verdict"] = "benign_tie"
    return frame


def error_rows(reference: list[Result], other: list[Result]) -> pd.DataFrame:
    return pd.DataFrame({"case_id": [r.case_id for r in reference], "engine": [o.engine for o in other],
                         "verdict": "engine_error"})
