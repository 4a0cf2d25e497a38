"""Turn engine results into a verdict table: diff vs the reference, expectation check, and plain-words reasons."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from harness.diff import apply_ties, compare, error_rows, noise_margin
from harness.scenario import LoadedScenario
from harness.semantics import explain_differences, param_differences
from harness.effective import describe_differences, differing_fields
from harness.types import Effective, Result

Decode = Callable[[int], str]

COLUMNS = ["case_id", "engine", "reference", "verdict", "expected", "first_divergence", "ref_len", "engine_len",
           "max_abs_logprob_delta", "mean_abs_logprob_delta", "ref_token", "engine_token", "ref_top2_margin",
           "engine_token_in_ref_topk", "ref_token_in_engine_topk", "explanation"]


def _result_or_missing(results: dict[tuple[str, str], Result], engine: str, case_id: str) -> Result:
    return results.get((engine, case_id)) or Result.engine_error(case_id, engine, "not run: the run was interrupted")


def judge(scenario: LoadedScenario, results: dict[tuple[str, str], Result], decode: Decode) -> pd.DataFrame:
    spec, ref_name = scenario.spec, scenario.spec.reference
    frames = []
    for engine in spec.engines:
        if engine == ref_name:
            continue
        refs = [_result_or_missing(results, ref_name, c.case_id) for c in scenario.cases]
        others = [_result_or_missing(results, engine, c.case_id) for c in scenario.cases]
        ok = np.array([r.status == "ok" and o.status == "ok" for r, o in zip(refs, others)], dtype=bool)
        expectation = spec.engine_expectation(engine)
        parts = []
        tie_margin = expectation.tie_margin or 0.0
        if ok.any():
            pick = np.flatnonzero(ok)
            compared = compare([refs[i] for i in pick], [others[i] for i in pick])
            if expectation.tie_margin is None:
                tie_margin = noise_margin(compared)
            parts.append(apply_ties(compared, tie_margin))
        if (~ok).any():
            pick = np.flatnonzero(~ok)
            parts.append(error_rows([refs[i] for i in pick], [others[i] for i in pick]))
        frame = pd.concat(parts, ignore_index=True).set_index("case_id").loc[[c.case_id for c in scenario.cases]]
        frame = frame.reset_index()
        frame["reference"] = ref_name
        frame["expected"] = _expected(frame, expectation)
        frame["explanation"] = [
            _explain(row, refs[i], others[i], case.engine_params[ref_name], case.engine_params[engine], decode,
                     tie_margin)
            for i, (case, row) in enumerate(zip(scenario.cases, frame.itertuples()))]
        frames.append(frame)
    if not frames:  # only the reference ran (parity transplant): nothing to compare
        return pd.DataFrame(columns=COLUMNS)
    table = pd.concat(frames, ignore_index=True)
    return table.reindex(columns=COLUMNS)


def _expected(frame: pd.DataFrame, expectation) -> pd.Series:
    allowed = {"exact": {"match"}, "benign_ties": {"match", "benign_tie"},
               "any": {"match", "benign_tie", "diverged"}}[expectation.tokens]
    ok = frame["verdict"].isin(allowed)
    if expectation.max_logprob_delta is not None and "max_abs_logprob_delta" in frame:
        ok &= ~(frame["max_abs_logprob_delta"] > expectation.max_logprob_delta)
    return ok


def effective_note(ref: Result, other: Result, already_given: set[str]) -> str:
    """The effective params (each engine's own code) that differ between the two engines beyond the params they
    were given differently, if both are known: generation_config.json defaults, clamps, greedy rewrites."""
    if not ref.effective.get("decoding") or not other.effective.get("decoding"):
        return ""
    by_engine = {ref.engine: Effective.from_json(ref.effective), other.engine: Effective.from_json(other.effective)}
    differences = describe_differences(by_engine, [f for f in differing_fields(by_engine) if f not in already_given])
    return f"the engines' own code applies different effective params ({differences})" if differences else ""


def _token(decode: Decode, token: int) -> str:
    return "(end)" if token < 0 else repr(decode(int(token)))


def _explain(row, ref: Result, other: Result, ref_params, other_params, decode: Decode, tie_margin: float) -> str:
    if row.verdict == "engine_error":
        failed = [r for r in (ref, other) if r.status != "ok"]
        return "; ".join(f"{r.engine}: {r.error}" for r in failed)
    if not row.prompt_ids_equal:
        return "prompt token ids differ between engines: a tokenisation or chat-template difference"
    notes = [f"{r.engine}: {w}" for r in (ref, other) for w in r.warnings if "NOT APPLIED" in w]
    if row.verdict == "match":
        text = f"identical {row.ref_len} tokens"
    elif row.verdict == "benign_tie":
        text = (f"diverged at step {row.first_divergence} on a near-tie: reference top-2 margin "
                f"{row.ref_top2_margin:.3g} <= tie margin {tie_margin:.3g} nats; each side's token is in the other's top-k")
    else:
        text = (f"diverged at step {row.first_divergence}: reference chose {_token(decode, row.ref_token)} "
                f"(top-2 margin {row.ref_top2_margin:.3g}), {other.engine} chose {_token(decode, row.engine_token)} "
                f"({'in' if row.engine_token_in_ref_topk else 'not in'} the reference's top-k)")
        given = param_differences(ref_params, other_params)
        cause = explain_differences(given)
        if cause:
            text += f"; {cause}"
        engine_side = effective_note(ref, other, set(given))
        if engine_side:
            text += f"; {engine_side}"
    return "; ".join([text] + notes)
