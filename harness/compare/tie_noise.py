"""What a near-tie is judged against: noise measured apart from the pair being judged.

The noise of a case is the reference against itself: its own generation (its dtype, its KV cache) against a scoring
pass of the same tokens in higher precision on the same weights (the run's noise pass, harness.run.tie_checks). At
every step it generated, the gap between any two of its top-k tokens moves by some amount between the two; the case's
margin noise is the largest such move, its chosen noise the largest move of the chosen token's logprob. Two engines
that each round like the reference can reorder two tokens whose gap is within twice the margin noise, and can drift
apart on the tokens they share by twice the chosen noise: the tie margin and the drift bound. An engine whose drift
on shared tokens goes beyond the bound is another computation, not rounding (a model without its adapter: 1.3 nats
against 1e-5 in float32), and none of its divergences is a near-tie.

A near-tie within those bounds is then checked layer by layer where both engines can be traced (LayerCheck): a
component that leaves its noise floor makes the divergence a real one, whatever the margin.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from harness.core.points import in_words
from harness.core.types import Result

BAND = 2.0  # two engines, each rounding like the reference


@dataclass(frozen=True)
class CaseNoise:
    margin: float  # the largest move of a gap between two of the reference's top-k tokens, over its steps
    chosen: float  # the largest move of the reference's chosen-token logprob
    steps: int  # the steps measured
    dtype: str  # the reference's dtype
    high: str  # the dtype of the scoring pass

    @property
    def tie_margin(self) -> float:
        return BAND * self.margin

    @property
    def drift_bound(self) -> float:
        return BAND * self.chosen

    def words(self, drift: bool = False) -> str:
        """Where a tie margin (or, drift: a drift bound) came from."""
        moved = (f"its chosen tokens' logprobs move by up to {self.chosen:.3g}" if drift else
                 f"its top-k margins move by up to {self.margin:.3g} nats")
        return (f"twice the reference's own rounding noise on this case: {moved} between {self.dtype} and "
                f"{self.high} on its own {self.steps} tokens")


@dataclass(frozen=True)
class LayerCheck:
    """A near-tie's forced per-layer comparison (harness.compare.floors.judge_pass): clean, or the first point out of
    its floor; or why it could not run."""

    clean: bool
    point: str = ""
    component: str = ""
    ratio: float = float("nan")
    k: float = float("nan")
    sensitivity: float = float("nan")  # the largest threshold (relative L2): "none above"
    unchecked: str = ""  # why no layer check (an engine that cannot be traced, a failed pass)

    def words(self) -> str:
        if self.unchecked and self.clean:
            return f"not checked layer by layer ({self.unchecked})"
        if self.unchecked:
            return f"not a near-tie as far as can be told: its layer check could not run ({self.unchecked})"
        if self.clean:
            return (f"layer by layer (each layer from the reference's input) no component leaves its noise floor, "
                    f"none above {100 * self.sensitivity:.3g}%")
        return (f"not a near-tie: {in_words(self.point)} leaves its noise floor at {self.ratio:.3g}x it (threshold "
                f"{self.k:g}x; {self.component}), each layer started from the reference's input (`parity explain` "
                "says more)")


@dataclass
class TieEvidence:
    """What the token verdicts read near-ties with: each measured case's noise, each near-tie's layer check."""

    noise: dict[str, CaseNoise] = field(default_factory=dict)
    layers: dict[tuple[str, str], LayerCheck] = field(default_factory=dict)  # (engine, case)
    unmeasured: str = ""  # why no case's noise was measured, where none was

    def as_json(self) -> dict:
        """near_ties.json's content: the noise per case, the layer checks per engine and case."""
        return {"unmeasured": self.unmeasured, "noise": {case: asdict(n) for case, n in self.noise.items()},
                "layer_checks": [{"engine": engine, "case_id": case, **asdict(check)}
                                 for (engine, case), check in self.layers.items()]}


def measure(result: Result, logits: np.ndarray, dtype: str, high: str) -> CaseNoise:
    """A case's noise from the reference's generation (its top-k raw logprobs per step) and the higher-precision
    logits of the same tokens ([steps, vocab]: row s scores step s)."""
    steps = min(len(result.top_ids), len(result.chosen_logprobs), len(result.token_ids), len(logits))
    if steps == 0:
        return CaseNoise(0.0, 0.0, 0, dtype, high)
    rows = logits[:steps].astype(np.float64)
    rows = rows - rows.max(axis=1, keepdims=True)
    high_lp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    margins, chosen = [], []
    for step in range(steps):  # step by step: a step's top-k may be short (an implied EOS) or hold -inf
        own = np.array(result.top_logprobs[step], dtype=np.float64)
        moved = own - high_lp[step, np.array(result.top_ids[step], dtype=np.int64)]
        moved = moved[np.isfinite(moved)]
        if len(moved) > 1:
            margins.append(moved.max() - moved.min())
        drift = abs(result.chosen_logprobs[step] - high_lp[step, result.token_ids[step]])
        if np.isfinite(drift):
            chosen.append(drift)
    return CaseNoise(float(max(margins, default=0.0)), float(max(chosen, default=0.0)), steps, dtype, high)


def tie_bounds(case_ids, evidence: TieEvidence, scenario_margin: float | None,
               scenario_drift: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per case: the tie margin (the scenario's `tie_margin`, else twice the measured margin noise; 0 where none was
    measured: only exact ties) and the drift bound (twice the measured chosen-token noise; where unmeasured the
    scenario's max_logprob_delta, else none)."""
    noise = [evidence.noise.get(case) for case in case_ids]
    margins = np.array([scenario_margin if scenario_margin is not None else n.tie_margin if n else 0.0
                        for n in noise], dtype=float)
    unmeasured = np.inf if scenario_drift is None else scenario_drift
    bounds = np.array([n.drift_bound if n else unmeasured for n in noise], dtype=float)
    return margins, bounds


def margin_words(case_id: str, evidence: TieEvidence, scenario_margin: float | None, drift: bool = False) -> str:
    """Where a case's tie margin (drift: its drift bound) came from, in words."""
    if scenario_margin is not None and not drift:
        return "the scenario's tie_margin"
    noise = evidence.noise.get(case_id)
    if noise is not None:
        return noise.words(drift)
    return evidence.unmeasured or "no noise measured for this case: only exact ties"
