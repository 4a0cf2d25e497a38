"""Effective params: what each engine really does with a case's params (computed by the engine's own code in
adapters.*_sampling), side by side, with the rows where engines differ marked; and the preflight that refuses
params an engine would reject, before anything runs."""

from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from adapters.registry import sampling_code
from harness import models
from harness.errors import ConfigError
from harness.sampling_jobs import SamplingJob, SamplingJobFailed
from harness.scenario import LoadedScenario
from harness.types import Effective, SamplingParams


def display(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return " > ".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p")  # no effect on an argmax


def comparable(effective: Effective, field: str) -> str:
    """A field's value for comparison: an engine without a penalty knob behaves as with its neutral value, and
    truncation and temperature do not matter to an engine that decodes greedily."""
    if effective.decoding == "greedy" and field in SAMPLING_ONLY:
        return "-"
    value = getattr(effective, field)
    return display(Effective.NEUTRAL.get(field) if value is None and field in Effective.NEUTRAL else value)


def differing_fields(by_engine: dict[str, Effective]) -> list[str]:
    """The compared fields whose values are not the same for every engine that accepted the params."""
    accepted = [e for e in by_engine.values() if not e.rejected]
    penalised = [e for e in accepted if e.repetition_penalty not in (None, 1.0)]
    differ = []
    for f in Effective.COMPARED:
        group = penalised if f == "repetition_scope" else accepted  # what a penalty counts matters where it applies
        if len({comparable(e, f) for e in group}) > 1:
            differ.append(f)
    return differ


def describe_differences(by_engine: dict[str, Effective], fields: list[str] | None = None) -> str:
    """'repetition_penalty: hf 1.1 (generation_config.json), vllm 1' for each differing field."""
    parts = []
    for field in fields if fields is not None else differing_fields(by_engine):
        values = []
        for name, e in by_engine.items():
            source = e.sources.get(field)
            value = getattr(e, field)
            values.append(f"{name} {'n/a' if value is None else display(value)}"
                          + (f" ({source})" if source and source != "request" else ""))
        parts.append(f"{field}: {', '.join(values)}")
    return "; ".join(parts)


def rejections(scenario: LoadedScenario, names: list[str]) -> dict[str, str]:
    """engine -> why it would reject its params, from the ranges each sampling module declares (LIMITS) as its
    engine's validation enforces them beyond the canonical ones."""
    found: dict[str, str] = {}
    for problem in _problems(scenario, names):  # the first case's reason per engine
        found.setdefault(problem.split(" ", 1)[0].removeprefix("engines."), problem)
    return found


def preflight(scenario: LoadedScenario, names: list[str]) -> None:
    """Refuse, before any engine starts, params an engine's own validation rejects."""
    per_engine = rejections(scenario, names)
    if per_engine:
        raise ConfigError(f"{scenario.path}: nothing was run: {'; '.join(per_engine.values())}: change the param "
                          "or drop the engine")


def _problems(scenario: LoadedScenario, names: list[str]) -> list[str]:
    problems = []
    for name in names:
        spec = scenario.spec.engines[name]
        code = sampling_code(spec.engine, spec.options)
        limits = getattr(importlib.import_module(code[0]), "LIMITS", {}) if code else {}
        for case in scenario.cases:
            params = case.engine_params[name]
            for field, (low, high, message) in limits.items():
                value = getattr(params, field)
                if value is not None and not low <= value <= high:
                    problems.append(f"engines.{name} (case {case.case_id}): rejected by {spec.engine}: "
                                    + message.format(value=value))
    return sorted(set(problems))


def compute(scenario: LoadedScenario, names: list[str]) -> dict[str, dict[str, Effective]]:
    """engine -> case id -> Effective, each engine's code run in a subprocess with that engine's interpreter."""

    def one(name: str) -> dict[str, Effective]:
        spec = scenario.spec.engines[name]
        groups: dict[str, list[str]] = {}
        for case in scenario.cases:
            groups.setdefault(case.engine_params[name].model_dump_json(), []).append(case.case_id)
        dtype = scenario.spec.engine_dtype(name)
        job = SamplingJob("effective", spec.engine, spec.options, models.resolve(scenario.spec.model, dtype),
                          dtype, [{"case_id": ids[0], "params": SamplingParams.model_validate_json(p).model_dump()}
                                  for p, ids in groups.items()], spec.python, scenario.spec.engine_threads(name))
        try:
            answer = job.run()
        except SamplingJobFailed as exc:
            return {c.case_id: Effective(notes=[str(exc)]) for c in scenario.cases}
        if "unavailable" in answer:
            return {c.case_id: Effective(notes=[answer["unavailable"]]) for c in scenario.cases}
        first = {item["case_id"]: Effective.from_json(item["effective"]) for item in answer["items"]}
        return {case_id: first[ids[0]] for ids in groups.values() for case_id in ids}

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(one, names)))


def table_rows(by_engine: dict[str, Effective], everything: bool) -> list[tuple[str, list[str], bool]]:
    """(field, value per engine, differs) rows for display: the decoding mode and the differing fields (every field
    when `everything`); rejected engines show their reason."""
    differ = set(differing_fields(by_engine))
    fields = (*Effective.COMPARED, "processors") if everything else \
        [f for f in Effective.COMPARED if f == "decoding" or f in differ]
    rows = [(f, [display(getattr(e, f)) if not e.rejected else "" for e in by_engine.values()], f in differ)
            for f in fields]
    if any(e.rejected for e in by_engine.values()):
        rows.append(("rejected", [e.rejected or "-" for e in by_engine.values()], True))
    return rows


def case_groups(scenario: LoadedScenario, names: list[str],
                table: dict[str, dict[str, Effective]]) -> list[tuple[list[str], dict[str, Effective]]]:
    """Cases whose effective params are the same for every engine, grouped (most scenarios have one group)."""
    groups: dict[str, tuple[list[str], dict[str, Effective]]] = {}
    for case in scenario.cases:
        by_engine = {n: table[n][case.case_id] for n in names}
        key = repr([e.to_json() for e in by_engine.values()])
        groups.setdefault(key, ([], by_engine))[0].append(case.case_id)
    return list(groups.values())


def run_differences(names: list[str], results: list) -> list[tuple[list[str], str]]:
    """From a run's results: (cases, description) for each group of cases whose engines' effective params differ."""
    by_case: dict[str, dict[str, Effective]] = {}
    for result in results:
        if result.effective.get("decoding"):
            by_case.setdefault(result.case_id, {})[result.engine] = Effective.from_json(result.effective)
    grouped: dict[str, list[str]] = {}
    for case_id, by_engine in by_case.items():
        ordered_engines = {n: by_engine[n] for n in names if n in by_engine}
        text = describe_differences(ordered_engines) if len(ordered_engines) > 1 else ""
        if text:
            grouped.setdefault(text, []).append(case_id)
    return [(cases, text) for text, cases in grouped.items()]
