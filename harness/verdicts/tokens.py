"""The token verdicts: each engine's generation of each case against the reference's (greedy tokens, beams, or the
samples of a sampling-parity scenario), in verdicts.parquet; the prompt-identity warnings are marked on them."""

from __future__ import annotations

import pandas as pd

from harness.compare.beam_rules import judge_all
from harness.compare.prompt_verdicts import mark_verdicts
from harness.compare.sampling_parity import judge_samples
from harness.compare.token_rules import VERDICT_TYPES, judge
from harness.render import markdown
from harness.render.console import print_table
from harness.render.html_parts import esc, svg_plot
from harness.render.page import Page
from harness.rundir import layout
from harness.verdicts.family import Judged, Judging, VerdictFamily

VERDICT_STYLE = {"match": "green", "benign_tie": "yellow", "diverged": "red", "hazard": "bold red",
                 "engine_error": "bold red"}
HEADERS = ["case", "engine", "verdict", "ok", "diverges at", "max dlogprob", "explanation"]


def verdict_rows(verdicts: pd.DataFrame) -> list[list[str]]:
    return [[r.case_id, r.engine, r.verdict, markdown.yes_no(r.expected), markdown.step(r.first_divergence),
             markdown.num(r.max_abs_logprob_delta), r.explanation] for r in verdicts.itertuples()]


class TokenVerdicts(VerdictFamily):
    name = "tokens"
    table = layout.VERDICTS
    columns = VERDICT_TYPES
    title = "Verdicts"
    anchor = "verdicts"
    always_shown = "No verdicts: the run was interrupted before any case finished."

    def judge(self, judging: Judging) -> Judged:
        if judging.interrupted and not judging.compared:
            return Judged(pd.DataFrame())
        rule = judge_samples if judging.scenario.spec.sampling else judge
        verdicts = judge_all(rule, judging.scenario, judging.compared, judging.decode)
        return Judged(mark_verdicts(verdicts, judging.scenario, judging.prompt_warnings))

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        return markdown.table(HEADERS, verdict_rows(rows))

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        cells = verdict_rows(rows)
        styles = [["", "", VERDICT_STYLE.get(row[2], ""), "" if row[3] == "yes" else "bold red", "", "", ""]
                  for row in cells]
        print_table(f"verdicts vs reference '{reference}'", HEADERS, cells, styles)

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        """The verdict table (a row links to its case), then each case: aligned tokens with the first divergence,
        both answers, the top-k alternatives at the divergence and the per-step logprob delta."""
        return "\n".join([_verdict_table(rows), "<h2>Cases</h2>",
                          *[_case_section(i, v, page) for i, v in enumerate(rows.itertuples())]])


FAMILY = TokenVerdicts()


def _verdict_table(verdicts: pd.DataFrame) -> str:
    rows = ["<table id='verdicts'><tr><th>case</th><th>engine</th><th>verdict</th><th>as expected</th>"
            "<th>first divergence</th><th>max |Δlogprob|</th><th>explanation</th></tr>"]
    for i, r in enumerate(verdicts.itertuples()):
        rows.append(f"<tr data-case='{i}' class='{'' if r.expected else 'no'}'><td>{esc(r.case_id)}</td>"
                    f"<td>{esc(r.engine)}</td><td class='{esc(r.verdict)}'>{esc(r.verdict)}</td>"
                    f"<td>{'yes' if r.expected else 'NO'}</td><td>{markdown.step(r.first_divergence)}</td>"
                    f"<td>{markdown.num(r.max_abs_logprob_delta)}</td><td>{esc(r.explanation)}</td></tr>")
    return "\n".join(rows) + "</table>"


def _token_row(ids: list[int], first: int, decode) -> str:
    spans = []
    for i, token in enumerate(ids):
        cls = "tok first" if i == first else "tok after" if 0 <= first < i else "tok"
        spans.append(f'<span class="{cls}" title="step {i}, id {token}">{esc(decode(token))}</span>')
    return "".join(spans)


def _alternatives(steps: pd.DataFrame, engine: str, case_id: str, step: int, decode) -> str:
    row = steps[(steps.engine == engine) & (steps.case_id == case_id) & (steps.step == step)]
    if row.empty:
        return "<td>(no step)</td>"
    top = zip(row.iloc[0].top_ids, row.iloc[0].top_logprobs, strict=False)
    return "<td>" + "<br>".join(f"{esc(repr(decode(int(t))))} {lp:.3f}" for t, lp in top) + "</td>"


def _case_section(i: int, v, page: Page) -> str:
    results, steps, reference, decode = page.results, page.steps, page.reference, page.decode
    ref = results[(results.engine == reference) & (results.case_id == v.case_id)]
    oth = results[(results.engine == v.engine) & (results.case_id == v.case_id)]
    out = [f"<div class='case' id='case-{i}'><h3>{esc(v.case_id)}: {esc(v.engine)} vs {esc(reference)} "
           f"<span class='{esc(v.verdict)}'>{esc(v.verdict)}</span></h3><p>{esc(v.explanation)}</p>"]
    if ref.empty or oth.empty or v.verdict == "engine_error":
        return "".join(out) + "</div>"
    first = -1 if pd.isna(v.first_divergence) else int(v.first_divergence)
    out.append("<table class='aligned'>")
    for name, row in ((reference, ref.iloc[0]), (v.engine, oth.iloc[0])):
        out.append(f"<tr><th>{esc(name)}</th><td class='tokens'>{_token_row(list(row.token_ids), first, decode)}"
                   "</td></tr>")
    out.append("</table><table class='answers'>")
    for name, row in ((reference, ref.iloc[0]), (v.engine, oth.iloc[0])):  # engine output: text, always escaped
        out.append(f"<tr><th>{esc(name)} answer</th><td class='answer'>{esc(row.text)}</td></tr>")
    out.append("</table>")
    if first >= 0:
        out.append(f"<table class='alternatives'><tr><th colspan=2>top-k at step {first}</th></tr><tr>"
                   f"<th>{esc(reference)}</th><th>{esc(v.engine)}</th></tr><tr>"
                   f"{_alternatives(steps, reference, v.case_id, first, decode)}"
                   f"{_alternatives(steps, v.engine, v.case_id, first, decode)}</tr></table>")
    a = steps[(steps.engine == reference) & (steps.case_id == v.case_id)].set_index("step").chosen_logprob
    b = steps[(steps.engine == v.engine) & (steps.case_id == v.case_id)].set_index("step").chosen_logprob
    shared = a.index.intersection(b.index)
    shared = shared[shared < first] if first >= 0 else shared
    delta = (a[shared] - b[shared]).abs()
    out.append(svg_plot({v.engine: (list(shared), delta.tolist())},
                        f"|Δ chosen-token logprob| per step, {v.engine} vs {reference} (shared steps)"))
    return "".join(out) + "</div>"


