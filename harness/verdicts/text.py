"""Text verdicts (text.parquet): what the client receives, per case and engine, judged from that engine's own ids
(harness.compare.text_rules): its text against the reference tokenizer's decoding of the ids under the case's
detokenisation params, the stop string's trimming, a server's usage counts and a streamed answer's chunks; and how the
ids ended (the finish reason, tokens past a stop string), as read once for the run (harness.compare.ending).
A text that differs while the ids agree is a detokeniser finding, named as such."""

from __future__ import annotations

import json

import pandas as pd

from harness.compare import text_rules
from harness.compare.ending import StopMatch
from harness.core.types import Result
from harness.render import markdown
from harness.render.console import console, print_table
from harness.render.html_parts import esc, expected_table
from harness.render.page import Page
from harness.scenario.spec import Case
from harness.verdicts.family import Judged, Judging, VerdictFamily

COLUMNS = {"case_id": "str", "engine": "str", "expected": "bool", "text_check": "str", "text": "str",
           "ids_text": "str", "stop_string": "str", "stop_step": "int?", "stop_spans_tokens": "bool?",
           "finish_reason": "str", "ids_end": "str", "usage": "json", "deltas": "list[str]", "explanation": "str"}
HEADERS = ["case", "engine", "ok", "reading", "text", "stop string", "finish (ids)", "explanation"]
INTRO = ("Each engine's text against the reference tokenizer's decoding of that engine's own ids (the case's "
         "skip_special_tokens), the stop string found in those ids and how the text was cut there, the finish "
         "reason against how the ids end, and a server's usage counts and streamed chunks.")


def text_rows(rows: pd.DataFrame) -> list[list[str]]:
    return [[r.case_id, r.engine, markdown.yes_no(r.expected), r.text_check, _clipped(r.text),
             "" if not r.stop_string else f"{r.stop_string!r} at token {int(r.stop_step)}"
             + (" (spans tokens)" if r.stop_spans_tokens else ""),
             f"{r.finish_reason or '-'} ({r.ids_end})", r.explanation] for r in rows.itertuples()]


def _clipped(text: str, width: int = 32) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 4] + "...'"


class TextVerdicts(VerdictFamily):
    name = "text"
    table = "text.parquet"
    columns = COLUMNS
    title = "Text"
    anchor = "text"

    def judge(self, judging: Judging) -> Judged:
        if judging.decode_ids is None:
            return Judged(pd.DataFrame())
        rows = [row for case in judging.scenario.cases for name in judging.scenario.spec.engines
                if (row := _judge(judging, case, judging.results.get((name, case.case_id)))) is not None]
        return Judged(pd.DataFrame(rows, columns=list(COLUMNS)) if rows else pd.DataFrame())

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        return [INTRO, "", *markdown.table(HEADERS, text_rows(rows))]

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        findings = rows[~rows.expected]
        if findings.empty:
            console.print(f"text: {len(rows)} answers read as their own ids say (text, stop strings, finish reasons)")
            return
        print_table("text: answers that do not read as their own ids say", HEADERS, text_rows(findings),
                    [["", "", "bold red", *[""] * 5] for _ in range(len(findings))])

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        out = [f"<p>{esc(INTRO)}</p>",
               expected_table("text-table", HEADERS, text_rows(rows), rows.expected.astype(bool).tolist())]
        for row in rows[~rows.expected].itertuples():
            out.append(f"<div class='case'><h3>{esc(row.case_id)} / {esc(row.engine)}</h3><p>text:</p><pre>"
                       f"{esc(row.text)}</pre><p>its ids decoded:</p><pre>{esc(row.ids_text)}</pre></div>")
        return "".join(out)


FAMILY = TextVerdicts()


def _judge(judging: Judging, case: Case, result: Result | None) -> dict | None:
    """One engine's answer to one case read against its ids; None where there is no single text to read (an error,
    samples, beams)."""
    if result is None or result.status != "ok" or result.samples or result.beams or result.message:
        return None  # a chat answer its server split (content, reasoning, calls): the tools verdicts read it
    if not judging.scenario.description(result.engine).capabilities.text:
        return None  # an engine that returns ids only: no text to read
    params = case.engine_params[result.engine]
    ending = judging.endings[(result.engine, case.case_id)]
    include_stop = (result.effective or {}).get("include_stop_str_in_output")
    reading = text_rules.read_answer(
        result.text, result.token_ids, lambda ids: judging.decode_ids(ids, ending.skip_special), ending,
        include_stop=include_stop, usage=result.usage, prompt_len=len(result.prompt_ids))
    findings = reading.findings + text_rules.delta_findings(result.deltas, result.text, list(params.stop or []),
                                                            include_stop)
    stop = ending.stop
    tolerated = judging.scenario.spec.engine_expectation(result.engine).text == "any"
    return {"case_id": case.case_id, "engine": result.engine, "expected": not findings or tolerated,
            "text_check": reading.text_check, "text": result.text, "ids_text": reading.ids_text,
            "stop_string": stop.stop if stop else "", "stop_step": stop.step if stop else None,
            "stop_spans_tokens": stop.spans if stop else None, "finish_reason": result.finish_reason,
            "ids_end": ending.ids_end, "usage": json.dumps(result.usage), "deltas": result.deltas,
            "explanation": "; ".join(findings) or _as_read(reading, stop)}


def _as_read(reading: text_rules.Reading, match: StopMatch | None) -> str:
    stop = match.stop if match else ""
    return {
        text_rules.AS_IDS: "the decoding of its ids" + (f", through the stop string {stop!r}" if stop else ""),
        text_rules.STOP_TOKEN_CUT: "the decoding of its ids without the text of the stop token that ended them",
        text_rules.BEFORE_STOP: f"the decoding of its ids, cut where the stop string {stop!r} starts",
        text_rules.AFTER_STOP: f"the decoding of its ids, cut where the stop string {stop!r} ends",
        text_rules.PARTIAL_HELD: "the decoding of its ids without the last character, whose bytes are not all "
                                 "generated (held back)",
    }[reading.text_check]
