"""What each engine of a scenario returns as a logprob, for `parity params`: raw or processed, logprobs or logits
(adapters.contract.LogprobMeaning), and where the numbers come from."""

from __future__ import annotations

from harness.scenario.spec import LoadedScenario

HEADERS = ["engine", "returns", "from"]


def rows(scenario: LoadedScenario, names: list[str]) -> list[list[str]]:
    meanings = {name: scenario.description(name).logprob_meaning(scenario.spec.engines[name].options) for name in names}
    return [[name, meaning.kind, meaning.how] for name, meaning in meanings.items()]
