"""Prompt identity in the verdict table: a case whose prompt ids are off (harness.scenario.prompt_identity) says so
in every engine's explanation, and fails where the engine's expectation is `prompt: strict`."""

from __future__ import annotations

import pandas as pd

from harness.scenario.spec import LoadedScenario


def case_warnings(scenario: LoadedScenario, by_prompt: dict[str, list[str]]) -> dict[str, list[str]]:
    """Case id -> the warnings of its prompt."""
    return {c.case_id: by_prompt[c.prompt.id] for c in scenario.cases if by_prompt.get(c.prompt.id)}


def mark_verdicts(verdicts: pd.DataFrame, scenario: LoadedScenario, by_prompt: dict[str, list[str]]) -> pd.DataFrame:
    warned = case_warnings(scenario, by_prompt)
    if verdicts.empty or not warned:
        return verdicts
    verdicts = verdicts.copy()
    for index, row in verdicts.iterrows():
        found = warned.get(row["case_id"])
        if not found:
            continue
        strict = scenario.spec.engine_expectation(row["engine"]).prompt == "strict"
        verdicts.at[index, "explanation"] = f"{row['explanation']}; prompt: {'; '.join(found)}" + (
            " (expect prompt: strict)" if strict else "")
        if strict:
            verdicts.at[index, "expected"] = False
    return verdicts
