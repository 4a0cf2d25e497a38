"""Boundary types shared by the harness and the adapters: requests, results, traces, effective params.

Each is a pydantic model that serialises itself (model_dump / model_validate), so the worker protocol, the journals
and the run directory all carry the same typed records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.core.vocabulary import Group, SamplingParams, names

Status = Literal["ok", "error"]


class Record(BaseModel):
    """Base of the boundary types: unknown keys are errors, so a record from another layout is caught; inf and NaN
    (a -inf logprob, an implied step without one) travel as JSON's NaN/Infinity constants, not as null."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class LoraSetup(Record):
    """A LoRA adapter the engine applies at serving time: its PEFT folder, the name requests give it (a server's
    served name), its rank (for engines sized by it) and the rank the engine is configured for."""

    path: str
    name: str
    rank: int
    max_rank: int


class EngineSetup(Record):
    """What a worker hands an Engine's constructor: the engine instance's name, the model folder, dtype, its
    options block (validated by the engine's Options), a private working directory, whether it is loaded to trace,
    and the longest sequence (prompt + new tokens) the run will send it, for engines that size caches by it."""

    name: str
    model_path: Path
    dtype: str
    options: dict[str, Any] = Field(default_factory=dict)
    workdir: Path
    trace: bool = False
    max_context: int | None = None
    lora: LoraSetup | None = None  # an adapter applied at serving time (the scenario's or the engine's `lora:`)
    # the dtype the weights (and adapter) are rounded to before the model is cast to `dtype`: the noise floor computes
    # on the run's own weights in higher precision (None: loaded at `dtype`)
    weights_dtype: str | None = None


class Request(Record):
    """One case sent to an engine: prompt token ids (already templated and tokenised by the harness), plus the
    prompt as the scenario gave it (text or chat messages) for engines that take text, such as HTTP servers."""

    case_id: str
    prompt_ids: list[int]
    params: SamplingParams
    top_logprobs: int = 5
    text: str | None = None
    messages: list[dict[str, Any]] | None = None  # as chat templates take them (a call's arguments: a mapping)
    # what an agent sends with the messages (harness.core.agent_requests): tools, tool choice, template switches
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    num_samples: int = 1  # > 1: independent seeded samples of the first tokens (Result.samples), for sampling parity
    stream: bool | None = None  # a server engine streams the answer or not (the stream knob); None: as configured


class Translation(Record):
    """What an adapter sent to its engine for a request, and where the meaning differs from the canonical one."""

    native_params: dict[str, Any]
    warnings: list[str] = Field(default_factory=list)


class Beam(Record):
    """One beam a beam search returned, as the engine reported it: its generated token ids, the logprob of each
    (None where the engine gave none), their sum, and the engine's final score (cumulative logprob after its
    length penalty; None when the engine does not report one)."""

    token_ids: list[int]
    logprobs: list[float | None] = Field(default_factory=list)
    cum_logprob: float | None = None
    score: float | None = None
    finish_reason: str = ""
    text: str = ""


class Result(Record):
    """What an engine produced for one case. Per-step arrays are top-k log-probabilities of the raw model
    distribution (before temperature, penalties and truncation), sorted best first.

    finish_reason is what the engine said ("stop", "length", ...); ended_by is the harness's normalised reading of
    how the generation ended (harness.compare.ending), the same for every engine."""

    case_id: str
    engine: str
    status: Status
    prompt_ids: list[int] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    chosen_logprobs: list[float] = Field(default_factory=list)
    top_ids: list[list[int]] = Field(default_factory=list)
    top_logprobs: list[list[float]] = Field(default_factory=list)
    native_params: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    error: str = ""
    effective: dict[str, Any] = Field(default_factory=dict)  # Effective.to_json(), from the engine's own code
    samples: list[list[int]] = Field(default_factory=list)  # token ids of each sample (Request.num_samples > 1)
    beams: list[Beam] = Field(default_factory=list)  # beam search: the returned beams, best first (token_ids: best)
    usage: dict[str, int] = Field(default_factory=dict)  # a server's reported token counts (prompt_tokens, ...)
    deltas: list[str] = Field(default_factory=list)  # a streamed answer's text, chunk by chunk (empty: unstreamed)
    # a chat answer as the server split it (content, reasoning, tool_calls: [{name, arguments}] with the arguments
    # text as sent, a streamed answer's deltas joined per call); empty where the server split nothing
    message: dict[str, Any] = Field(default_factory=dict)

    def applied(self, param: str) -> bool:
        """Whether the engine applied a param: its adapter warns `param=... NOT APPLIED` where it did not."""
        return not any(w.startswith(f"{param}=") and "NOT APPLIED" in w for w in self.warnings)

    @classmethod
    def engine_error(cls, case_id: str, engine: str, error: str) -> Result:
        return cls(case_id=case_id, engine=engine, status="error", error=error)


