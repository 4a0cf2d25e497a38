"""Scenario files: validation (pydantic, with file:line errors) and expansion into cases."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adapters.contract import EngineDescription
from harness.core.agent_requests import Message, Tool, ToolChoice, message_order_problem
from harness.core.errors import ConfigError
from harness.core.vocabulary import KNOBS, Constraint, SamplingParams
from harness.scenario.lora_check import lora_problem
from harness.scenario.resolved import ModelResolver, ResolvedEngine, resolve_engine
from harness.scenario.yaml_source import YamlSource

Dtype = Literal["float32", "bfloat16", "float16"]
KnobName = Literal[KNOBS]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Expectation(Strict):
    """What counts as parity for a case. tokens: exact (identical ids), benign_ties (a divergence is tolerated where
    the engine took the reference's runner-up and the reference's top-2 margin is within tie_margin), any (tokens not
    checked). tie_margin unset: measured from the run, twice the largest chosen-token |delta logprob| the engine
    pair shows on steps where both chose the same token. max_logprob_delta bounds that delta. prompt: see below."""

    tokens: Literal["exact", "benign_ties", "any"] = "exact"
    # the text verdicts: exact (an answer that does not read as its own ids fails), any (reported, never failing)
    text: Literal["exact", "any"] = "exact"
    max_logprob_delta: float | None = Field(None, gt=0)
    tie_margin: float | None = Field(None, ge=0)
    prompt: Literal["warn", "strict"] = "warn"  # strict: a prompt whose ids are off (a missing or doubled BOS,
    # special tokens in its text) fails the case; warn: it is said on the case and in the reports


class Timeouts(Strict):
    load: float = Field(900, gt=0, description="seconds for a worker to load its engine")
    case: float = Field(300, gt=0, description="seconds per case")


class ExplainSettings(Strict):
    """`parity explain`: a capture point leaves the noise floor when its error exceeds k x the floor (the reference
    engine vs itself on its own weights in higher precision: float32 for bf16/fp16 scenarios, float64 for float32
    ones). Unset: the dtype's k for layer-forced passes (harness.compare.layer_floor.RULES), 10 for free ones."""

    k: float | None = Field(None, gt=1)


class SamplingCheck(Strict):
    """Sampling parity (do_sample true): each engine draws `samples` seeded samples of the first `steps` tokens per
    case; the frequencies of each prefix length are compared with the reference's by a G-test (likelihood-ratio
    chi-square), categories with an expected count under 5 pooled. A case fails when a p-value is under
    alpha / steps (Bonferroni)."""

    samples: int = Field(1000, ge=50)
    steps: int = Field(1, ge=1, le=4)
    alpha: float = Field(0.01, gt=0, lt=1)


class InvarianceSettings(Strict):
    """Invariance checks: each knob runs the scenario's cases under a baseline and a variant configuration of the
    same engine (harness.plan.invariance_checks) and compares them; a negative control (a change that must alter the
    generation) runs with them. `identical` lists the knobs that must come out bitwise identical (the gate fails
    otherwise); `samples` draws per case where a knob keeps the distribution but not the random stream
    (speculative decoding while sampling)."""

    knobs: list[KnobName] = Field(min_length=1)
    engines: list[str] | None = None  # default: every engine of the scenario
    identical: list[KnobName] = Field(default_factory=list)
    samples: int = Field(400, ge=50)
    steps: int = Field(1, ge=1, le=4)
    alpha: float = Field(0.01, gt=0, lt=1)

    @model_validator(mode="after")
    def _identical_are_run(self) -> InvarianceSettings:
        missing = [k for k in self.identical if k not in self.knobs]
        if missing:
            raise ValueError(f"identical lists knobs that are not run: {missing}: add them to knobs")
        return self


class DriftSpec(Strict):
    """Quantisation drift verdict of this engine against a full-precision baseline engine, with the measures of
    llama.cpp's `perplexity --kl-divergence` (harness.compare.drift_rules) over each case's text: the baseline's prompt
    and generated tokens, teacher-forced through both. Thresholds left unset are reported, not checked."""

    against: str | None = None  # the baseline engine (default: the reference); both must give full logits
    max_mean_kld: float | None = Field(None, gt=0)
    max_p99_kld: float | None = Field(None, gt=0)
    min_top1_agreement: float | None = Field(None, ge=0, le=1)
    max_rms_delta_p: float | None = Field(None, gt=0, le=1)
    max_ln_ppl_ratio: float | None = Field(None, gt=0)


