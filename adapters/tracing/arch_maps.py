"""Architecture maps: which module of an engine's model yields which canonical capture point (the types, and the
lookup). The maps themselves are data, one module per engine: adapters/tracing/hf_maps.py and vllm_maps.py (llama.cpp
names its points in adapters/tracing/ggml_graph.py); a package of its own adds a family's maps through the
`llm_parity.arch_maps` entry point (docs/adding-an-architecture.md).

A fused module (vLLM's qkv_proj, gate_up_proj) is split into its canonical parts by sizes taken from the model
config; vLLM's decoder layer returns (hidden, residual), whose sum is the residual stream HF returns. Module paths of
per-layer taps are relative to the layer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import metadata
from typing import Any

ENTRY_POINT_GROUP = "llm_parity.arch_maps"
BUILTIN = {"hf": "adapters.tracing.hf_maps", "vllm": "adapters.tracing.vllm_maps"}  # engine -> module of its maps
GUIDE = "docs/adding-an-architecture.md"


@dataclass(frozen=True)
class Tap:
    points: tuple[str, ...]  # canonical point(s) this module yields, several when a fused output is split
    module: str  # module path (relative to the layer for per-layer taps; "" is the layer itself)
    take: str = "output"  # output (first element if a tuple) | input (first tensor argument) | inputs (the first
    # len(points) tensor arguments) | sum (of a 2-tuple output) | each (element of a tuple output)
    split: tuple[str, ...] = ()  # size names (see sizes()) splitting the last dimension into `points`
    heads_first: bool = False  # [batch, heads, seq, head_dim] (HF's per-head q/k norms), not [batch, seq, ...]
    arg: int = 0  # take "input": which tensor argument (vLLM's layer(positions, hidden_states, ...): 1)


def tap(points: str, module: str, take: str = "output", split: tuple[str, ...] = (), heads_first: bool = False,
        arg: int = 0) -> Tap:
    """A Tap with its points written as one space-separated string: tap("q k v", "self_attn.qkv_proj", ...)."""
    return Tap(tuple(points.split()), module, take, split, heads_first, arg)


@dataclass(frozen=True)
class DerivedRope:
    """Where an engine applies rope inside its attention forward, with no module whose output is the roped q and k
    (HF): q_rope and k_rope are derived from these two points and the (cos, sin) the attention module receives as
    its `position_embeddings` argument, so each layer gets its own rope (Gemma's sliding and full layers differ)."""

    q: str  # canonical point rope is applied to (q, or q_norm where per-head norms come first)
    k: str
    attention: str = "self_attn"  # the attention module, relative to the layer


@dataclass(frozen=True)
class Routes:
    """Where a mixture-of-experts layer's own routing code returns the chosen experts (adapters.tracing.routes): a
    module whose output, or an object whose `method`'s return, is a tuple holding the experts' weights and ids at
    these indices. scoring and bias (a tensor's path, relative to the layer) are how the engine scores router logits
    to choose, read only for the margin of its choice."""

    module: str  # relative to the layer
    method: str = ""  # "" : the module's forward output
    weights: int = 1
    ids: int = 2
    scoring: str = "softmax"  # softmax | sigmoid
    bias: str = ""  # a score-correction bias added to the scores before the choice


@dataclass(frozen=True)
class Feed:
    """Where a layer-forced pass puts the reference's rows (adapters.tracing.forcing): the positional argument of a
    decoder layer (and of the final norm) that holds its input hidden states; the one holding the residual, where the
    engine carries it apart (vLLM's `layer(positions, hidden_states, residual)` and `norm(hidden_states, residual)`:
    the rows go in as the hidden states and the residual as zeros, so the engine's own fused add gives back the rows);
    and the keyword of the model's forward that says each row's position ("": the rows are positions 0..n-1 of one
    sequence, HF's batch of one)."""

    hidden: int = 0
    residual: int | None = None
    norm_residual: int | None = None
    positions: str = ""


@dataclass(frozen=True)
class ArchMap:
    name: str
    layers: str  # path of the decoder layer list
    before: tuple[Tap, ...]
    per_layer: tuple[Tap, ...]
    after: tuple[Tap, ...]
    fused: tuple[str, ...] = ()  # canonical points this engine computes in a fused module, for the report
    rope: DerivedRope | None = None  # rope the adapter derives itself (None: captured, or the family has none)
    logits_softcap: str = ""  # config attribute of a final-logit soft cap the adapter applies to lm_head's output
    routes: Routes | None = None  # a mixture-of-experts family: where each layer's chosen experts are returned
    missing: str = ""  # a logits-only stand-in: why there is no per-layer map (the adapter delivers the logits)
    feed: Feed = Feed()  # where a layer-forced pass puts the reference's rows

    @property
    def final_norm(self) -> str:
        """The module path of the final norm (what the last layer's output goes into), "" where the map has none."""
        return next((t.module for t in self.after if t.points == ("final_norm",)), "")

    @property
    def logits_only(self) -> bool:
        return bool(self.missing)


@dataclass(frozen=True)
class FamilyMaps:
    """What a package registers through the `llm_parity.arch_maps` entry point: one model type's maps, by engine."""

    model_type: str  # the HF config's model_type
    maps: dict[str, ArchMap] = field(default_factory=dict)  # engine name ("hf", "vllm") -> its map


def _builtin(engine: str) -> tuple[dict[str, ArchMap], ArchMap]:
    module = importlib.import_module(BUILTIN[engine])
    return module.MAPS, module.LOGITS_ONLY


@lru_cache(maxsize=1)
def _plugins() -> tuple[dict[tuple[str, str], ArchMap], tuple[str, ...]]:
    """(engine, model_type) -> map from installed packages, and why any entry point could not be used."""
    found: dict[tuple[str, str], ArchMap] = {}
    problems = []
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            family = point.load()
            if not isinstance(family, FamilyMaps):
                raise TypeError(f"it is a {type(family).__name__}, not a FamilyMaps")
        except Exception as exc:  # a third-party map that fails to load must not break tracing of other families
            problems.append(f"arch map plugin {point.name} ({point.value}): {type(exc).__name__}: {exc}")
            continue
        for engine, arch in family.maps.items():
            if engine in BUILTIN and family.model_type in _builtin(engine)[0]:
                problems.append(f"arch map plugin {point.name}: {engine} already maps '{family.model_type}'")
                continue
            found[(engine, family.model_type)] = arch
    return found, tuple(problems)


def arch_map(engine: str, model_type: str) -> ArchMap:
    """The engine's map for a model type (built in, or from a plugin), or its logits-only stand-in saying which map
    is missing and where to learn to add one."""
    maps, logits_only = _builtin(engine)
    plugins, problems = _plugins()
    if model_type in maps:
        return maps[model_type]
    if (engine, model_type) in plugins:
        return plugins[(engine, model_type)]
    known = sorted({*maps, *(t for e, t in plugins if e == engine)})
    missing = f"no {engine} architecture map for model type '{model_type}' (known: {', '.join(known)}; {GUIDE})"
    return replace(logits_only, missing="; ".join((missing, *problems)))


def sizes(config: Any) -> dict[str, int]:
    """Widths used to split fused outputs, from an HF-style config: q, kv (per projection) and ffn."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    ffn = next((v for v in (getattr(config, name, None) for name in ("intermediate_size", "ffn_dim", "n_inner")) if v),
               4 * config.hidden_size)
    return {"q": heads * head_dim, "kv": kv_heads * head_dim, "ffn": ffn, "head_dim": head_dim}
