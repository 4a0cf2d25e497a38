"""Invariance checks: the same engine against itself. Each knob runs the scenario's cases under a baseline and a
variant configuration of one engine; a negative control (a change that must alter the generation) runs with them.

How requests are arranged is the harness's (alone or in one batch, in order or reversed, one at a time or all at
once, behind a warm shared prefix, sampled with a seed); how an engine's configuration changes is the engine's
(EngineDescription.knob: option overrides, or why it cannot). Every distinct configuration is one engine load; the
scenario's own configuration is the worker that also serves the engine comparison, and a baseline that would repeat
the comparison's own calls exactly is judged on its results instead of being sent again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from adapters.contract import Knob
from harness.core.types import Request
from harness.core.vocabulary import SamplingParams
from harness.plan.plans import EnginePlan, engine_plan
from harness.scenario.spec import LoadedScenario

SEED = 1234
CONTROL_PENALTY = 0.3  # the negative control of a greedy scenario: repetition_penalty raised by this much
# A shared prefix for the cache knobs (about 190 tokens with SmolLM2's tokenizer): long enough to fill several KV
# cache blocks and several 32-token prefill chunks.
SHARED_PREFIX = (
    "The following is a record of a long conversation held in a quiet library on a rainy afternoon. Two friends "
    "who had not seen each other for many years sat by the window and talked about the towns they had lived in, "
    "the books they had read, the trains they had taken across the mountains, the gardens they had planted and "
    "lost, and the people they had met along the way. Neither of them was in a hurry. The rain kept falling on the "
    "glass, the lamps were lit one by one, and the librarian brought them tea twice without being asked. What "
    "follows is one of the questions that came up near the end of that afternoon, and the answer given to it. ")
WORDS = {  # knob -> (baseline, variant), in words for the report
    "repeat": ("the cases in one call", "the same call again"),
    "batch": ("each case alone", "all cases in one batch"),
    "order": ("the cases in scenario order", "the same batch reversed"),
    "concurrency": ("one request at a time", "all requests at once"),
    "prefix_cache": ("prefix caching off", "prefix caching on, warmed by the shared prefix sent first"),
    "chunked_prefill": ("chunked prefill off", "chunked prefill on, 32-token chunks"),
    "speculative": ("no speculative decoding", "n-gram speculative decoding"),
    "batch_invariant": ("VLLM_BATCH_INVARIANT=1, each case alone", "VLLM_BATCH_INVARIANT=1, one batch"),
    "stream": ("each answer in one piece", "the same requests streamed"),
    "tensor_parallel": ("the model on one rank", "the model split over two tensor-parallel ranks"),
    "compile": ("eager mode", "the compiled graph"),
}


@dataclass
class Side:
    config: str  # the plan (engine configuration) that serves this side
    requests: list[Request]  # judged, in case order
    groups: list[list[Request]]  # how they are sent (each group in one engine call), warm-up groups included
    words: str


@dataclass
class Check:
    engine: str
    knob: str
    baseline: Side | None = None
    variant: Side | None = None
    control: bool = False
    sampled: bool = False  # judged by a G-test on samples
    unsupported: str = ""
    exclusive: set[str] = field(default_factory=set)  # configurations that exist only for this check


def plan(scenario: LoadedScenario, base_plans: list[EnginePlan], run_dir: Path,
         prefix_ids: list[int]) -> tuple[list[EnginePlan], list[Check]]:
    """The run's plans with the invariance work added (the base configurations keep their comparison batches
    first), and the checks to judge once the results are in."""
    spec = scenario.spec
    plans = {p.name: p for p in base_plans}
    extra_groups: dict[str, list[list[Request]]] = {}
    overrides_of: dict[str, dict[str, Any]] = {}
    checks: list[Check] = []
    for name in spec.engines:
        knobs = spec.invariance_knobs(name)
        if not knobs:
            continue
        cases = list(plans[name].requests)
        mine = [_check(scenario, name, knob, cases, prefix_ids) for knob in knobs] + [_control(name, cases)]
        if "seed" in knobs:
            mine.append(_seed_control(name, cases))
        for check in (c for c in mine if not c.unsupported):
            for side, which in ((check.baseline, "baseline"), (check.variant, "variant")):
                overrides = {} if check.control else _changes(spec.engines[name].options,
                                                               getattr(_knob(scenario, check), which))
                side.config = _config_name(name, overrides)
                if which == "baseline" and _repeats_the_comparison(side, plans[name]):
                    side.requests, side.groups = cases, []  # judged on the comparison's own results
                overrides_of[side.config] = overrides
                extra_groups.setdefault(side.config, []).extend(side.groups)
        checks += mine
    users: dict[str, set[tuple[str, str]]] = {}
    for check in checks:
        for side in (check.baseline, check.variant):
            if side is not None:
                users.setdefault(side.config, set()).add((check.engine, check.knob))
    for check in checks:
        check.exclusive = {s.config for s in (check.baseline, check.variant) if s is not None
                           and s.config not in plans and users[s.config] == {(check.engine, check.knob)}}
    out = []
    for base in base_plans:
        groups = extra_groups.pop(base.name, [])
        out.append(replace(base, requests=[*base.requests, *[r for g in groups for r in g]],
                           groups=[*base.batches(), *groups]) if groups else base)
    for config, groups in extra_groups.items():
        engine = config.split("~", 1)[0]
        options = {**spec.engines[engine].options, **overrides_of[config]}
        requests = [r for g in groups for r in g]
        extra = engine_plan(scenario, engine, run_dir, requests, plan_name=config, options=options)
        out.append(replace(extra, groups=groups))
    return out, checks


def _repeats_the_comparison(side: Side, base: EnginePlan) -> bool:
    """Whether a baseline would send the scenario's cases, unchanged, in the very calls the engine comparison makes
    under the scenario's own configuration: then its results are the comparison's, and nothing is sent again. (Never
    a variant: `repeat` compares the comparison's call with the same call made again.)"""
    if side.config != base.name:
        return False
    original = {r.case_id: r for r in base.requests}
    for request in side.requests:
        case_id = request.case_id.split("#", 1)[0]
        if request.model_copy(update={"case_id": case_id}) != original.get(case_id):
            return False
    calls = [[r.case_id.split("#", 1)[0] for r in group] for group in side.groups]
    return calls == [[r.case_id for r in group] for group in base.batches()]


def _knob(scenario: LoadedScenario, check: Check) -> Knob:
    engine = scenario.spec.engines[check.engine]
    return scenario.description(check.engine).knob(check.knob, engine.options)


def _changes(options: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides that change the engine's scenario configuration: a knob side that sets an option to the value
    the scenario already gives it runs on the engine's own configuration (no second load of the same engine)."""
    return {key: value for key, value in overrides.items() if key not in options or options[key] != value}


def _config_name(engine: str, overrides: dict[str, Any]) -> str:
    """The engine's name for its scenario configuration, `engine~option=value,...` for another one."""
    if not overrides:
        return engine
    slug = ",".join(f"{k}={v.get('method', 'custom') if isinstance(v, dict) else v}"
                    for k, v in sorted(overrides.items()))
    return f"{engine}~{re.sub(r'[^A-Za-z0-9_.=,-]+', '-', slug)[:80]}"


def _copy(requests: list[Request], tag: str, prefix: list[int] | None = None, samples: int = 1, steps: int = 0,
          **update: Any) -> list[Request]:
    """The cases under new ids (`case#tag`), optionally behind a shared prefix, sampled, or with params changed."""
    out = []
    for r in requests:
        params = r.params.model_copy(update=update) if update else r.params
        if steps:
            params = params.model_copy(update={"max_new_tokens": steps})
        out.append(r.model_copy(update={"case_id": f"{r.case_id}#{tag}", "params": SamplingParams.model_validate(
            params.model_dump()), "prompt_ids": [*(prefix or []), *r.prompt_ids], "num_samples": samples,
            "text": None if prefix else r.text, "messages": None if prefix else r.messages}))
    return out


def _check(scenario: LoadedScenario, engine: str, knob: str, cases: list[Request], prefix_ids: list[int]) -> Check:
    settings = scenario.spec.invariance
    check = Check(engine, knob)
    turned = _knob(scenario, check)
    if turned.unsupported:
        check.unsupported = turned.unsupported
        return check
    base, variant = WORDS.get(knob, ("", ""))
    if knob == "seed":
        seed = cases[0].params.seed if cases[0].params.seed is not None else SEED
        sampled = {"do_sample": True, "temperature": cases[0].params.temperature or 1.0, "seed": seed}
        a, b = _copy(cases, "seed.a", **sampled), _copy(cases, "seed.b", **sampled)
        check.baseline, check.variant = Side("", a, [a], f"sampling, seed {seed}"), Side("", b, [b], "the same seed")
        return check
    prefix = prefix_ids if knob in ("prefix_cache", "chunked_prefill") else None
    sampled = knob == "speculative" and not cases[0].params.greedy
    samples = settings.samples if sampled and settings else 1
    steps = settings.steps if sampled and settings else 0
    unseeded = {"seed": None} if sampled else {}  # a G-test needs no seed (vLLM's CPU rejection sampler cannot
    # rewind a per-request generator: seeded sampling with speculative decoding raises there)
    a = _copy(cases, f"{knob}.base", prefix, samples, steps, **unseeded)
    b = _copy(cases, f"{knob}.variant", prefix, samples, steps, **unseeded)
    if knob == "stream":
        a, b = [r.model_copy(update={"stream": False}) for r in a], [r.model_copy(update={"stream": True}) for r in b]
    alone = [[r] for r in a]
    groups = {"batch": (alone, [b]), "concurrency": (alone, [b]), "order": ([a], [list(reversed(b))]),
              "batch_invariant": (alone, [b])}.get(knob, ([a], [b]))
    if sampled:  # many samples per case: one case per call (vLLM on CPU fails seeded n>1 batches of several)
        groups = (alone, [[r] for r in b])
    if knob == "prefix_cache":  # the variant's cache is warmed by the shared prefix alone first
        warm = _copy(cases[:1], "prefix_cache.warm", prefix, max_new_tokens=1)
        warm[0] = warm[0].model_copy(update={"prompt_ids": list(prefix_ids)})
        groups = ([a], [warm, b])
    check.baseline, check.variant = Side("", a, groups[0], base), Side("", b, groups[1], variant)
    check.sampled = sampled
    return check


def _control(engine: str, cases: list[Request]) -> Check:
    """A change that must alter the generation: another seed when sampling, a repetition penalty when greedy."""
    params = cases[0].params
    a = _copy(cases, "control.base")
    if params.greedy:
        penalty = round((params.repetition_penalty or 1.0) + CONTROL_PENALTY, 3)
        b, words = _copy(cases, "control.variant", repetition_penalty=penalty), f"repetition_penalty {penalty}"
    else:
        seed = (params.seed if params.seed is not None else SEED) + 1
        b, words = _copy(cases, "control.variant", seed=seed), f"seed {seed}"
    return Check(engine, "control", Side("", a, [a], "the scenario's params"), Side("", b, [b], words), control=True)


def _seed_control(engine: str, cases: list[Request]) -> Check:
    seed = cases[0].params.seed if cases[0].params.seed is not None else SEED
    sampled = {"do_sample": True, "temperature": cases[0].params.temperature or 1.0}
    a = _copy(cases, "seed-control.a", seed=seed, **sampled)
    b = _copy(cases, "seed-control.b", seed=seed + 1, **sampled)
    return Check(engine, "seed-control", Side("", a, [a], f"sampling, seed {seed}"),
                 Side("", b, [b], f"seed {seed + 1}"), control=True)
