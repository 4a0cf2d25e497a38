"""The token verdicts: each engine's generation of each case against the reference's (greedy tokens, beams, or the
samples of a sampling-parity scenario), in verdicts.parquet; the prompt-identity warnings are marked on them."""

from __future__ import annotations

from functools import partial

import pandas as pd

from harness.compare.beam_rules import judge_all
from harness.compare.prompt_verdicts import mark_verdicts
from harness.compare.sampling_parity import judge_samples
from harness.compare.token_rules import VERDICT_TYPES, judge
from harness.render import markdown
from harness.render.console import console, print_table
from harness.render.html_parts import esc, svg_plot
from harness.render.page import Page
from harness.rundir import layout
from harness.verdicts.family import Judged, Judging, VerdictFamily

VERDICT_STYLE = {"match": "green", "benign_tie": "yellow", "diverged": "red", "hazard": "bold red",
                 "engine_error": "bold red", "undetermined": "red"}
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
        rule = judge_samples if judging.scenario.spec.sampling else partial(judge, ties=judging.ties,
                                                                            endings=judging.endings)
        verdicts = judge_all(rule, judging.scenario, judging.compared, judging.decode)
        return Judged(mark_verdicts(verdicts, judging.scenario, judging.prompt_warnings,
                                    judging.engine_prompt_warnings))

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        return markdown.table(HEADERS, verdict_rows(rows))

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        """Every row in run order; a run of more than CONSOLE_ROWS rows shows its problems first and says what it left
        out (summary.md and the report have every row)."""
        ordered = rows if len(rows) <= CONSOLE_ROWS else by_severity(rows)
        cells = verdict_rows(ordered.head(CONSOLE_ROWS))
        styles = [["", "", VERDICT_STYLE.get(row[2], ""), "" if row[3] == "yes" else "bold red", "", "", ""]
                  for row in cells]
        print_table(f"verdicts vs reference '{reference}'", HEADERS, cells, styles)
        left_out = ordered.iloc[CONSOLE_ROWS:]
        if len(left_out):
            problems = int((~left_out.expected.astype(bool)).sum())
            console.print(f"... and {len(left_out):,} more rows, {problems:,} of them not as expected (problems "
                          "come first): every row is in summary.md and the report", markup=False, highlight=False)

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        """The verdict table, problems first (a row links to its case), then each case: aligned tokens with the first
        divergence, both answers, the top-k alternatives at the divergence and the per-step logprob delta. A large
        run keeps its first screen light: the verdict rows past FIRST_ROWS are collapsed, and the cases past
        CASES_PER_PAGE go to further pages beside the report."""
        ordered = by_severity(rows)
        links = [case_link(i, page) for i in range(len(ordered))]
        sections = [_case_section(i, v, page) for i, v in enumerate(ordered.itertuples())]
        back = f"<p><a href='{esc(page.stem)}.html'>back to the report</a></p>"
        for start in range(CASES_PER_PAGE, len(sections), CASES_PER_PAGE):
            shown = f"cases {start + 1}-{min(start + CASES_PER_PAGE, len(sections))} of {len(sections)}"
            page.further[page.further_page(start // CASES_PER_PAGE + 1)] = (
                shown, back + "\n".join(sections[start:start + CASES_PER_PAGE]))
        pages = len(page.further)
        more = (f"<p id='further-pages'>{len(sections) - CASES_PER_PAGE} more cases on {pages} further page(s): "
                + ", ".join(f"<a href='{esc(name)}'>{esc(title)}</a>" for name, (title, _) in page.further.items())
                + "</p>") if pages else ""
        return "\n".join([_verdict_table(ordered, links), "<h2>Cases</h2>", *sections[:CASES_PER_PAGE], more])


CONSOLE_ROWS = 50  # verdict rows a run prints; past it, problems first and a line for the rest
FIRST_ROWS = 100  # verdict rows in the report's first table; the rest are collapsed under it
CASES_PER_PAGE = 50  # case sections on the report's first page, and on each further page beside it
SEVERITY = {"engine_error": 0, "hazard": 1, "diverged": 2, "undetermined": 2, "benign_tie": 3, "match": 4}


def by_severity(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Rows not as expected first, then by verdict (engine errors, hazards, divergences, near-ties, matches), each
    group in run order: a large run's problems are on its report's first screen."""
    rank = verdicts.expected.astype(bool).astype(int) * 10 + verdicts.verdict.map(SEVERITY).fillna(2)
    return verdicts.iloc[rank.argsort(kind="stable")].reset_index(drop=True)


def case_link(i: int, page: Page) -> str:
    """Where the i-th case (in by_severity order) is: on the report's first page or on a further one."""
    return f"#case-{i}" if i < CASES_PER_PAGE else f"{page.further_page(i // CASES_PER_PAGE + 1)}#case-{i}"


FAMILY = TokenVerdicts()


def _verdict_table(verdicts: pd.DataFrame, links: list[str]) -> str:
    header = ("<tr><th>case</th><th>engine</th><th>verdict</th><th>as expected</th><th>first divergence</th>"
              "<th>max |Δlogprob|</th><th>explanation</th></tr>")
    rows = [f"<tr data-href='{esc(link)}' class='{'' if r.expected else 'no'}'><td>{esc(r.case_id)}</td>"
            f"<td>{esc(r.engine)}</td><td class='{esc(r.verdict)}'>{esc(r.verdict)}</td>"
            f"<td>{'yes' if r.expected else 'NO'}</td><td>{markdown.step(r.first_divergence)}</td>"
            f"<td>{markdown.num(r.max_abs_logprob_delta)}</td><td>{esc(r.explanation)}</td></tr>"
            for r, link in zip(verdicts.itertuples(), links, strict=True)]
    counts = ", ".join(f"{n} {verdict}" for verdict, n in verdicts.verdict.value_counts(sort=False).items())
    unexpected = int((~verdicts.expected.astype(bool)).sum())
    table = (f"<p id='verdict-counts'>{len(verdicts)} verdicts: {esc(counts)}; <b>{unexpected} not as expected</b>"
             "</p><table id='verdicts'>" + header + "\n".join(rows[:FIRST_ROWS]) + "</table>")
    if len(rows) <= FIRST_ROWS:
        return table
    rest = verdicts.iloc[FIRST_ROWS:]
    counts = ", ".join(f"{n} {verdict}" for verdict, n in rest.verdict.value_counts(sort=False).items())
    return (table + f"<details id='more-verdicts'><summary>{len(rest)} more rows ({esc(counts)}; "
            f"{int(rest.expected.astype(bool).sum())} as expected)</summary><table>{header}"
            + "\n".join(rows[FIRST_ROWS:]) + "</table></details>")


def _token_row(ids: list[int], first: int, decode) -> str:
    spans = []
    for i, token in enumerate(ids):
        cls = "tok first" if i == first else "tok after" if 0 <= first < i else "tok"
        spans.append(f'<span class="{cls}" title="step {i}, id {token}">{esc(decode(token))}</span>')
    return "".join(spans)


def _alternatives(steps: pd.DataFrame | None, step: int, decode) -> str:
    if steps is None or step not in steps.index:
        return "<td>(no step)</td>"
    top = zip(steps.at[step, "top_ids"], steps.at[step, "top_logprobs"], strict=False)
    return "<td>" + "<br>".join(f"{esc(repr(decode(int(t))))} {lp:.3f}" for t, lp in top) + "</td>"


def _case_section(i: int, v, page: Page) -> str:
    reference, decode = page.reference, page.decode
    ref, oth = page.result_of.get((reference, v.case_id)), page.result_of.get((v.engine, v.case_id))
    out = [f"<div class='case' id='case-{i}'><h3>{esc(v.case_id)}: {esc(v.engine)} vs {esc(reference)} "
           f"<span class='{esc(v.verdict)}'>{esc(v.verdict)}</span></h3><p>{esc(v.explanation)}</p>"]
    if ref is None or oth is None or v.verdict == "engine_error":
        return "".join(out) + "</div>"
    first = -1 if pd.isna(v.first_divergence) else int(v.first_divergence)
    out.append("<table class='aligned'>")
    for name, row in ((reference, ref), (v.engine, oth)):
        out.append(f"<tr><th>{esc(name)}</th><td class='tokens'>{_token_row(list(row.token_ids), first, decode)}"
                   "</td></tr>")
    out.append("</table><table class='answers'>")
    for name, row in ((reference, ref), (v.engine, oth)):  # engine output: text, always escaped
        out.append(f"<tr><th>{esc(name)} answer</th><td class='answer'>{esc(row.text)}</td></tr>")
    out.append("</table>")
    ref_steps, oth_steps = page.steps_of.get((reference, v.case_id)), page.steps_of.get((v.engine, v.case_id))
    if first >= 0:
        out.append(f"<table class='alternatives'><tr><th colspan=2>top-k at step {first}</th></tr><tr>"
                   f"<th>{esc(reference)}</th><th>{esc(v.engine)}</th></tr><tr>"
                   f"{_alternatives(ref_steps, first, decode)}{_alternatives(oth_steps, first, decode)}</tr></table>")
    empty = pd.Series(dtype=float)
    a = empty if ref_steps is None else ref_steps.chosen_logprob
    b = empty if oth_steps is None else oth_steps.chosen_logprob
    shared = a.index.intersection(b.index)
    shared = shared[shared < first] if first >= 0 else shared
    delta = (a[shared] - b[shared]).abs()
    out.append(svg_plot({v.engine: (list(shared), delta.tolist())},
                        f"|Δ chosen-token logprob| per step, {v.engine} vs {reference} (shared steps)"))
    return "".join(out) + "</div>"
