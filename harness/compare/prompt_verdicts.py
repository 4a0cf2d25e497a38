"""Prompt identity in the verdict table: a case whose prompt ids are off (harness.scenario.prompt_identity) says so
in every engine's explanation, and fails where the engine's expectation is `prompt: strict`."""

from __future__ import annotations

import pandas as pd

from harness.scenario.spec import LoadedScenario


def case_warnings(scenario: LoadedScenario, by_prompt: dict[str, list[str]]) -> dict[str, list[str]]:
    """Case id -> the warnings of its prompt."""
    return {c.case_id: by_prompt[c.prompt.id] for c in scenario.cases if by_prompt.get(c.prompt.id)}


def mark_verdicts(verdicts: pd.DataFrame, scenario: LoadedScenario, by_prompt: dict[str, list[str]],
                  by_engine: dict[str, dict[str, list[str]]] | None = None) -> pd.DataFrame:
    """The verdict rows with their case's prompt warnings (by_prompt: every engine's; by_engine: engine -> prompt
    -> the warnings for that engine's own model file) added to the explanation."""
    warned = case_warnings(scenario, by_prompt)
    own = {engine: case_warnings(scenario, prompts) for engine, prompts in (by_engine or {}).items()}
    if verdicts.empty or not (warned or own):
        return verdicts
    verdicts = verdicts.copy()
    for index, row in verdicts.iterrows():
        found = warned.get(row["case_id"], []) + own.get(row["engine"], {}).get(row["case_id"], [])
        if not found:
            continue
        strict = scenario.spec.engine_expectation(row["engine"]).prompt == "strict"
        verdicts.at[index, "explanation"] = f"{row['explanation']}; prompt: {'; '.join(found)}" + (
            " (expect prompt: strict)" if strict else "")
        if strict:
            verdicts.at[index, "expected"] = False
    return verdicts
