"""Effective params: what each engine really does with a case's params (computed by the engine's own code in
adapters.*_sampling), side by side, with the rows where engines differ marked; and the preflight that refuses
params an engine would reject, before anything runs."""

from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import models
from harness.core.errors import ConfigError
from harness.core.types import BEAM_EFFECTIVE, COMPARED, Effective
from harness.core.vocabulary import GREEDY_IRRELEVANT, NEUTRAL, SamplingParams
from harness.scenario.spec import LoadedScenario
from harness.semantics.jobs import SamplingJob, SamplingJobFailed


def display(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return " > ".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def comparable(effective: Effective, field: str) -> str:
    """A field's value for comparison: an engine without a penalty knob behaves as with its neutral value, and
    truncation and temperature do not matter to an engine that decodes greedily."""
    if effective.decoding == "greedy" and field in GREEDY_IRRELEVANT:
        return "-"
    value = getattr(effective, field)
    return display(NEUTRAL[field] if value is None and field in NEUTRAL else value)


def setting_text(effective: Effective, key: str) -> str:
    """How one engine treats a non-canonical setting: the value it applies, 'not applied', or 'unknown'."""
    setting = effective.extra.get(key)
    if setting is None:
        return "-"
    if setting.applied == "yes":
        return f"applies {display(setting.value)}"
    return "not applied" if setting.applied == "no" else "unknown (the server decides)"


def extra_keys(by_engine: dict[str, Effective]) -> list[str]:
    return list(dict.fromkeys(k for e in by_engine.values() for k in e.extra))


def differing_fields(by_engine: dict[str, Effective]) -> list[str]:
    """The compared fields (and non-canonical settings, by key) whose values are not the same for every engine that
    accepted the params."""
    accepted = [e for e in by_engine.values() if not e.rejected]
    penalised = [e for e in accepted if e.repetition_penalty not in (None, 1.0)]
    differ = []
    for f in COMPARED:
        group = penalised if f == "repetition_scope" else accepted  # what a penalty counts matters where it applies
        if len({comparable(e, f) for e in group}) > 1:
            differ.append(f)
    differ += [k for k in extra_keys(by_engine) if len({setting_text(e, k) for e in accepted}) > 1]
    return differ


def describe_differences(by_engine: dict[str, Effective], fields: list[str] | None = None) -> str:
    """'repetition_penalty: hf 1.1 (generation_config.json), vllm 1' for each differing field; a non-canonical
    setting is named with its file and key: 'no_repeat_ngram_size (generation_config.json: no_repeat_ngram_size):
    hf applies 3, vllm not applied'."""
    parts = []
    for field in fields if fields is not None else differing_fields(by_engine):
        if field not in COMPARED:
            source = next(e.extra[field].source for e in by_engine.values() if field in e.extra)
            parts.append(f"{field} ({source}): " + ", ".join(f"{name} {setting_text(e, field)}"
                                                             for name, e in by_engine.items()))
            continue
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
        code = scenario.description(name).sampling_code(spec.options)
        limits = getattr(importlib.import_module(code.module), "LIMITS", {}) if code else {}
        for case in scenario.cases:
            params = case.engine_params[name]
            for field, (low, high, message) in limits.items():
                value = getattr(params, field)
                if value is not None and not low <= value <= high:
                    problems.append(f"engines.{name} (case {case.case_id}): rejected by {spec.engine}: "
                                    + message.format(value=value))
    return sorted(set(problems))


def compute(scenario: LoadedScenario, names: list[str]) -> dict[str, dict[str, Effective]]:
    """engine -> case id -> Effective. Each engine's code runs in a subprocess with that engine's interpreter, one per
    interpreter and sampling module (vllm and vllm-server import vLLM once), two at a time; answers go through the
    effective-params cache that runs fill, so what a run or an earlier `params` computed is not computed again."""
    table: dict[str, dict[str, Effective]] = {}
    shared: dict[tuple[str | None, str], list[tuple[str, list[str], dict[str, Any]]]] = {}  # (engine, cases, item)
    for name in names:
        spec = scenario.spec.engines[name]
        code = scenario.description(name).sampling_code(spec.options)
        if code is None:
            table[name] = {c.case_id: Effective(notes=[f"{name} has no sampling code to run here"])
                           for c in scenario.cases}
            continue
        dtype = scenario.spec.engine_dtype(name)
        model_path = models.resolve(scenario.spec.engine_model(name), dtype)
        own = {"module": code.module, "kwargs": code.kwargs, "model_path": str(model_path), "dtype": dtype}
        groups: dict[str, list[str]] = {}
        for case in scenario.cases:
            groups.setdefault(case.engine_params[name].model_dump_json(), []).append(case.case_id)
        shared.setdefault((spec.python, code.module), []).extend(
            (name, ids, {**own, "case_id": ids[0], "params": SamplingParams.model_validate_json(p).model_dump()})
            for p, ids in groups.items())

    def one(asked: list[tuple[str, list[str], dict[str, Any]]]) -> None:
        first_name = asked[0][0]
        first = scenario.spec.engines[first_name]
        job = SamplingJob("effective", ", ".join(dict.fromkeys(name for name, _, _ in asked)),
                          scenario.description(first_name).sampling_code(first.options),
                          Path(asked[0][2]["model_path"]), asked[0][2]["dtype"], [item for _, _, item in asked],
                          first.python, scenario.spec.engine_threads(first_name), cached=True)
        try:
            answers = [Effective.model_validate(item["effective"]) for item in job.run()["items"]]
        except SamplingJobFailed as exc:
            answers = [Effective(notes=[str(exc)]) for _ in asked]
        for (name, ids, _), answer in zip(asked, answers, strict=True):
            table.setdefault(name, {}).update(dict.fromkeys(ids, answer))

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, shared.values()))
    return {name: table[name] for name in names}


