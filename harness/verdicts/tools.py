"""Tools verdicts (tools.parquet): what an agent receives, per chat case and engine (harness.compare.tool_rules).

(a) prompt: the engine's prompt ids (a server renders its own: vLLM returns them) against the reference's render, a
    difference named by the template part it starts in (the tools block, a thinking switch, a message);
(b) calls: the engine's split (content, reasoning, calls), as its server answered or, offline, its text parsed with
    the parsers its options name, against the reference's generated text parsed by the same parsers; where the ids are
    the reference's, a difference is the server's parsing (streamed: a streamed-call finding);
(c) markup left in content or reasoning by a parser (a bare </think>);
(d) split invariance: the engine's parsers fed its own ids whole, one token per chunk and in seeded random chunks
    (adapters.engines.vllm_parsers) give the unstreamed split every time.
A verdict of "same" is a claim: tests/engines/test_tools.py plants a fault of each kind beside clean engines."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from adapters.engines.parser_runs import ParserOptions
from harness.compare import agent_prompts, tool_rules
from harness.compare.agent_prompts import SAME
from harness.core.agent_requests import template_messages, wire_messages
from harness.core.types import Result
from harness.plan.requests import agent_fields
from harness.render import markdown
from harness.render.console import console, print_table
from harness.render.html_parts import esc, expected_table
from harness.render.page import Page
from harness.scenario.prompts import load_tokenizer
from harness.scenario.spec import Case, LoadedScenario
from harness.verdicts.family import Judged, Judging, VerdictFamily

COLUMNS = {"case_id": "str", "engine": "str", "expected": "bool", "tools_check": "str", "parsers": "str",
           "prompt": "str", "split": "json", "reference_split": "json", "chunkings": "json", "explanation": "str"}
HEADERS = ["case", "engine", "ok", "reading", "parsers", "prompt", "calls", "explanation"]
INTRO = ("Each engine's prompt ids against the reference's render (where they part, by template part); its split of "
         "the answer (content, reasoning, calls) against the reference's text parsed by the same parsers, calls "
         "compared as JSON values; markup left in the answer; and its parsers fed its ids in chunks (whole, token by "
         "token, seeded random cuts) against the unstreamed split.")


def tools_rows(rows: pd.DataFrame) -> list[list[str]]:
    return [[r.case_id, r.engine, markdown.yes_no(r.expected), r.tools_check, r.parsers or "-", r.prompt,
             _calls(r.split), r.explanation] for r in rows.itertuples()]


def _calls(split: str) -> str:
    calls = json.loads(split or "{}").get("tool_calls") or []
    return ", ".join(f"{c['name']}({c['arguments']})" for c in calls) or "-"


class ToolVerdicts(VerdictFamily):
    name = "tools"
    table = "tools.parquet"
    columns = COLUMNS
    title = "Tools and reasoning"
    anchor = "tools"

    def judge(self, judging: Judging) -> Judged:
        scenario = judging.scenario
        parsers = {name: _parsers(scenario, name) for name in scenario.spec.engines}
        if not scenario.spec.tools and not any(parsers.values()):
            return Judged(pd.DataFrame())
        rows = [row for case in scenario.cases if case.prompt.messages is not None
                for name in scenario.spec.engines if name != scenario.spec.reference
                if (row := _judge(judging, case, name, parsers[name])) is not None]
        return Judged(pd.DataFrame(rows, columns=list(COLUMNS)) if rows else pd.DataFrame())

    def summary_lines(self, rows: pd.DataFrame) -> list[str]:
        return [INTRO, "", *markdown.table(HEADERS, tools_rows(rows))]

    def print(self, rows: pd.DataFrame, reference: str) -> None:
        findings = rows[~rows.expected]
        if findings.empty:
            same = int((rows.tools_check == SAME).sum())
            parts = [f"{same} answers split as the reference's (prompts, calls, reasoning, chunks)"] if same else []
            if same < len(rows):
                parts.append(f"{len(rows) - same} answered within their engine's limits, said (not applied)")
            console.print(f"tools: {'; '.join(parts)}")
            return
        print_table("tools: answers that do not split as the reference's", HEADERS, tools_rows(findings),
                    [["", "", "bold red", *[""] * 5] for _ in range(len(findings))])

    def html(self, rows: pd.DataFrame, page: Page) -> str:
        out = [f"<p>{esc(INTRO)}</p>",
               expected_table("tools-table", HEADERS, tools_rows(rows), rows.expected.astype(bool).tolist())]
        for row in rows[~rows.expected].itertuples():
            out.append(f"<div class='case'><h3>{esc(row.case_id)} / {esc(row.engine)}</h3><p>its split:</p><pre>"
                       f"{esc(row.split)}</pre><p>the reference's text, parsed the same way:</p><pre>"
                       f"{esc(row.reference_split)}</pre><p>chunkings:</p><pre>{esc(row.chunkings)}</pre></div>")
        return "".join(out)


FAMILY = ToolVerdicts()


def _parsers(scenario: LoadedScenario, name: str) -> ParserOptions | None:
    from adapters.engines.engine_parsers import FAMILIES
    from adapters.engines.parser_runs import parsers_named

    engine = scenario.spec.engines[name]
    return parsers_named(engine.options) if engine.engine in FAMILIES else None


def _request(scenario: LoadedScenario, case: Case) -> dict[str, Any]:
    """The chat request's fields the parsers read, as the engines were sent them (the API's form)."""
    fields = agent_fields(scenario, case.prompt)
    return {"messages": wire_messages(fields["messages"]),
            **{key: value for key, value in fields.items() if key != "messages" and value}}


def _answer_ids(result: Result, eos_ids: set[int]) -> list[int]:
    ids = list(result.token_ids)
    return ids[:-1] if ids and ids[-1] in eos_ids else ids


def _judge(judging: Judging, case: Case, name: str, parsers: ParserOptions | None) -> dict | None:
    scenario = judging.scenario
    reference = judging.results.get((scenario.spec.reference, case.case_id))
    result = judging.results.get((name, case.case_id))
    if reference is None or result is None or reference.status != "ok" or result.status != "ok":
        return None
    findings: list[tuple[str, str]] = []
    prompt, prompt_finding = _prompt_reading(judging, case, name, reference, result)
    if prompt_finding:
        findings.append(("template", prompt_finding))
    row: dict[str, Any] = {"case_id": case.case_id, "engine": name, "prompt": prompt, "chunkings": "{}",
                           "parsers": "" if parsers is None else " + ".join(
                               p for p in (parsers.tool_parser, parsers.reasoning_parser) if p)}
    if parsers is None:
        return _finish(_unparsed(row, result, findings), findings, [])
    from adapters.engines.engine_parsers import parsing_for
    from adapters.engines.parser_runs import split_differences

    ref_ids, own_ids = _answer_ids(reference, judging.eos_ids), _answer_ids(result, judging.eos_ids)
    try:
        parsing = parsing_for(scenario.spec.engines[name].engine, parsers, scenario.engine(name).model_folder,
                              _request(scenario, case))
        reference_split = parsing.whole(parsing.decode(ref_ids), ref_ids, reference.prompt_ids)
        offline = parsing.whole(parsing.decode(own_ids), own_ids, result.prompt_ids)
    except Exception as exc:  # an unknown parser name, one that refuses the model's vocabulary, one that raises
        row.update(split=json.dumps(result.message or {}), reference_split="{}")
        findings.append(("parser-error", f"its parsers ({row['parsers']}) could not read the answers: "
                                         f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
        return _finish(row, findings, [])
    split = result.message or offline
    row.update(split=json.dumps(split), reference_split=json.dumps(reference_split))
    difference = tool_rules.split_difference(reference_split, split)
    if difference is not None:
        if own_ids != ref_ids:
            findings.append((difference.kind, f"{difference.words}: its ids part from the reference's (see the "
                                              "tokens verdict), so its answer says something else"))
        elif result.message and result.native_params.get("stream"):
            kind = "streamed-call" if difference.part == "calls" else "reasoning-split"
            findings.append((kind, f"{difference.words}: the server's streamed answer, where its parsers read the "
                                   "same ids unstreamed as the reference's"))
        else:
            findings.append((difference.kind, f"{difference.words}: the server's parse of the reference's own ids"))
    markers = (tool_rules.THINK_MARKERS if parsers.reasoning_parser else ()) + \
        (tool_rules.CALL_MARKERS if parsers.tool_parser else ())  # an absent parser's markup stays: warned
    leaks = {f"{where}: {leak}" for where, read in (("its answer", split), ("its parsers, unstreamed", offline))
             if (leak := tool_rules.leaked_markup(read, markers))}
    findings.extend(("reasoning-split", leak) for leak in sorted(leaks))
    chunk_findings = split_differences(parsing, parsing.decode(own_ids), own_ids, result.prompt_ids,
                                       lambda whole, streamed: _words(tool_rules.split_difference(whole, streamed)))
    row["chunkings"] = json.dumps(chunk_findings)
    if chunk_findings:
        way, words = next(iter(chunk_findings.items()))
        findings.append(("split", f"its parsers fed its ids {way} give {words} (and {len(chunk_findings)} "
                                  "chunking(s) in all differ from the unstreamed split)"))
    return _finish(row, findings, tool_rules.whitespace_notes(reference_split, split))


AGENT_PARAMS = ("tools=", "chat_template_kwargs=", "reasoning=")


def _unparsed(row: dict[str, Any], result: Result, findings: list[tuple[str, str]]) -> dict[str, Any]:
    """An engine with no parsers of its own here: what its server could not do (its NOT APPLIED warnings), said."""
    split = result.message or {}
    row.update(split=json.dumps(split), reference_split="{}")
    limits = [w for w in result.warnings if w.startswith(AGENT_PARAMS) and "NOT APPLIED" in w]
    if limits:
        findings.append((NOT_APPLIED, "; ".join(limits)))
    elif split:
        findings.append((NOT_APPLIED, "the server split the answer, but the engine names no parsers (options "
                                      "tool_parser, reasoning_parser) to read the reference's text with"))
    else:
        findings.append((NOT_APPLIED, "the engine has no tool or reasoning parsers here: its answer is read as "
                                      "text (the tokens and text verdicts)"))
    return row


NOT_APPLIED = "not-applied"  # said, never failing: the engine's limits, named


def _words(difference: tool_rules.SplitDifference | None) -> str | None:
    return difference.words if difference else None


def _finish(row: dict[str, Any], findings: list[tuple[str, str]], notes: list[str]) -> dict[str, Any]:
    kinds = list(dict.fromkeys(kind for kind, _ in findings))
    row.update(expected=all(kind == NOT_APPLIED for kind, _ in findings), tools_check=", ".join(kinds) or SAME,
               explanation="; ".join([w for _, w in findings] + notes) or "the same split as the reference's")
    return row


def _prompt_reading(judging: Judging, case: Case, name: str, reference: Result,
                    result: Result) -> tuple[str, str | None]:
    from adapters.http.agent_support import STARTUP
    from adapters.http.dialects import DIALECTS

    scenario = judging.scenario
    options = scenario.spec.engines[name].options
    dialect = scenario.description(name).dialect_name(options)
    starts_with = dialect is not None and DIALECTS[dialect].agent.template_kwargs == STARTUP
    server_kwargs = options.get("chat_template_kwargs") or {} if starts_with else None
    return agent_prompts.prompt_reading(
        load_tokenizer(scenario.engine(scenario.spec.reference).model_folder), template_messages(case.prompt.messages),
        scenario.spec.tool_dicts(), scenario.spec.template_kwargs(case.prompt), reference.prompt_ids,
        result.prompt_ids, result.warnings, judging.versions.get(name, {}), server_kwargs)
