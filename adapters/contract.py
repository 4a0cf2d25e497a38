"""The engine contract: what an engine tells the harness about itself (EngineDescription), the interface its Engine
class implements inside a worker process, and helpers shared by adapters.

An engine is one module with an Engine class, an Options model and a DESCRIPTION. The harness never compares
engine names: whatever differs between engines is a field of the description (how it is made available, what it
can do, which sampling code and dialect it has). docs/adding-an-engine.md walks through writing one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from harness.core.types import EngineSetup, Request, Result, TraceRequest, TraceResult
from harness.core.vocabulary import GREEDY_IRRELEVANT, REQUEST_KNOBS, SamplingParams

DTYPES = ("float32", "bfloat16", "float16")


class EngineOptions(BaseModel):
    """Base for an adapter's options block; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class InProcessOptions(EngineOptions):
    """Options of engines whose model lives in the worker process (hf, vllm)."""

    patch: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                              description="module:function called with the loaded model, to A/B a kernel or a fusion")


@dataclass(frozen=True)
class Requirement:
    """How an engine is made available. The pinned version is read from the project's own requirements (the extra
    or engine environment named here), never written twice."""

    module: str  # the package the engine imports (its presence in the engine's interpreter is checked)
    distribution: str  # the PyPI distribution that provides it
    extra: str | None = None  # the llm-parity extra that installs it (pip install 'llm-parity[EXTRA]')
    env: str | None = None  # or the engine environment that holds it (parity env create ENV)
    cuda: bool = False  # needs a CUDA GPU in its interpreter (not when attached to a running server by url)


@dataclass(frozen=True)
class Capabilities:
    logprobs: bool = True  # per-step top-k logprobs of the raw distribution
    traces: bool = False  # teacher-forced passes capturing per-layer points (parity explain)
    # a traced pass can start each decoder layer from the reference's rows of its input (adapters.tracing.forcing),
    # where the engine's architecture map for the model has per-layer taps
    forced_layers: bool = False
    samples: bool = False  # N seeded samples of the first tokens per request (sampling parity)
    dtypes: tuple[str, ...] = DTYPES  # dtypes it runs; float64 here means it can serve as the noise floor
    server: bool = False  # talks HTTP to a server (started by the harness or attached by url)
    text: bool = True  # returns the text of its answer (False: ids only, and the text verdicts pass it over)
    beam_search: bool = False  # honours num_beams with its own search, and its sampling code runs that search
    scores: bool = False  # score(): teacher-forced top-k logprobs of a given sequence, for an engine without traces
    # attached by url, its Engine only speaks HTTP and imports no engine package: the harness runs it in a thread
    # of its own process (harness.executors.local_thread) instead of a worker process
    http_only_client: bool = False


@dataclass(frozen=True)
class LoraRules:
    """What LoRA adapters an engine applies at serving time, in its own rules (checked before any engine loads)."""

    source: str  # where the rules come from, for the error that quotes them
    ranks: tuple[int, ...] | None = None  # the ranks it can be configured for (an adapter's rank up to the largest;
    # the smallest one not below it is used); None: any rank
    modules: tuple[str, ...] | None = None  # the module names it can adapt; None: any linear layer
    package: str | None = None  # the package it applies adapters with, if not its own (checked where it runs here)
    bias: bool | None = None  # whether it applies a lora_B.bias (PEFT's lora_bias); None: its own support decides


@dataclass(frozen=True)
class SamplingCode:
    """The module holding an engine's own sampling code (`effective`, `transplant`, optionally `LIMITS`) and the
    keyword arguments that select its path."""

    module: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OwnBosRule:
    """The BOS rule an engine's own model file declares, where the engine reads a file of its own rather than the
    scenario's folder (a user's GGUF): held against the harness's prompt ids, as the folder's own rule is."""

    add_bos: bool | None  # whether prompts start with BOS (None: the file does not say)
    bos_id: int | None
    source: str  # where it says so, for the warning


@dataclass(frozen=True)
class Knob:
    """How an engine turns one invariance knob: option overrides of its baseline and of its variant configuration
    (empty: the engine as the scenario configures it; equal overrides: both sides in one configuration), or why it
    cannot (`unsupported`, naming what is missing)."""

    baseline: dict[str, Any] = field(default_factory=dict)
    variant: dict[str, Any] = field(default_factory=dict)
    unsupported: str = ""


def request_knobs(name: str, options: Any, server: bool) -> Knob:
    """The knobs every engine turns with requests alone: repeat, order, seed; and concurrency and streaming for a
    server."""
    if name == "stream" and getattr(options, "endpoint", None) == "generate":
        return Knob(unsupported="the native /generate endpoint answers unstreamed here")
    if name in REQUEST_KNOBS or (server and name in ("concurrency", "stream")):
        return Knob()
    if name == "concurrency":
        return Knob(unsupported="an in-process engine has no concurrent requests: see batch")
    if name == "stream":
        return Knob(unsupported="an in-process engine answers in one piece: streaming is a server's")
    return Knob(unsupported="this engine does not describe how to turn it")


