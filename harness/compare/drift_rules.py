"""Quantisation drift: how far a quantised engine's next-token distributions are from a full-precision baseline's
on the same text, measured as llama.cpp's `perplexity --kl-divergence` measures it (tools/perplexity/perplexity.cpp):

  per token, with P the baseline's distribution, Q the quantised engine's and t the text's next token
    KLD      sum_v P(v) (log P(v) - log Q(v))
    same top argmax P == argmax Q
    delta p  Q(t) - P(t)
    nll      -log Q(t) (and -log P(t) for the baseline)
  per text: mean, median, p99 and max KLD; top-1 agreement (share of same-top tokens); mean and RMS delta p;
  PPL(Q) = exp(mean nll), PPL(base), and ln(PPL(Q)/PPL(base)).

Percentiles interpolate linearly between ranks, as llama.cpp's do. llama.cpp stores the baseline's log-probabilities
as 16-bit integers and skips tokens below log P = -16; here both sides are exact float64, so values agree with its
report to that rounding. Knows nothing about engines: only logits and token ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from harness.core.numeric import log_softmax


@dataclass(frozen=True)
class TokenDrift:
    """Per scored token (one row per position that predicts a token of the text)."""

    kld: np.ndarray
    same_top: np.ndarray
    delta_p: np.ndarray
    nll: np.ndarray
    nll_base: np.ndarray


def token_drift(base_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> TokenDrift:
    """base_logits, logits: [n, vocab] raw logits of the baseline and the measured engine at the same n positions;
    targets: [n] the token that follows each position in the text."""
    if base_logits.shape != logits.shape:
        raise ValueError(f"logits shapes differ: {base_logits.shape} (baseline) vs {logits.shape}")
    base, other = log_softmax(base_logits), log_softmax(logits)
    rows = np.arange(len(targets))
    p_base = np.exp(base)
    kld = (p_base * (base - other)).sum(axis=-1)
    base_t, other_t = base[rows, targets], other[rows, targets]
    return TokenDrift(kld=np.maximum(kld, 0.0), same_top=base.argmax(axis=-1) == other.argmax(axis=-1),
                      delta_p=np.exp(other_t) - np.exp(base_t), nll=-other_t, nll_base=-base_t)


def concat(parts: list[TokenDrift]) -> TokenDrift:
    """Token drift of consecutive chunks of positions, joined in order."""
    return TokenDrift(*(np.concatenate([getattr(p, f) for p in parts]) for f in TokenDrift.__dataclass_fields__))


@dataclass(frozen=True)
class DriftStats:
    tokens: int
    mean_kld: float
    median_kld: float
    p99_kld: float
    max_kld: float
    top1_agreement: float  # share of tokens whose argmax is the same in both
    mean_delta_p: float
    rms_delta_p: float
    ppl: float
    ppl_base: float
    ln_ppl_ratio: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(drift: TokenDrift) -> DriftStats:
    kld = drift.kld
    return DriftStats(
        tokens=int(len(kld)), mean_kld=float(kld.mean()), median_kld=float(np.median(kld)),
        p99_kld=float(np.percentile(kld, 99.0)), max_kld=float(kld.max()),
        top1_agreement=float(drift.same_top.mean()), mean_delta_p=float(drift.delta_p.mean()),
        rms_delta_p=float(np.sqrt((drift.delta_p ** 2).mean())),
        ppl=float(np.exp(drift.nll.mean())), ppl_base=float(np.exp(drift.nll_base.mean())),
        ln_ppl_ratio=float(drift.nll.mean() - drift.nll_base.mean()))


# (threshold field, stats field, bound kind, how the measure reads in an explanation)
CHECKS = (
    ("max_mean_kld", "mean_kld", "max", "mean KLD"),
    ("max_p99_kld", "p99_kld", "max", "p99 KLD"),
    ("min_top1_agreement", "top1_agreement", "min", "top-1 agreement"),
    ("max_rms_delta_p", "rms_delta_p", "max", "RMS delta p"),
    ("max_ln_ppl_ratio", "ln_ppl_ratio", "max", "ln(PPL(Q)/PPL(base))"),
)


def judge(stats: DriftStats, thresholds: dict[str, float | None], engine: str, baseline: str) -> tuple[bool, str]:
    """Whether the drift stays within the scenario's thresholds (unset ones are not checked), and the reason in
    words: every measure, and for each threshold crossed by how much."""
    failed = []
    for key, field, kind, label in CHECKS:
        bound = thresholds.get(key)
        value = getattr(stats, field)
        if bound is None:
            continue
        if (kind == "max" and value > bound) or (kind == "min" and value < bound):
            failed.append(f"{label} {value:.3g} {'>' if kind == 'max' else '<'} {bound:g}")
    measured = (f"{engine} vs {baseline} over {stats.tokens} tokens: mean KLD {stats.mean_kld:.3g}, p99 KLD "
                f"{stats.p99_kld:.3g}, max KLD {stats.max_kld:.3g}, top-1 agreement {stats.top1_agreement:.1%}, "
                f"mean delta p {stats.mean_delta_p:+.3g}, RMS delta p {stats.rms_delta_p:.3g}, PPL {stats.ppl:.4g} vs "
                f"{stats.ppl_base:.4g} (ln ratio {stats.ln_ppl_ratio:+.3g})")
    if failed:
        return False, f"quantisation drift beyond the scenario's thresholds ({'; '.join(failed)}): {measured}"
    return True, f"quantisation drift within the scenario's thresholds: {measured}"
