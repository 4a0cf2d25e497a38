"""Plans: which engine instances of a scenario run, with which requests, in which interpreter, and how an engine
that cannot run here is reported. A plan is all a worker needs; it knows nothing about how it will be executed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adapters import registry
from harness.core.errors import ConfigError, EngineUnavailable
from harness.core.types import EngineSetup, Request, TraceRequest
from harness.plan.resources import ActorResources, engine_resources
from harness.scenario.resolved import LoadKey
from harness.scenario.spec import LoadedScenario

# generate: Request -> Result; trace: TraceRequest -> TraceResult; score: TraceRequest -> Result (teacher-forced top-k
# logprobs of the sequence's continuation, from an engine that cannot be traced but can score a given text)
Op = Literal["generate", "trace", "score"]


@dataclass
class EnginePlan:
    engine: str  # the engine type (registry name)
    factory: str  # module:Class of its Engine
    package: str | None  # the engine package an in-process engine's worker imports first (timed apart from loading)
    sampling: dict[str, Any] | None  # its sampling code {"module", "kwargs"}, for effective params
    setup: EngineSetup
    python: str | None
    threads: int
    batch_size: int
    requests: list[Request] | list[TraceRequest]
    load_timeout: float
    case_timeout: float
    op: Op = "generate"
    import_paths: list[str] = field(default_factory=list)  # extra PYTHONPATH entries (the scenario's folder)
    # requests in explicit groups, each sent to the engine in one call (a batch, or concurrent requests to a
    # server); unset: `requests` in chunks of batch_size
    groups: list[list[Request]] | None = None
    model: str = ""  # the scenario's model: (a name or a path): what a Ray node resolves for itself
    model_shared: bool = False  # a model path every node mounts
    resources: ActorResources = field(default_factory=ActorResources)
    # a client of a server the harness does not start: it only sends HTTP requests, so on this machine it runs in a
    # thread of the harness rather than a process of its own (harness.executors.local_thread)
    attached_client: bool = False
    # plans with the same key may run one after another in one worker process (None: a worker of its own)
    reuse_key: tuple | None = None
    # the configuration its engine loads (model, dtype, options, interpreter): a plan of the same key may be served
    # by the engine a finished plan left loaded (Engine.reuse); None: always loaded anew
    load_key: LoadKey | None = None
    # its engine may leave process-wide state behind (a patch function can change any module): no plan reuses its
    # worker after it
    leaves_state: bool = False
    # the plan whose results for the same cases this one's requests need first (a pass compared with the reference's
    # trace as it is captured): its worker may start and load meanwhile, each batch waits for those results
    after: str | None = None
    after_done: bool = False  # it starts only once `after` has finished (to take the worker that plan leaves)

    @property
    def fed_in_pieces(self) -> bool:
        """Its cases go to the engine a few at a time (no scheduler of its own batches them all): per case the
        slowest kind of engine, so it starts first."""
        return len(self.batches()) > 1

    def batches(self) -> list[list[Request] | list[TraceRequest]]:
        if self.groups is not None:
            return [list(group) for group in self.groups]
        return [self.requests[i: i + self.batch_size] for i in range(0, len(self.requests), self.batch_size)]

    @property
    def name(self) -> str:
        return self.setup.name

    @property
    def workdir(self) -> Path:
        return self.setup.workdir

    @property
    def dtype(self) -> str:
        return self.setup.dtype


def engine_plan(scenario: LoadedScenario, name: str, run_dir: Path, requests: list, op: Op = "generate",
                dtype: str | None = None, plan_name: str | None = None,
                options: dict[str, Any] | None = None, compute_dtype: str | None = None) -> EnginePlan:
    """The plan for one engine of a scenario whose engines are resolved (LoadedScenario.with_resolved); dtype,
    plan_name and options override the scenario's (a run in another dtype, whose model folder is resolved here;
    another configuration of the engine). compute_dtype: its own weights computed in that dtype (the noise floor)."""
    spec, engine = scenario.spec, scenario.spec.engines[name]
    description = scenario.description(name)
    resolved = scenario.engine(name) if dtype is None else scenario.resolve_engine(name, dtype)
    if options is not None:
        resolved = resolved.with_options(options)
    if compute_dtype is not None:
        resolved = resolved.computing_in(compute_dtype)
    plan_name = plan_name or name
    options = resolved.options
    code = description.sampling_code(options)
    longest = max((_context(r) for r in requests), default=None)
    setup = EngineSetup(name=plan_name, model_path=resolved.model_folder, dtype=resolved.dtype, options=options,
                        workdir=run_dir / "engines" / plan_name, trace=op == "trace", max_context=longest,
                        lora=resolved.lora, weights_dtype=resolved.weights_dtype)
    timeouts = spec.engine_timeouts(name)
    package = None if description.capabilities.server else description.requirement.module
    import_paths = [str(scenario.path.parent.resolve())]
    attached = bool(description.capabilities.http_only_client and options.get("url") and not engine.python)
    shared = None if description.capabilities.server else description.reuse_settings(options)
    return EnginePlan(engine=engine.engine, factory=description.factory, package=package,
                      sampling={"module": code.module, "kwargs": code.kwargs} if code else None, setup=setup,
                      python=engine.python, threads=spec.engine_threads(name),
                      batch_size=engine.batch_size or description.batch_size or max(1, len(requests)),
                      requests=requests, load_timeout=timeouts.load,
                      case_timeout=timeouts.case, op=op,
                      import_paths=import_paths, model=resolved.model,
                      model_shared=spec.model_shared, resources=plan_resources(scenario, name, options),
                      attached_client=attached,
                      reuse_key=(description.factory, engine.python, spec.engine_threads(name), *import_paths,
                                 *shared) if shared is not None else None,
                      load_key=None if attached else resolved.load_key,
                      leaves_state=bool(options.get("patch")))


def plan_resources(scenario: LoadedScenario, name: str, options: dict[str, Any] | None = None) -> ActorResources:
    """What one of the scenario's engines asks a Ray cluster for (options: another configuration's)."""
    engine = scenario.spec.engines[name]
    needs_cuda = scenario.description(name).needs_cuda(engine.options if options is None else options)
    return engine_resources(scenario.spec.engine_threads(name), needs_cuda, engine.resources)


def _context(request: Request | TraceRequest) -> int:
    if isinstance(request, TraceRequest):
        return len(request.token_ids)
    return len(request.prompt_ids) + request.params.max_new_tokens


def select_engines(scenario: LoadedScenario, only: list[str] | None, need_reference: bool = True) -> list[str]:
    names = list(scenario.spec.engines)
    if not only:
        return names
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"--engines: {unknown} not in {scenario.path} (engines there: {', '.join(names)})")
    if need_reference and scenario.spec.reference not in only:
        raise ConfigError(f"--engines: must include the reference engine '{scenario.spec.reference}'")
    return [n for n in names if n in only]


def unavailable_engines(scenario: LoadedScenario, names: list[str], allow_missing: bool,
                        need_reference: bool = True, device: bool = True) -> dict[str, str]:
    """Engines that cannot run here, with why. Without allow_missing the first one stops the command (exit 3); with
    it they are skipped and the report says so; the reference can never be skipped when it must run. device False:
    only the engine's package is needed (its sampling code), not its device."""
    missing = {}
    for name in names:
        incapable = scenario.incapable.get(name)  # it lacks a decoding mode the cases need: a config error
        if incapable and (not allow_missing or (need_reference and name == scenario.spec.reference)):
            raise ConfigError(incapable)
        spec = scenario.spec.engines[name]
        reason = incapable or registry.availability(scenario.description(name), spec.python, spec.options, device)
        if reason and (not allow_missing or (need_reference and name == scenario.spec.reference)):
            raise EngineUnavailable(f"{scenario.path}: engines.{name}: {reason}"
                                    + ("" if allow_missing else " (or pass --allow-missing to skip it)"))
        if reason:
            missing[name] = reason
    return missing
