"""Quantisation drift verdicts (drift.parquet): each case's text (its baseline's prompt and generated tokens),
teacher-forced through the engine and its full-precision baseline (harness.run.drift_passes), compared position by
position with llama.cpp's perplexity --kl-divergence measures (harness.compare.drift_rules). Per case and engine: the
measures, the thresholds' verdict and its explanation; per scored token, in drift_tokens.parquet: KLD, delta p, same
top-1 (the report's distribution plot)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.compare import drift_rules
from harness.core.types import Result, TraceResult
from harness.render import markdown
from harness.render.console import print_table
from harness.render.html_parts import esc, expected_table, svg_plot
from harness.render.page import Page
from harness.rundir.tables import read_parquet
from harness.rundir.traces import Trace, row_chunks
from harness.scenario.spec import LoadedScenario
from harness.verdicts.family import Judged, Judging, VerdictFamily

STATS = list(drift_rules.DriftStats.__dataclass_fields__)
COLUMNS = {"case_id": "str", "engine": "str", "against": "str", "weights": "str", "status": "str", "expected": "bool",
           **{name: "float?" for name in STATS}, "explanation": "str"}
TOKENS_TABLE = "drift_tokens.parquet"
TOKEN_COLUMNS = {"case_id": "str", "engine": "str", "position": "int", "kld": "float", "delta_p": "float",
                 "same_top": "bool"}
HEADERS = ["case", "engine", "against", "weights", "ok", "mean KLD", "p99 KLD", "top-1 agreement", "RMS delta p",
           "PPL (base)", "explanation"]
INTRO = ("Each case's text (the baseline's prompt and generated tokens) teacher-forced through the engine and its "
         "full-precision baseline; per token the KL divergence of the engine's next-token distribution from the "
         "baseline's, whether both rank the same token first, and delta p of the text's token (llama.cpp's "
         "perplexity --kl-divergence measures; per token in drift_tokens.parquet).")


def drift_rows(drift: pd.DataFrame) -> list[list[str]]:
    return [[r.case_id, r.engine, r.against, r.weights, markdown.yes_no(r.expected), markdown.num(r.mean_kld, ".3g"),
             markdown.num(r.p99_kld, ".3g"), "" if r.status != "ok" else f"{r.top1_agreement:.1%}",
             markdown.num(r.rms_delta_p, ".3g"), "" if r.status != "ok" else f"{r.ppl:.4g} ({r.ppl_base:.4g})",
             r.explanation] for r in drift.itertuples()]


def measured(scenario: LoadedScenario) -> dict[str, str]:
    """engine -> its baseline, for the engines of this run with a drift verdict."""
    spec = scenario.spec
    return {name: spec.drift_baseline(name) for name in spec.engines if spec.drift_baseline(name) in spec.engines}


class DriftVerdicts(VerdictFamily):
    name = "drift"
    table = "drift.parquet"
    columns = COLUMNS
    title = "Quantisation drift"
    anchor = "drift"

    def judge(self, judging: Judging) -> Judged:
        if judging.interrupted:
            return Judged(pd.DataFrame())
        rows, tokens = [], []
        for name, baseline in measured(judging.scenario).items():
            thresholds = judging.scenario.spec.engines[name].drift.model_dump(exclude={"against"})
            for case in judging.scenario.cases:
                row, per_token = _judge(name, baseline, case.case_id, judging.results, judging.drift_traces,
                                        thresholds)
                rows.append({**row, "weights": judging.versions.get(name, {}).get("tensor_types", "")})
                if per_token is not None:
                    tokens.append(per_token)
        if not rows:
            return Judged(pd.DataFrame())
        token_frame = pd.concat(tokens, ignore_index=True) if tokens else pd.DataFrame(columns=list(TOKEN_COLUMNS))
        return Judged(pd.DataFrame(rows, columns=list(COLUMNS)), {TOKENS_TABLE: token_frame})

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        return [INTRO, "", *markdown.table(HEADERS, drift_rows(rows))]

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        cells = drift_rows(rows)
        styles = [["", "", "", "", "" if row[4] == "yes" else "bold red", *[""] * 6] for row in cells]
        print_table("quantisation drift (llama.cpp's perplexity --kl-divergence measures)", HEADERS, cells, styles)

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        """The per-case measures, the distribution of per-token KLD of each engine over all cases (sorted: the value
        at each percentile of tokens), and per case the KLD of each token."""
        out = [f"<p>{esc(INTRO)}</p>",
               expected_table("drift-table", HEADERS, drift_rows(rows), rows.expected.astype(bool).tolist())]
        tokens = read_parquet(page.run_dir, TOKENS_TABLE, TOKEN_COLUMNS, required=False)
        if tokens is None or tokens.empty:
            return "".join(out)
        series = {}
        for engine, group in tokens.groupby("engine", sort=False):
            values = sorted(group["kld"].tolist())
            series[engine] = ([100.0 * i / max(1, len(values) - 1) for i in range(len(values))], values)
        width = 160 * len(series) + 120  # room for every engine's legend entry
        out.append(svg_plot(series, "per-token KLD over all cases, sorted (distribution)", width=width,
                            xlabel="percentile of tokens"))
        for case_id, group in tokens.groupby("case_id", sort=False):
            per_engine = {engine: (g["position"].tolist(), g["kld"].tolist())
                          for engine, g in group.groupby("engine", sort=False)}
            out.append(f"<div class='case'><h3>{esc(case_id)}: drift per token</h3>"
                       + svg_plot(per_engine, f"{case_id}: KLD per generated token", width=width, xlabel="token")
                       + "</div>")
        return "".join(out)


FAMILY = DriftVerdicts()


def _judge(name: str, baseline: str, case_id: str, results: dict[tuple[str, str], Result],
           traces: dict[tuple[str, str], TraceResult], thresholds: dict) -> tuple[dict, pd.DataFrame | None]:
    base_result = results.get((baseline, case_id))
    failed = {"case_id": case_id, "engine": name, "against": baseline, "status": "error", "expected": False}
    if base_result is None or base_result.status != "ok" or not base_result.token_ids:
        return {**failed, "explanation": f"no drift verdict: the baseline {baseline} generated no tokens for this "
                                         "case"}, None
    found = {engine: traces.get((engine, baseline, case_id)) for engine in (baseline, name)}
    problems = [f"{engine}: {_trace_error(found[engine])}" for engine in found if _trace_error(found[engine])]
    if problems:
        return {**failed, "explanation": "no drift verdict: the teacher-forced pass failed (" + "; ".join(problems)
                + ")"}, None
    prompt_len = len(base_result.prompt_ids)
    sequence = np.array([*base_result.prompt_ids, *base_result.token_ids])
    scored = slice(prompt_len - 1, len(sequence) - 1)  # the positions that predict the generated tokens
    per_token = _token_drift(found[baseline].path, found[name].path, scored, sequence[prompt_len:])
    stats = drift_rules.summarize(per_token)
    ok, explanation = drift_rules.judge(stats, thresholds, name, baseline)
    row = {"case_id": case_id, "engine": name, "against": baseline, "status": "ok", "expected": ok, **stats.as_dict(),
           "explanation": explanation}
    tokens = pd.DataFrame({"case_id": case_id, "engine": name, "position": np.arange(stats.tokens),
                           "kld": per_token.kld, "delta_p": per_token.delta_p, "same_top": per_token.same_top})
    return row, tokens


def _trace_error(result: TraceResult | None) -> str:
    if result is None:
        return "not run"
    return "" if result.status == "ok" else result.error


def _token_drift(base_path: str, path: str, scored: slice, targets: np.ndarray) -> drift_rules.TokenDrift:
    """Per-token drift over the scored rows of two traces' logits, read and measured a bounded chunk of rows at a
    time (a 262k-vocabulary row is 2 MB in float64)."""
    base, other = Trace(base_path), Trace(path)
    width = base.shape("logits")[1]
    parts = [drift_rules.token_drift(base.rows("logits", scored.start + a, scored.start + b),
                               other.rows("logits", scored.start + a, scored.start + b), targets[a:b])
             for a, b in row_chunks(len(targets), width)]
    return drift_rules.concat(parts)