@dataclass(frozen=True)
class LogprobMeaning:
    """What an engine returns as a token's logprob. kind in vLLM's words for the four (raw_logprobs, raw_logits,
    processed_logprobs, processed_logits; unknown where the engine does not say): raw is the model's distribution
    before any processing, processed is after the sampler's (penalties, temperature, top-k/top-p...)."""

    kind: str
    how: str  # where the numbers come from, in words

    @property
    def processed(self) -> bool:
        return self.kind.startswith("processed")


RAW_LOGPROBS = LogprobMeaning("raw_logprobs", "the log-softmax of the model's logits, before any processing")


@dataclass(frozen=True)
class EngineDescription:
    """Everything the harness needs to know about an engine. Registered by the engine's module (built-in) or through
    the `llm_parity.engines` entry-point group (third-party)."""

    name: str
    summary: str
    engine: type  # the Engine class, constructed in a worker process
    options: type[EngineOptions]
    requirement: Requirement
    capabilities: Capabilities = Capabilities()
    sampling: Callable[[Any], SamplingCode | None] | None = None  # options -> its sampling code, if it has any
    dialect: Callable[[Any], str | None] | None = None  # options -> the server dialect it speaks (server engines)
    knobs: Callable[[str, Any], Knob] | None = None  # (knob, options) -> how it turns an invariance knob
    # (model folder, build) -> the engine's own weight files made from it once, for `parity models prepare`: built
    # now when build is true, else left for first use; run where the engine's package is installed, returns one line
    # saying what is there or will be, or why nothing
    prepare: Callable[[Path, bool], str] | None = None
    # cases sent to its worker in one call unless the scenario pins batch_size; None: every case at once (an engine
    # with its own scheduler, which admits what its memory allows; a server client, which keeps its requests in flight)
    batch_size: int | None = 8
    # (model folder, options) -> the weights the engine runs, in words, where they are not the folder's own tensors
    # (a GGUF file: its real tensor-type mix); for `parity params`
    weights: Callable[[Path, Any], str | None] | None = None
    # options -> why this configuration has no beam search although the engine has one (None: it has it)
    beam_refusal: Callable[[Any], str | None] | None = None
    # options -> what a worker process must share with this configuration to load it after another engine of the
    # same kind was closed there: the settings the engine reads once per process (e.g. at import); None: a worker
    # of its own. Unset: never reused. A reused worker pays the process start and the imports once, not per engine.
    worker_reuse: Callable[[Any], tuple | None] | None = None
    # options -> the BOS rule of the engine's own model file, where the configuration names one (None: it reads the
    # scenario's folder, whose rule the harness already holds the prompt ids to)
    own_bos: Callable[[Any], OwnBosRule | None] | None = None
    lora: LoraRules | None = None  # None: it cannot apply a LoRA adapter
    # options -> why this configuration needs a CUDA GPU (None: it does not), for an engine that runs on the CPU or a
    # GPU as its options say (requirement.cuda: an engine that runs on a GPU only)
    on_cuda: Callable[[Any], str | None] | None = None
    # options -> what it returns as a logprob (unset: the raw distribution's, as Capabilities.logprobs says)
    logprobs: Callable[[Any], LogprobMeaning] | None = None

    @property
    def factory(self) -> str:
        """module:Class of the Engine, for the worker to import."""
        return f"{self.engine.__module__}:{self.engine.__qualname__}"

    def parse_options(self, options: dict[str, Any]) -> EngineOptions:
        return self.options(**options)

    def sampling_code(self, options: dict[str, Any]) -> SamplingCode | None:
        return self.sampling(self.parse_options(options)) if self.sampling else None

    def weights_note(self, model_path: Path, options: dict[str, Any]) -> str | None:
        return self.weights(model_path, self.parse_options(options)) if self.weights else None

    def reuse_settings(self, options: dict[str, Any]) -> tuple | None:
        """What a reused worker must share with this configuration; None: it gets a worker of its own."""
        return self.worker_reuse(self.parse_options(options)) if self.worker_reuse else None

    def own_bos_rule(self, options: dict[str, Any]) -> OwnBosRule | None:
        return self.own_bos(self.parse_options(options)) if self.own_bos else None

    def no_beam_search(self, options: dict[str, Any]) -> str | None:
        """Why this engine, configured so, cannot search beams; None when it can."""
        if not self.capabilities.beam_search:
            return "has no beam search"
        return self.beam_refusal(self.parse_options(options)) if self.beam_refusal else None

    def logprob_meaning(self, options: dict[str, Any]) -> LogprobMeaning:
        return self.logprobs(self.parse_options(options)) if self.logprobs else RAW_LOGPROBS

    def dialect_name(self, options: dict[str, Any]) -> str | None:
        return self.dialect(self.parse_options(options)) if self.dialect else None

    def knob(self, name: str, options: dict[str, Any]) -> Knob:
        parsed = self.parse_options(options)
        if self.knobs is not None:
            return self.knobs(name, parsed)
        return request_knobs(name, parsed, self.capabilities.server)

    def needs_cuda(self, options: dict[str, Any]) -> bool:
        return self.cuda_reason(options) is not None

    def cuda_reason(self, options: dict[str, Any]) -> str | None:
        """Why this configuration needs a CUDA GPU; None when it does not (an attached server never does)."""
        if options.get("url"):
            return None
        if self.requirement.cuda:
            return f"{self.requirement.distribution} has no CPU backend"
        return self.on_cuda(self.parse_options(options)) if self.on_cuda else None

    def dtype_problem(self, dtype: str, options: dict[str, Any]) -> str | None:
        """Why this engine cannot run the dtype (None: it can). An attached server runs whatever it was started with."""
        if dtype in self.capabilities.dtypes or (self.capabilities.server and options.get("url")):
            return None
        return f"engine {self.name} runs {', '.join(self.capabilities.dtypes)} only, not {dtype}"