class TraceRequest(Record):
    """Teacher forcing: one forward pass over a fixed token sequence (the prompt plus the reference's generated
    tokens), capturing every canonical point (harness.core.points) at every position."""

    case_id: str
    token_ids: list[int]
    prompt_len: int
    points: list[str] | None = None  # capture only these (e.g. ["logits"]); None: every point
    # the reference's trace of the same sequence: the engine compares as it captures and stores per-position metrics
    # (TraceResult.errors), and the rows only of the `keep` points (None: every point); None: store every row
    against: str | None = None
    keep: list[str] | None = None
    trace_dir: str | None = None  # where the trace file goes (None: the engine's traces folder)
    threads: int | None = None  # threads the pass may use, where the engine can change them per pass (None: its own)
    # a layer-forced pass: the reference's trace whose rows of each decoder layer's input (the embeddings, the residual
    # stream after the layer before) replace the engine's own, so each layer's points measure what that layer adds
    inputs_from: str | None = None


class TraceResult(Record):
    """Where an engine wrote a case's trace (a safetensors file of [positions, width] tensors) and what it saw."""

    case_id: str
    engine: str
    status: Status
    path: str = ""
    points: list[str] = Field(default_factory=list)
    nonfinite: dict[str, int] = Field(default_factory=dict)  # point -> count of inf/NaN values
    timings: dict[str, float] = Field(default_factory=dict)
    error: str = ""
    errors: str = ""  # a compared pass (TraceRequest.against): its per-position metrics file
    routes: str = ""  # a mixture-of-experts model: the chosen experts' table (adapters.tracing.routes)
    threads: int | None = None  # threads the pass ran on, where the engine sets them per pass (TraceRequest.threads)
    forced: bool = False  # its layers started from the reference's rows (TraceRequest.inputs_from)

    @classmethod
    def engine_error(cls, case_id: str, engine: str, error: str) -> TraceResult:
        return cls(case_id=case_id, engine=engine, status="error", error=error)


class Setting(Record):
    """A token-changing setting outside the canonical params (a generation_config.json field such as
    no_repeat_ngram_size, a logits processor or stopping rule an engine builds on its own) and what one engine
    does with it: applied (with the value it applies), not applied, or unknown (a server decides)."""

    value: Any = None
    applied: Literal["yes", "no", "unknown"] = "yes"
    source: str = ""  # file and key it comes from ("generation_config.json: no_repeat_ngram_size"), or "engine default"
    note: str = ""


class Effective(Record):
    """What an engine will really do with a request's params, computed by the engine's own code (config merges,
    clamps, greedy rewrites), or why it rejects them. None means the engine has no such knob (or it is unused)."""

    decoding: str = ""  # greedy | sampling
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    repetition_scope: str = ""  # which tokens the repetition penalty counts
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    seed: int | None = None
    num_beams: int | None = None
    length_penalty: float | None = None
    beam_length: str = ""  # what length a finished beam's score is divided by (length_penalty's base)
    early_stopping: str | None = None  # when the search may end before max_new_tokens, in the engine's terms
    beam_candidates: str = ""  # which candidates may finish a beam (EOS) at each step
    num_return_sequences: int | None = None
    stop_token_ids: list[int] | None = None  # the request's ids that end generation besides the EOS
    # whether a stop string, or a stop token's text where special tokens are kept, ends the text; None: neither
    include_stop_str_in_output: bool | None = None
    no_repeat_ngram_size: int | None = None
    logit_bias: dict[int, float] | None = None
    bad_words: list[list[int]] | None = None  # the token sequences banned for the request's bad words
    constraint: str | None = None  # the constrained output it applies, described; None: unconstrained
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None  # None where special tokens are skipped (nothing to space)
    logits_dtype: str = ""  # the dtype the sampler works in
    processors: list[str] = Field(default_factory=list)  # the engine's processing steps, in order
    sources: dict[str, str] = Field(default_factory=dict)  # param -> request | generation_config.json | default
    notes: list[str] = Field(default_factory=list)
    rejected: str = ""  # "rejected by ENGINE: reason" when the engine refuses the params
    extra: dict[str, Setting] = Field(default_factory=dict)  # non-canonical settings, by name

    @classmethod
    def refused(cls, engine: str, reason: str) -> Effective:
        return cls(rejected=f"rejected by {engine}: {reason}")


# The beam-search settings of an engine: the canonical beam params and the rules its search follows.
BEAM_EFFECTIVE: tuple[str, ...] = (*[n for n in names(Group.BEAM) if n in Effective.model_fields], "beam_length",
                                   "beam_candidates")
# The fields compared between engines: the decoding mode, every canonical param that shapes the distribution or the
# length (from the vocabulary), what the repetition penalty counts, and the dtype the sampler works in.
COMPARED: tuple[str, ...] = (
    "decoding", *[n for n in names(Group.DECODING, Group.TRUNCATION, Group.PENALTY) if n in Effective.model_fields],
    "repetition_scope", *[n for n in names(Group.LENGTH, Group.RANDOMNESS) if n in Effective.model_fields],
    *BEAM_EFFECTIVE, *[n for n in names(Group.CONSTRAINT, Group.DETOKENISATION) if n in Effective.model_fields],
    "logits_dtype")