class Resources(Strict):
    """What an engine's Ray actor asks the cluster for (--executor ray). Unset: cpus = its threads, gpus = 1 for an
    engine that needs CUDA, memory unreserved. `custom` names Ray custom resources (a node label such as
    {"H100": 1}, or anything `ray start --resources` declared). The local executor ignores this block."""

    cpus: float | None = Field(None, gt=0)
    gpus: float | None = Field(None, ge=0)
    memory_gb: float | None = Field(None, gt=0)
    custom: dict[str, float] = Field(default_factory=dict)


class EngineSpec(Strict):
    engine: str
    reference: bool = False
    # a model of its own (a merged adapter: `smollm2-135m+lora-smollm2`); prompt ids still come from the reference's
    # tokenizer, and the scenario's `lora:` does not apply to it
    model: str | None = None
    lora: str | None = None  # a LoRA adapter (named or a PEFT folder) instead of the scenario's; "none": no adapter
    options: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    dtype: Dtype | None = None
    python: str | None = None
    threads: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1, description="cases sent to the engine in one call (default: all of "
                                   "them for vLLM and a server's client, 16 for HF, 8 for the others)")
    expect: Expectation | None = None
    timeouts: Timeouts | None = None
    invariance: list[KnobName] | None = None  # this engine's knobs, instead of invariance.knobs
    drift: DriftSpec | None = None
    resources: Resources | None = None


