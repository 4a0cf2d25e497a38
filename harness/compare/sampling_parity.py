"""Sampling parity: with do_sample tokens cannot be compared one by one, so each engine's seeded samples of the
first tokens are compared with the reference's as frequencies. For each prefix length s (the first s tokens of each
sample), a G-test (likelihood-ratio chi-square test of homogeneity) on the 2 x K table of prefix counts, categories
with an expected count under 5 pooled into one. A case fails when any p-value is under alpha / steps, and is
undetermined (and fails: the check could not see) where every prefix of some length is that rare."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd

from harness.compare.token_rules import COLUMNS
from harness.core.types import Result
from harness.scenario.spec import LoadedScenario
from harness.semantics.meaning import explain_differences, param_differences

END = -1  # a sample that ended (EOS) before the prefix length


def prefixes(samples: list[list[int]], length: int) -> Counter:
    return Counter(tuple((s + [END] * length)[:length]) for s in samples)


def g_test(ref: Counter, other: Counter) -> dict:
    """G statistic, degrees of freedom, p-value, and the category whose share differs most. p is None where the test
    is undetermined: every category is rarer than 5 expected samples, so pooling leaves one column and nothing to
    compare (more samples, or fewer steps, would decide it); a p-value of 1 there would read as a match."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(ref) | set(other), key=lambda k: -(ref[k] + other[k]))
    table = np.array([[ref[k] for k in keys], [other[k] for k in keys]], dtype=float)
    totals = table.sum(axis=1, keepdims=True)
    expected = totals * table.sum(axis=0, keepdims=True) / totals.sum()
    small = (expected < 5).any(axis=0)
    if small.all() and len(keys) > 1:
        return {"categories": len(keys), "worst": None, "ref_share": 1.0, "engine_share": 1.0, "g": math.nan,
                "dof": 0, "p": None}
    if small.any():  # pool rare categories, as the test's approximation needs
        table = np.concatenate([table[:, ~small], table[:, small].sum(axis=1, keepdims=True)], axis=1)
        keys = [k for k, s in zip(keys, small, strict=False) if not s] + [None]
    shares = table / totals
    worst = int(np.abs(shares[0] - shares[1]).argmax())
    result = {"categories": table.shape[1], "worst": keys[worst], "ref_share": float(shares[0, worst]),
              "engine_share": float(shares[1, worst])}
    if table.shape[1] < 2:  # one prefix, common on both sides: both engines drew the same certain tokens
        return {**result, "g": 0.0, "dof": 0, "p": 1.0}
    g, p, dof, _ = chi2_contingency(table, correction=False, lambda_="log-likelihood")
    return {**result, "g": float(g), "dof": int(dof), "p": float(p)}


def described(test: dict) -> str:
    """One G-test in words: its statistic, or why it is undetermined."""
    if test["p"] is None:
        return (f"undetermined ({test['categories']} prefixes, each rarer than 5 expected samples: pooled into one "
                "category, nothing to compare)")
    return f"G={test['g']:.3g}, dof {test['dof']}, p={test['p']:.3g}"


def _label(key, decode: Callable[[int], str]) -> str:
    if key is None:
        return "(rare prefixes, pooled)"
    return repr("".join("<end>" if t == END else decode(t) for t in key))


def judge_samples(scenario: LoadedScenario, results: dict[tuple[str, str], Result],
                  decode: Callable[[int], str]) -> pd.DataFrame:
    spec, ref = scenario.spec, scenario.spec.reference
    check = spec.sampling
    rows = []
    for engine in spec.engines:
        if engine == ref:
            continue
        for case in scenario.cases:
            a, b = results.get((ref, case.case_id)), results.get((engine, case.case_id))
            row = {"case_id": case.case_id, "engine": engine, "reference": ref, "first_divergence": -1}
            failed = [r for r in (a, b) if r is None or r.status != "ok" or not r.samples]
            if failed:
                why = "; ".join(f"{r.engine}: {r.error or 'no samples'}" if r else "not run" for r in failed)
                rows.append({**row, "verdict": "engine_error", "expected": False, "explanation": why})
                continue
            tests = [g_test(prefixes(a.samples, s), prefixes(b.samples, s)) for s in range(1, check.steps + 1)]
            threshold = check.alpha / check.steps
            bad = [s for s, t in enumerate(tests) if t["p"] is not None and t["p"] < threshold]
            undetermined = [s for s, t in enumerate(tests) if t["p"] is None]
            stats = "; ".join(f"first {s + 1} token(s): {described(t)}" for s, t in enumerate(tests))
            counts = f"{len(a.samples)} vs {len(b.samples)} samples"
            if not bad and undetermined:
                rows.append({**row, "verdict": "undetermined", "expected": False, "explanation": (
                    f"sampling distributions undetermined in the first {undetermined[0] + 1} token(s) ({counts}): "
                    f"draw more samples or test fewer steps (sampling: samples, steps); {stats}")})
                continue
            if not bad:
                rows.append({**row, "verdict": "match", "expected": True, "explanation": (
                    f"sampling distributions agree ({counts}; G-test, alpha {check.alpha:g}): {stats}")})
                continue
            t = tests[bad[0]]
            text = (f"sampling distributions differ in the first {bad[0] + 1} token(s): p={t['p']:.3g} < "
                    f"{threshold:.3g} (alpha {check.alpha:g} / {check.steps} steps; {counts}); the share of "
                    f"{_label(t['worst'], decode)} is {t['ref_share']:.1%} for {ref} and {t['engine_share']:.1%} "
                    f"for {engine}; {stats}")
            cause = explain_differences(param_differences(case.engine_params[ref], case.engine_params[engine]))
            rows.append({**row, "verdict": "diverged", "expected": spec.engine_expectation(engine).tokens == "any",
                         "first_divergence": bad[0], "explanation": text + (f"; {cause}" if cause else "")})
    return pd.DataFrame(rows).reindex(columns=COLUMNS) if rows else pd.DataFrame(columns=COLUMNS)
