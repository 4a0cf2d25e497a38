"""explain/localisation.json, defined once: what `parity explain` writes (harness.explain) and the report reads
(harness.report.investigations): per case and engine, where the engines part and why."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class CurvePoint(BaseModel):
    """The residual stream after one layer: its relative error (worst position; a forced pass: what the layer added,
    its worst block's) and the noise floor there."""

    layer: int
    error: float
    floor: float


class Localisation(BaseModel):
    case_id: str
    engine: str
    reference: str
    # prompt | hazard | component | logits (beyond the floor where only the logits were compared) | sampler |
    # near_tie | beyond_noise (tokens part beyond the measured noise, nothing out of a floor) | ending | none |
    # no_trace | untraced | length (a difference only a pass up to the divergent step shows)
    cause: str
    verdict: str
    k: float | None = None  # the threshold: a point leaves the noise floor above k x the floor
    first_step: int | None = None
    divergence: dict[str, Any] | None = None
    first_difference: dict[str, Any] | None = None
    out_of_floor: dict[str, Any] | None = None
    curve: list[CurvePoint] = Field(default_factory=list)
    routing: dict[str, Any] | None = None  # a mixture-of-experts model: the first routing difference and the grid
    adapter: dict[str, Any] | None = None  # LoRA at serving time: the engines' updates compared (adapter_reading)
    forced: bool = False  # each layer of the engine's pass started from the reference's input
    # the smallest change the comparison tells from rounding: {threshold (relative L2), point} (a forced pass)
    sensitivity: dict[str, Any] | None = None


class ExplainFile(BaseModel):
    """The whole file: the threshold and the floor's run, what ran (cases, each pass's engine: load time, model
    loads, versions; the passes started during the run and the engines beside them), notes, the localisations."""

    k: float
    floor: str  # what the noise floor is made of (the reference in a higher precision), or the dtype's rounding unit
    free_floor: str | None = None  # the floor of the engines whose layers ran free, where some did
    forced: list[str] = Field(default_factory=list)  # the engines whose layers started from the reference's input
    cases: list[str] = Field(default_factory=list)
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)
    during_run: dict[str, Any] | None = None
    notes: list[str] = Field(default_factory=list)
    localisations: list[Localisation]