class PromptSpec(Strict):
    id: str | None = None
    text: str | None = None
    messages: list[Message] | None = None
    token_ids: list[int] | None = None
    file: str | None = None
    # the chat template's own switches for this prompt (enable_thinking: false), over the scenario's
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _exactly_one_source(self) -> PromptSpec:
        given = [k for k in ("text", "messages", "token_ids", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a prompt needs exactly one of text, messages, token_ids, file")
        return self


class Scenario(Strict):
    name: str | None = None
    description: str = ""
    model: str
    # model: is a path on storage every node of a Ray cluster mounts (--executor ray); a named model is prepared on
    # each node instead, and a path not marked shared is refused on a remote cluster
    model_shared: bool = False
    dtype: Dtype = "float32"
    threads: int = Field(1, ge=1, description="OMP threads per engine worker")
    top_logprobs: int = Field(5, ge=1, le=20)
    engines: dict[str, EngineSpec]
    prompts: list[str | PromptSpec] = Field(min_length=1)
    params: SamplingParams = Field(default_factory=SamplingParams)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    expect: Expectation = Field(default_factory=Expectation)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    explain: ExplainSettings = Field(default_factory=ExplainSettings)
    sampling: SamplingCheck | None = None
    invariance: InvarianceSettings | None = None
    # a LoRA adapter every engine running the scenario's model applies at serving time: a named adapter
    # (harness.models.lora) or a PEFT folder
    lora: str | None = None
    # constrained output for every engine but the reference (which answers unconstrained): the constraint verdicts
    # judge those engines, and their token verdicts are informational (tokens: any) unless their expect says
    constraint: Constraint | None = None
    # what agents send (harness.core.agent_requests): OpenAI function definitions every chat prompt offers, which
    # one the model must call (unset: the API's default, auto where tools are given), the chat template's switches
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("engines")
    @classmethod
    def _one_reference(cls, engines: dict[str, EngineSpec]) -> dict[str, EngineSpec]:
        if len(engines) < 2:
            raise ValueError("a scenario compares at least two engines")
        refs = [name for name, spec in engines.items() if spec.reference]
        if len(refs) != 1:
            raise ValueError(f"exactly one engine needs reference: true (found {len(refs)})")
        return engines

    @field_validator("grid")
    @classmethod
    def _grid_keys(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        unknown = set(grid) - set(SamplingParams.model_fields)
        if unknown:
            raise ValueError(f"unknown param(s) {sorted(unknown)}; known: {sorted(SamplingParams.model_fields)}")
        return grid

    def tool_choice_value(self) -> str | dict[str, Any] | None:
        """The tool choice as the chat API takes it."""
        choice = self.tool_choice
        return choice if choice is None or isinstance(choice, str) else choice.model_dump()

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates and servers take them (None: no tools)."""
        return [t.model_dump(exclude_none=True) for t in self.tools] or None

    def template_kwargs(self, prompt: PromptSpec) -> dict[str, Any]:
        """The chat template's switches for a prompt: the scenario's, then the prompt's own."""
        return {**self.chat_template_kwargs, **(prompt.chat_template_kwargs or {})}

    @model_validator(mode="after")
    def _invariance_engines_exist(self) -> Scenario:
        unknown = [n for n in (self.invariance.engines or []) if n not in self.engines] if self.invariance else []
        if unknown:
            raise ValueError(f"invariance.engines: {unknown} not among the engines ({', '.join(self.engines)})")
        return self

    def invariance_knobs(self, name: str) -> list[str]:
        """The knobs this engine turns: its own list, else the scenario's (if it is among invariance.engines)."""
        settings, engine = self.invariance, self.engines[name]
        if engine.invariance is not None:
            return list(engine.invariance)
        if settings is None or (settings.engines is not None and name not in settings.engines):
            return []
        return list(settings.knobs)

    @property
    def reference(self) -> str:
        return next(name for name, spec in self.engines.items() if spec.reference)

    def engine_dtype(self, name: str) -> str:
        return self.engines[name].dtype or self.dtype

    def engine_model(self, name: str) -> str:
        return self.engines[name].model or self.model

    def engine_lora(self, name: str) -> str | None:
        """The adapter this engine applies: its own `lora:` ("none": none), else the scenario's where the engine
        runs the scenario's model."""
        engine = self.engines[name]
        if engine.lora is not None:
            return None if engine.lora == "none" else engine.lora
        return self.lora if engine.model is None else None

    @property
    def reference_model(self) -> str:
        """The model whose tokenizer gives every engine's prompt ids."""
        return self.engine_model(self.reference)

    def engine_threads(self, name: str) -> int:
        return self.engines[name].threads or self.threads

    def engine_expectation(self, name: str) -> Expectation:
        expectation = self.engines[name].expect or self.expect
        if self.constraint is not None and not self.engines[name].reference and self.engines[name].expect is None:
            return expectation.model_copy(update={"tokens": "any"})  # the constraint verdicts judge it
        return expectation

    def engine_timeouts(self, name: str) -> Timeouts:
        return self.engines[name].timeouts or self.timeouts

    def drift_baseline(self, name: str) -> str | None:
        """The engine a quantised engine's drift is measured against (None: no drift verdict for it)."""
        drift = self.engines[name].drift
        return None if drift is None else drift.against or self.reference


@dataclass
class Case:
    """One prompt x one grid point. Engines may override params; `engine_params` holds the merged result."""

    case_id: str
    prompt: PromptSpec
    engine_params: dict[str, SamplingParams]


@dataclass(frozen=True)
class LoadedScenario:
    path: Path
    spec: Scenario
    cases: list[Case]
    # engine -> why it cannot run these cases (a decoding mode it lacks, such as beam search): `validate` and a run
    # refuse it (exit 2), `--allow-missing` skips it
    incapable: dict[str, str] = field(default_factory=dict)
    # engine -> its type's description (adapters.registry), resolved once when the scenario is loaded
    descriptions: dict[str, EngineDescription] = field(default_factory=dict)
    # engine -> its model's folder, adapter and load key (harness.scenario.resolved), resolved once a command has
    # chosen the engines it runs (with_resolved): validating a scenario prepares no model
    resolved: dict[str, ResolvedEngine] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name or self.path.stem

    def description(self, name: str) -> EngineDescription:
        """What engine `name`'s type is and can do."""
        return self.descriptions[name]

    def engine(self, name: str) -> ResolvedEngine:
        """What engine `name` loads, as with_resolved() found it."""
        if name not in self.resolved:
            raise LookupError(f"engine {name} of {self.path} is planned before it was resolved: resolve the "
                              "scenario's engines first (LoadedScenario.with_resolved)")
        return self.resolved[name]

    def with_resolved(self, names: list[str] | None = None, resolve: ModelResolver | None = None) -> LoadedScenario:
        """A copy with these engines (default: every one) resolved; an engine resolved before keeps its record.
        resolve: how a model value becomes a folder (default harness.models.resolve)."""
        chosen = self.spec.engines if names is None else names
        fresh = {name: self.resolve_engine(name, resolve=resolve) for name in chosen if name not in self.resolved}
        return replace(self, resolved={**self.resolved, **fresh}) if fresh else self

    def resolve_engine(self, name: str, dtype: str | None = None, resolve: ModelResolver | None = None
                       ) -> ResolvedEngine:
        """Engine `name` resolved anew: in its own dtype, or in `dtype` (the noise floor's: another model folder)."""
        from harness import models

        spec, engine = self.spec, self.spec.engines[name]
        return resolve_engine(name, spec.engine_model(name), dtype or spec.engine_dtype(name), spec.engine_lora(name),
                              self.description(name), engine.python, spec.engine_threads(name), engine.options,
                              self.path, resolve or models.resolve)

    def with_cases(self, only: list[str] | None) -> LoadedScenario:
        """A copy keeping only the named cases (--case); an unknown id is a config error."""
        if not only:
            return self
        known = [c.case_id for c in self.cases]
        unknown = [c for c in only if c not in known]
        if unknown:
            raise ConfigError(f"--case: {unknown} not in {self.path} (cases: {', '.join(known)})")
        kept = [c for c in self.cases if c.case_id in only]
        searching = any(p.num_beams for c in kept for p in c.engine_params.values())
        return replace(self, cases=kept, incapable=self.incapable if searching else {})

    def with_engines(self, names: list[str]) -> LoadedScenario:
        """A copy whose spec keeps only these engines (in the scenario's order)."""
        engines = {n: e for n, e in self.spec.engines.items() if n in names}
        return replace(self, spec=self.spec.model_copy(update={"engines": engines}),
                       resolved={n: r for n, r in self.resolved.items() if n in names})


def _expand_file_prompts(source: YamlSource, spec: Scenario, index: int, prompt: PromptSpec) -> list[PromptSpec]:
    path = (source.path.parent / prompt.file).resolve()
    if not path.exists():
        raise source.error(("prompts", index, "file"), f"prompt file {path} does not exist: fix the path "
                                                       "(relative to the scenario file)")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return [PromptSpec(id=f"{prompt.id or path.stem}-{i}", text=line) for i, line in enumerate(lines)]
    prompts = []
    for i, line in enumerate(lines):
        try:
            record = PromptSpec(**json.loads(line))
        except (ValueError, TypeError) as exc:
            raise source.error(("prompts", index, "file"), f"{path.name} line {i + 1}: {exc}".splitlines()[0]) from None
        problem = message_order_problem(record.messages, spec.tools) if record.messages is not None else None
        if problem:
            raise source.error(("prompts", index, "file"), f"{path.name} line {i + 1}: messages[{problem[0]}]: "
                                                           f"{problem[1]}")
        prompts.append(record if record.id else record.model_copy(update={"id": f"{path.stem}-{i}"}))
    return prompts


def _prompts(source: YamlSource, spec: Scenario) -> list[PromptSpec]:
    prompts: list[PromptSpec] = []
    for i, raw in enumerate(spec.prompts):
        prompt = PromptSpec(text=raw) if isinstance(raw, str) else raw
        if prompt.file is not None:
            prompts.extend(_expand_file_prompts(source, spec, i, prompt))
        else:
            prompts.append(prompt if prompt.id else prompt.model_copy(update={"id": f"p{i}"}))
        problem = message_order_problem(prompt.messages, spec.tools) if prompt.messages is not None else None
        if problem:
            raise source.error(("prompts", i, "messages", problem[0]), f"{problem[1]}")
    ids = [p.id for p in prompts]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise source.error(("prompts",), f"duplicate prompt id(s) {duplicates}: give each prompt a unique id")
    return prompts


def _check_model(source: YamlSource, spec: Scenario) -> None:
    """The model is a named model or a readable HF folder, whatever the string (checked before anything uses it). A
    model_shared path is on a cluster's storage, which this machine may not mount (`parity run --plan`): only the
    string is checked here, the folder when a run resolves it."""
    from harness.core.user_paths import name_problem, shown
    from harness.models import catalog as models

    problem = models.model_problem(spec.model) if not spec.model_shared or spec.model in models.MODELS else \
        name_problem(spec.model) and f"'{shown(spec.model)}' {name_problem(spec.model)}: give the path of the folder"
    if problem:
        raise source.error(("model",), problem)
    for name, engine in spec.engines.items():
        problem = engine.model and models.model_problem(engine.model)
        if problem:
            raise source.error(("engines", name, "model"), problem)


def _tool_choice_names_a_tool(source: YamlSource, spec: Scenario) -> None:
    choice = spec.tool_choice
    if choice is None or isinstance(choice, str):
        if choice in ("auto", "required") and not spec.tools:
            raise source.error(("tool_choice",), f"{choice} but the scenario has no tools: add tools, or drop "
                                                 "tool_choice")
        return
    names = [t.function.name for t in spec.tools]
    if choice.function["name"] not in names:
        raise source.error(("tool_choice", "function", "name"), f"{choice.function['name']!r} is not among the tools "
                                                                f"({', '.join(names) or 'none'}): name one of them")


FILE_OPTIONS = ("tool_parser_plugin", "reasoning_parser_plugin", "chat_template")  # engine options naming a file


def _option_files_found(source: YamlSource, spec: Scenario) -> None:
    """Engine options that name a file (a parser plugin, a chat template) are read relative to the scenario file,
    and the file must exist; each becomes an absolute path."""
    for name, engine in spec.engines.items():
        for key in FILE_OPTIONS:
            value = engine.options.get(key)
            if not isinstance(value, str):
                continue
            path = (source.path.parent / value).resolve()
            if not path.is_file():
                raise source.error(("engines", name, "options", key), f"{value}: no such file (paths are relative "
                                                                      "to the scenario file): fix the path")
            engine.options[key] = str(path)


def _check_engines(source: YamlSource, spec: Scenario) -> dict[str, EngineDescription]:
    """Engine types must be registered, their options valid for the adapter, and their dtype one the engine runs
    (checked before anything runs). Returns each engine's description."""
    from adapters import registry
    from harness.models import catalog as models

    descriptions = {}
    for name, engine in spec.engines.items():
        try:
            description = descriptions[name] = registry.describe(engine.engine)
            description.parse_options(engine.options)
        except ConfigError as exc:
            raise source.error(("engines", name, "engine"), exc.message) from None
        except ValidationError as exc:
            raise source.validation_error(exc, ("engines", name, "options")) from None
        problem = description.dtype_problem(spec.engine_dtype(name), engine.options) or \
            models.dtype_problem(spec.engine_model(name), spec.engine_dtype(name))
        if problem:
            where = ("engines", name, "dtype") if engine.dtype else ("dtype",) if "dtype" in source.data \
                else ("engines", name)
            raise source.error(where, f"{problem}: give engine {name} a dtype it supports "
                                      f"(engines.{name}.dtype: {description.capabilities.dtypes[0]})")
    for name in spec.engines:
        _check_drift(source, spec, name, descriptions)
        problem = lora_problem(spec.engine_lora(name), spec.engine_model(name), name, descriptions[name])
        if problem:
            where = ("engines", name, "lora") if spec.engines[name].lora else ("lora",)
            raise source.error(where, problem)
    return descriptions


def _check_drift(source: YamlSource, spec: Scenario, name: str, descriptions: dict[str, EngineDescription]) -> None:
    """A drift verdict needs a baseline that is another engine of the scenario, and full logits from both."""
    baseline = spec.drift_baseline(name)
    if baseline is None:
        return
    where = ("engines", name, "drift", "against")
    if baseline not in spec.engines or baseline == name:
        raise source.error(where, f"drift baseline '{baseline}' must be another engine of this scenario "
                                  f"({', '.join(n for n in spec.engines if n != name)})")
    for engine in (name, baseline):
        kind = spec.engines[engine].engine
        if not descriptions[engine].capabilities.traces:
            raise source.error(where if engine == baseline else ("engines", name, "drift"),
                               f"engine {engine} ({kind}) cannot give full logits over a text, which a drift verdict "
                               "needs: measure drift between engines that can be traced")


MAX_CASES = 10_000  # prompts x grid points; a scenario above it is refused before anything is expanded


def _grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, values, strict=False)) for values in itertools.product(*(grid[k] for k in keys))]