class Engine(Protocol):
    """The Engine class of a description, as a worker (harness.executors.worker_main.Worker) drives it, in its own
    process or a thread of the harness (capabilities.http_only_client). It constructs it once with the setup of the
    load message, reports versions() in its ready message, sends each batch to the method its op names (generate
    here; trace and score in the protocols below, only for engines whose capabilities say so) and calls close()
    however the worker ends. mypy checks every built-in engine against these (adapters/conformance.py, mypy.ini)."""

    def __init__(self, setup: EngineSetup) -> None:
        """Load the model once: setup.model_path in setup.dtype, options validated by the engine's Options, files
        only under setup.workdir; with setup.trace, ready for trace() (hooks attached, position-skipping caches
        off). An exception here is the worker's fatal error."""

    def versions(self) -> dict[str, str]:
        """The engine package's and runtime's versions (and what the weights really are, where that differs from
        the dtype), for the run's record."""

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        """One Result per request, in any order, each as soon as it is ready. A case that fails is a Result with
        status "error"; an exception fails the batch's cases not yet yielded, and the worker stays up."""

    def reuse(self, setup: EngineSetup) -> bool:
        """Serve another plan of the same configuration with the model as loaded: the harness guarantees the same
        model, dtype and options; the plan's name, workdir, trace flag and max_context may differ (the run's engine
        tracing its cases for explain, a drift pass, a scoring pass). Take them and return True, or return False
        when the loaded engine cannot serve them (tracing needs another load mode, a longer context): the worker
        then closes it and constructs the engine anew. An engine without this method is always loaded anew."""

    def close(self) -> None:
        """Free the model and stop whatever the engine started. Called however the worker ends (op close, end of
        input, SIGTERM, the harness gone), but not when __init__ raised: stop what it started before raising."""


class TracingEngine(Engine, Protocol):
    """An engine with capabilities.traces: the worker's op trace (parity explain, drift, transplant)."""

    def trace(self, requests: list[TraceRequest]) -> Iterator[TraceResult]:
        """Teacher forcing: one pass over each request's token_ids, its points (TraceRequest.points, or every one)
        written to a file under the workdir; one TraceResult per request."""


class ScoringEngine(Engine, Protocol):
    """An engine with capabilities.scores (no traces, but it can score a given sequence): the worker's op score."""

    def score(self, requests: list[TraceRequest]) -> Iterator[Result]:
        """Teacher-forced top-k logprobs at the positions from prompt_len - 1 on, which predict the sequence's
        continuation (token_ids: the continuation); one Result per request."""


def import_object(spec: str) -> Any:
    """'package.module:attr' -> the object."""
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def apply_patch(spec: str | None, model: Any) -> None:
    """Call the user's `module:function` with the loaded model (the module is found on the worker's sys.path,
    which includes the scenario file's folder)."""
    if not spec:
        return
    try:
        function = import_object(spec)
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"patch {spec}: cannot load it ({exc}): check the module is importable from the "
                           "scenario's folder or the project") from exc
    function(model)


def greedy_ignored(params: SamplingParams) -> list[str]:
    """Warnings for the params greedy decoding makes meaningless (temperature 0 itself is how greedy is asked for)."""
    if not params.greedy:
        return []
    ignored = [n for n in GREEDY_IRRELEVANT
               if (bool(params.temperature) if n == "temperature" else getattr(params, n) is not None)]
    return [f"{n} has no effect: decoding is greedy (do_sample false)" for n in ignored]


def top_k_of(logprobs: Any, k: int) -> tuple[list, list]:
    """(values, ids) of the k best entries of a [steps, vocab] torch tensor of log-probabilities."""
    values, ids = logprobs.topk(k, dim=-1)
    return values.tolist(), ids.tolist()
