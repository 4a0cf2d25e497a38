"""How a tensor-parallel engine splits a layer's capture points over its ranks (vLLM's Megatron-style layout), and
the same in words.

Column-parallel outputs are split along their width: q, k and v by heads (each rank computes heads/ranks query
heads and kv_heads/ranks KV heads; with fewer KV heads than ranks each rank holds one, copied: rank r holds KV head
r * kv_heads // ranks), the MLP's gate and up by intermediate units. The attention output, the row-parallel o_proj's
input, is split like q. Everything else is whole in every rank: row-parallel outputs are read after their all-reduce,
the residual stream and norms are copied, and vLLM's logits are all-gathered.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

QUERY_POINTS = frozenset({"q", "q_rope", "q_norm", "attn"})
KV_POINTS = frozenset({"k", "v", "k_rope", "k_norm"})
UNIT_POINTS = frozenset({"gate", "up"})
SHARDED_POINTS = QUERY_POINTS | KV_POINTS | UNIT_POINTS


@dataclass(frozen=True)
class ShardLayout:
    ranks: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int

    @classmethod
    def of(cls, ranks: int, sizes: dict[str, int]) -> ShardLayout:
        """From an architecture's full widths (adapters.tracing.arch_maps.sizes)."""
        head_dim = sizes["head_dim"]
        return cls(ranks, sizes["q"] // head_dim, sizes["kv"] // head_dim, head_dim, sizes["ffn"])

    def problem(self) -> str:
        """Why a model of these widths cannot be split over these ranks ('' where it can), as vLLM refuses it."""
        if self.heads % self.ranks:
            return f"its {self.heads} attention heads cannot be split over {self.ranks} tensor-parallel ranks"
        if self.kv_heads % self.ranks and self.ranks % self.kv_heads:
            return f"its {self.kv_heads} KV heads cannot be split over or copied to {self.ranks} ranks"
        return ""

    def rank_sizes(self) -> dict[str, int]:
        """The widths one rank's fused outputs are split by (the ranks' own q, kv and ffn)."""
        kv_heads = max(1, self.kv_heads // self.ranks)
        return {"q": self.heads // self.ranks * self.head_dim, "kv": kv_heads * self.head_dim,
                "ffn": self.ffn // self.ranks, "head_dim": self.head_dim}

    def holders(self, point: str) -> list[int]:
        """The ranks whose shards of a point, joined in this order, make the whole point: every rank, except that
        KV heads copied to several ranks are taken once, from the first rank holding each."""
        if point in KV_POINTS and self.kv_heads < self.ranks:
            return [head * self.ranks // self.kv_heads for head in range(self.kv_heads)]
        return list(range(self.ranks))

    def shard_words(self, point: str, rank: int) -> str:
        """What a rank's shard of a point holds, in words."""
        if point in QUERY_POINTS:
            return _span("query head", rank, self.heads // self.ranks, self.heads)
        if point in KV_POINTS:
            if self.kv_heads < self.ranks:
                return f"KV head {rank * self.kv_heads // self.ranks} of {self.kv_heads}, copied to other ranks"
            return _span("KV head", rank, self.kv_heads // self.ranks, self.kv_heads)
        return _span("intermediate unit", rank, self.ffn // self.ranks, self.ffn)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _span(what: str, rank: int, each: int, total: int) -> str:
    first, last = rank * each, (rank + 1) * each - 1
    return f"{what} {first} of {total}" if first == last else f"{what}s {first}-{last} of {total}"


@dataclass(frozen=True)
class ShardReading:
    ranks: list[int]  # the ranks whose shard holds the difference (empty: alike in every rank's)
    words: str


def shard_reading(point: str, errors: dict[int, float], layout: ShardLayout) -> ShardReading | None:
    """Where in the ranks a point's difference lives, from each holding rank's relative error against the reference
    (None for fewer than two). A rank is named when its error is over 10 times the smallest rank's (a fault in its
    shard); where none is, the difference is alike in every rank's shard (the computation, not one shard's weights)."""
    if len(errors) < 2:
        return None
    low = min(errors.values())
    named = [rank for rank, error in sorted(errors.items()) if error > 10 * low]
    each = ", ".join(f"{error:.3g} in rank {rank}'s" for rank, error in sorted(errors.items()))
    if not named:
        return ShardReading([], f"alike in every rank's shard (relative error {each})")
    where = " and ".join(f"rank {rank}'s shard ({layout.shard_words(point, rank)})" for rank in named)
    return ShardReading(named, f"in {where} only (relative error {each})")


def shard_readings(metadata: dict[str, str]) -> dict[str, ShardReading]:
    """Each split point's reading, from a joined trace's metadata (adapters.tracing.ranks); none for one rank."""
    if "tensor_parallel" not in metadata:
        return {}
    layout = ShardLayout(**json.loads(metadata["tensor_parallel"]))
    readings = {point: shard_reading(point.rsplit(".", 1)[-1], {int(r): e for r, e in errors.items()}, layout)
                for point, errors in json.loads(metadata.get("shard_errors", "{}")).items()}
    return {point: reading for point, reading in readings.items() if reading is not None}
