"""Every engine's requests for a scenario's cases (with the invariance checks' extra requests and configurations),
and what is left of them when a run resumes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.core.agent_requests import template_messages
from harness.core.types import Request, Result
from harness.core.vocabulary import SamplingParams
from harness.plan import invariance_checks
from harness.plan.plans import EnginePlan, engine_plan
from harness.scenario.prompts import PromptTokenizer
from harness.scenario.spec import LoadedScenario, PromptSpec


def plan_engines(scenario: LoadedScenario, run_dir: Path, prompt_ids: dict[str, list[int]]) -> list[EnginePlan]:
    spec = scenario.spec
    check = spec.sampling
    return [engine_plan(scenario, name, run_dir, [
        Request(case_id=c.case_id, prompt_ids=prompt_ids[c.prompt.id],
                params=_sample_params(c.engine_params[name], check), top_logprobs=spec.top_logprobs,
                text=c.prompt.text, num_samples=check.samples if check else 1, **agent_fields(scenario, c.prompt))
        for c in scenario.cases]) for name in spec.engines]


def agent_fields(scenario: LoadedScenario, prompt: PromptSpec) -> dict[str, Any]:
    """A chat prompt's messages with what an agent sends beside them: the tools, the tool choice, the template's
    switches."""
    if prompt.messages is None:
        return {}
    spec = scenario.spec
    return {"messages": template_messages(prompt.messages), "tools": spec.tool_dicts(),
            "tool_choice": spec.tool_choice_value(),
            "chat_template_kwargs": spec.template_kwargs(prompt)}


def all_plans(scenario: LoadedScenario, run_dir: Path, prompt_ids: dict[str, list[int]],
              tokenizer: PromptTokenizer) -> tuple[list[EnginePlan], list[invariance_checks.Check]]:
    """Every engine's plan, with the invariance checks' extra requests and engine configurations."""
    return invariance_checks.plan(scenario, plan_engines(scenario, run_dir, prompt_ids), run_dir,
                           tokenizer.encode(invariance_checks.SHARED_PREFIX))


def _sample_params(params: SamplingParams, check) -> SamplingParams:
    """For a sampling-parity run only the first `steps` tokens of each sample are drawn."""
    return params.model_copy(update={"max_new_tokens": check.steps}) if check else params


def reusable(plan: EnginePlan, journaled: dict[str, Result]) -> dict[str, Result]:
    """The journaled results a resumed run keeps: successful ones for cases the plan asks for. Engine errors are run
    again: a killed worker or server, a timeout, is what an interruption looks like, and a deterministic error
    comes back the same."""
    wanted = {r.case_id for r in plan.requests}
    return {case: r for case, r in journaled.items()
            if r.status == "ok" and r.engine == plan.name and case in wanted}


def still_to_run(plans: list[EnginePlan], done: dict[tuple[str, str], Result]) -> list[EnginePlan]:
    """Each plan narrowed to the requests without a result in `done`; plans with nothing left are dropped. An
    explicit group (an invariance check's batch, or its concurrent requests) is run again whole when any of its
    requests is missing: what it measures is how the requests behave together."""
    narrowed = [_narrowed(p, done) for p in plans]
    return [p for p in narrowed if p.requests]


def _narrowed(plan: EnginePlan, done: dict[tuple[str, str], Result]) -> EnginePlan:
    missing = lambda r: (plan.name, r.case_id) not in done  # noqa: E731
    if plan.groups is None:
        return replace(plan, requests=[r for r in plan.requests if missing(r)])
    groups = [g for g in plan.groups if any(missing(r) for r in g)]
    return replace(plan, groups=groups, requests=[r for g in groups for r in g])
