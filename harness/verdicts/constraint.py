"""Constrained-output verdicts (constraint.parquet): each constrained engine's answer against the unconstrained
reference, metamorphically (harness.compare.constraint_rules): where the reference already satisfies the constraint the
answer must not change; where it does not, the constrained answer must satisfy it, and the step where the constraint
first masked the reference's choice is named."""

from __future__ import annotations

import pandas as pd

from harness.compare import constraint_rules
from harness.compare.ending import STOP_STRING, Ending
from harness.compare.tie_noise import tie_bounds
from harness.render import markdown
from harness.render.console import console, print_table
from harness.render.html_parts import esc, expected_table
from harness.render.page import Page
from harness.verdicts.family import Judged, Judging, VerdictFamily

COLUMNS = {"case_id": "str", "engine": "str", "expected": "bool", "verdict": "str", "constraint": "str",
           "reference_satisfies": "bool", "engine_satisfies": "bool", "masked_step": "int?", "text": "str",
           "reference_text": "str", "explanation": "str"}
HEADERS = ["case", "engine", "verdict", "ok", "reference satisfies", "answer satisfies", "masked at", "explanation"]
INTRO = ("The reference answers unconstrained; every other engine under the scenario's constraint. Where the "
         "reference's answer already satisfies the constraint, the constrained answer must be the same; where it "
         "does not, the constrained answer must satisfy it (the step where the constraint first masked the "
         "reference's choice is named).")


def constraint_rows(rows: pd.DataFrame) -> list[list[str]]:
    return [[r.case_id, r.engine, r.verdict, markdown.yes_no(r.expected), markdown.yes_no(r.reference_satisfies),
             markdown.yes_no(r.engine_satisfies), markdown.step(r.masked_step), r.explanation]
            for r in rows.itertuples()]


def _ended(ending: Ending | None) -> bool:
    """Whether an answer's last token is what ended it (an EOS, a stop token, the token completing a stop string)."""
    return ending is not None and (ending.last_id_ends or ending.how == STOP_STRING)


class ConstraintVerdicts(VerdictFamily):
    name = "constraint"
    table = "constraint.parquet"
    columns = COLUMNS
    title = "Constrained output"
    anchor = "constraint"

    def judge(self, judging: Judging) -> Judged:
        spec = judging.scenario.spec
        if spec.constraint is None or judging.interrupted:
            return Judged(pd.DataFrame())
        reference = spec.reference
        rows = []
        for case in judging.scenario.cases:
            ref = judging.results.get((reference, case.case_id))
            for name in spec.engines:
                result = judging.results.get((name, case.case_id))
                constraint = case.engine_params[name].constraint
                if name == reference or constraint is None or result is None or result.status != "ok" \
                        or ref is None or ref.status != "ok":
                    continue
                ending = judging.endings.get((name, case.case_id))
                stop = ending.stop.stop if ending and ending.how == STOP_STRING and ending.stop else ""
                expectation = spec.engine_expectation(name)
                margins, bounds = tie_bounds([case.case_id], judging.ties, expectation.tie_margin,
                                             expectation.max_logprob_delta)
                check = judging.ties.layers.get((name, case.case_id))  # a component out of its floor: no tie
                ended = (_ended(judging.endings.get((reference, case.case_id))),
                         _ended(judging.endings.get((name, case.case_id))))
                fields = constraint_rules.judge(constraint, ref, result, result.applied("constraint"), judging.decode,
                                                lambda ids: judging.decode_ids(ids, True), stop,
                                                (float(margins[0]), float(bounds[0]), check is None or check.clean),
                                                ended)
                rows.append({"case_id": case.case_id, "engine": name,
                             "expected": fields["verdict"] in constraint_rules.PASSING,
                             "constraint": constraint.described(), "text": result.text, "reference_text": ref.text,
                             **fields})
        return Judged(pd.DataFrame(rows, columns=list(COLUMNS)) if rows else pd.DataFrame())

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        return [INTRO, "", *markdown.table(HEADERS, constraint_rows(rows))]

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        cells = constraint_rows(rows)
        styles = [["", "", "", "" if row[3] == "yes" else "bold red", *[""] * 4] for row in cells]
        print_table(f"constrained output (the reference {reference} answers unconstrained)", HEADERS, cells, styles)
        console.print(f"constraint: {rows.constraint.iloc[0]}")

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        out = [f"<p>{esc(INTRO)}</p><p>constraint: <code>{esc(rows.constraint.iloc[0])}</code></p>",
               expected_table("constraint-table", HEADERS, constraint_rows(rows), rows.expected.astype(bool).tolist())]
        for row in rows.itertuples():
            out.append(f"<div class='case'><h3>{esc(row.case_id)} / {esc(row.engine)}</h3><p>reference "
                       f"(unconstrained):</p><pre>{esc(row.reference_text)}</pre><p>constrained:</p>"
                       f"<pre>{esc(row.text)}</pre></div>")
        return "".join(out)


FAMILY = ConstraintVerdicts()