def table_rows(by_engine: dict[str, Effective], everything: bool) -> list[tuple[str, list[str], bool]]:
    """(field, value per engine, differs) rows for display: the decoding mode and the differing fields (every field
    when `everything`); rejected engines show their reason."""
    differ = set(differing_fields(by_engine))
    beams = any(e.num_beams for e in by_engine.values())  # beam settings are shown whole, defaults included
    fields = (*COMPARED, "processors") if everything else \
        [f for f in COMPARED if f == "decoding" or f in differ or (beams and f in BEAM_EFFECTIVE)]
    rows = [(f, [display(getattr(e, f)) if not e.rejected else "" for e in by_engine.values()], f in differ)
            for f in fields]
    # every token-changing setting outside the canonical params is shown, whether engines differ on it or not
    rows += [(f"{key} ({next(e.extra[key].source for e in by_engine.values() if key in e.extra)})",
              [setting_text(e, key) if not e.rejected else "" for e in by_engine.values()], key in differ)
             for key in extra_keys(by_engine)]
    if any(e.rejected for e in by_engine.values()):
        rows.append(("rejected", [e.rejected or "-" for e in by_engine.values()], True))
    return rows


def case_groups(scenario: LoadedScenario, names: list[str],
                table: dict[str, dict[str, Effective]]) -> list[tuple[list[str], dict[str, Effective]]]:
    """Cases whose effective params are the same for every engine, grouped (most scenarios have one group)."""
    groups: dict[str, tuple[list[str], dict[str, Effective]]] = {}
    for case in scenario.cases:
        by_engine = {n: table[n][case.case_id] for n in names}
        key = repr([e.model_dump() for e in by_engine.values()])
        groups.setdefault(key, ([], by_engine))[0].append(case.case_id)
    return list(groups.values())


def run_differences(names: list[str], results: list) -> list[tuple[list[str], str]]:
    """From a run's results: (cases, description) for each group of cases whose engines' effective params differ."""
    by_case: dict[str, dict[str, Effective]] = {}
    for result in results:
        if result.effective.get("decoding"):
            by_case.setdefault(result.case_id, {})[result.engine] = Effective.model_validate(result.effective)
    grouped: dict[str, list[str]] = {}
    for case_id, by_engine in by_case.items():
        ordered_engines = {n: by_engine[n] for n in names if n in by_engine}
        text = describe_differences(ordered_engines) if len(ordered_engines) > 1 else ""
        if text:
            grouped.setdefault(text, []).append(case_id)
    return [(cases, text) for text, cases in grouped.items()]
