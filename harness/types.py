"""Boundary types shared by the harness and the adapters: sampling params, requests, results."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SamplingParams(BaseModel):
    """The canonical sampling vocabulary. None means 'not set'; adapters translate the set fields.

    do_sample defaults to (temperature > 0): leaving both unset means greedy decoding.
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0, description="0 disables top-k")
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    max_new_tokens: int = Field(32, ge=1)
    min_new_tokens: int | None = Field(None, ge=0)
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    do_sample: bool | None = None

    @model_validator(mode="after")
    def _sampling_needs_temperature(self) -> "SamplingParams":
        if self.do_sample and self.temperature == 0:
            raise ValueError("do_sample: true with temperature: 0 is contradictory; drop one of them")
        return self

    @property
    def greedy(self) -> bool:
        if self.do_sample is not None:
            return not self.do_sample
        return not self.temperature

    def set_fields(self) -> dict[str, Any]:
        """The params a scenario actually set (defaults of max_new_tokens and ignore_eos included)."""
        return self.model_dump(exclude_none=True)


@dataclass
class Request:
    """One case sent to an engine: prompt token ids (already templated and tokenised by the harness), plus the
    prompt as the scenario gave it (text or chat messages) for engines that take text, such as HTTP servers."""

    case_id: str
    prompt_ids: list[int]
    params: SamplingParams
    top_logprobs: int = 5
    text: str | None = None
    messages: list[dict[str, str]] | None = None
    num_samples: int = 1  # > 1: independent seeded samples of the first tokens (Result.samples), for sampling parity

    def to_json(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "prompt_ids": self.prompt_ids, "params": self.params.model_dump(),
                "top_logprobs": self.top_logprobs, "text": self.text, "messages": self.messages,
                "num_samples": self.num_samples}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Request":
        return cls(data["case_id"], list(data["prompt_ids"]), SamplingParams(**data["params"]),
                   int(data["top_logprobs"]), data.get("text"), data.get("messages"), int(data.get("num_samples", 1)))


@dataclass
class Translation:
    """What an adapter sent to its engine for a request, and where the meaning differs from the canonical one."""

    native_params: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


@dataclass
class Result:
    """What an engine produced for one case. Per-step arrays are top-k log-probabilities of the raw model
    distribution (before temperature, penalties and truncation), sorted best first."""

    case_id: str
    engine: str
    status: str  # "ok" | "error"
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    chosen_logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    native_params: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    error: str = ""
    effective: dict[str, Any] = field(default_factory=dict)  # Effective.to_json(), from the engine's own code
    samples: list[list[int]] = field(default_factory=list)  # token ids of each sample (Request.num_samples > 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Result":
        return cls(**data)

    @classmethod
    def engine_error(cls, case_id: str, engine: str, error: str) -> "Result":
        return cls(case_id=case_id, engine=engine, status="error", error=error)


@dataclass
class TraceRequest:
    """Teacher forcing: one forward pass over a fixed token sequence (the prompt plus the reference's generated
    tokens), capturing every canonical point (harness.trace_points) at every position."""

    case_id: str
    token_ids: list[int]
    prompt_len: int
    points: list[str] | None = None  # capture only these (e.g. ["logits"]); None: every point

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TraceRequest":
        return cls(data["case_id"], list(data["token_ids"]), int(data["prompt_len"]), data.get("points"))


@dataclass
class TraceResult:
    """Where an engine wrote a case's trace (a safetensors file of [positions, width] tensors) and what it saw."""

    case_id: str
    engine: str
    status: str  # "ok" | "error"
    path: str = ""
    points: list[str] = field(default_factory=list)
    nonfinite: dict[str, int] = field(default_factory=dict)  # point -> count of inf/NaN values
    timings: dict[str, float] = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TraceResult":
        return cls(**data)

    @classmethod
    def engine_error(cls, case_id: str, engine: str, error: str) -> "TraceResult":
        return cls(case_id=case_id, engine=engine, status="error", error=error)


@dataclass
class Effective:
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
    logits_dtype: str = ""  # the dtype the sampler works in
    processors: list[str] = field(default_factory=list)  # the engine's processing steps, in order
    sources: dict[str, str] = field(default_factory=dict)  # param -> request | generation_config.json | default
    notes: list[str] = field(default_factory=list)
    rejected: str = ""  # "rejected by ENGINE: reason" when the engine refuses the params

    COMPARED = ("decoding", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "repetition_scope",
                "frequency_penalty", "presence_penalty", "max_new_tokens", "min_new_tokens", "seed", "logits_dtype")
    NEUTRAL = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_p": 0.0}  # = no knob

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Effective":
        return cls(**data)

    @classmethod
    def refused(cls, engine: str, reason: str) -> "Effective":
        return cls(rejected=f"rejected by {engine}: {reason}")