def load(path: str | Path, text: str | None = None) -> LoadedScenario:
    """Read, validate and expand a scenario file (text: its content, when already known). Raises ConfigError with
    file:line and key path."""
    source = YamlSource(Path(path), text)
    if not isinstance(source.data, dict):
        raise source.error((), "a scenario file must be a mapping with model, engines, prompts")
    try:
        spec = Scenario.model_validate(source.data)
    except ValidationError as exc:
        raise source.validation_error(exc) from None
    _check_model(source, spec)
    _option_files_found(source, spec)
    _tool_choice_names_a_tool(source, spec)
    descriptions = _check_engines(source, spec)
    prompts = _prompts(source, spec)
    points = math.prod(len(values) for values in spec.grid.values())
    if len(prompts) * points > MAX_CASES:
        raise source.error(("grid",) if spec.grid else ("prompts",), (
            f"{len(prompts)} prompts x {points} grid points make {len(prompts) * points} cases, more than "
            f"{MAX_CASES}: split the scenario into several files"))
    base = spec.params.model_dump(exclude_unset=True)
    constrained = {"constraint": spec.constraint.model_dump(exclude_none=True)} if spec.constraint else {}
    cases = []
    for point in _grid_points(spec.grid):
        suffix = ",".join(f"{k}={v}" for k, v in point.items())
        for prompt in prompts:
            per_engine = {}
            for name, engine in spec.engines.items():
                try:
                    per_engine[name] = SamplingParams(**{**base, **point, **({} if engine.reference else constrained),
                                                         **engine.params})
                except ValidationError as exc:
                    where = ("engines", name, "params") if engine.params else ("grid",)
                    raise source.validation_error(exc, where) from None
            case_id = f"{prompt.id}[{suffix}]" if suffix else prompt.id
            _check_beam_case(source, spec, case_id, per_engine)
            cases.append(Case(case_id, prompt, per_engine))
    return LoadedScenario(Path(path), spec, cases, _incapable(source, spec, cases, descriptions), descriptions)


def _beam_key(spec: Scenario, engine: str) -> tuple:
    """The key path where an engine's beam search is asked for (its own params, the grid, or the shared params)."""
    if "num_beams" in spec.engines[engine].params:
        return ("engines", engine, "params", "num_beams")
    return ("grid", "num_beams") if "num_beams" in spec.grid else ("params", "num_beams")


def _check_beam_case(source: YamlSource, spec: Scenario, case_id: str, params: dict[str, SamplingParams]) -> None:
    """A case is beam search for every engine or for none: its beams are compared with the reference's."""
    searching = {name for name, p in params.items() if p.num_beams}
    if searching and len(searching) < len(params):
        other = next(n for n in params if n not in searching)
        raise source.error(_beam_key(spec, next(iter(searching))), f"case {case_id}: engine {other} does not search "
                           "beams where the others do: set num_beams for every engine of a case, or for none")


def _incapable(source: YamlSource, spec: Scenario, cases: list[Case],
               descriptions: dict[str, EngineDescription]) -> dict[str, str]:
    """Engines asked for beam search that have none: one line each, with file, line and the fix."""
    from adapters import registry

    beam_cases = [c.case_id for c in cases if any(p.num_beams for p in c.engine_params.values())]
    found = {}
    for name, engine in spec.engines.items():
        why = descriptions[name].no_beam_search(engine.options) if beam_cases else None
        if why:
            able = [n for n, d in registry.descriptions().items() if d.capabilities.beam_search]
            found[name] = source.error(_beam_key(spec, name), (
                f"engine {name} ({engine.engine}) {why}, and case(s) {', '.join(beam_cases[:3])} ask "
                f"for it: drop the engine, run it with --allow-missing to skip it, or use one that has it "
                f"({', '.join(able)})")).message
    return found
