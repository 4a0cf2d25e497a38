"""The reference model as the only source of next-token logits for the engines' own beam-search loops.

`parity explain` runs each engine's beam-search loop (HF's `_beam_search`, vLLM's offline and server loops) on these
logits instead of the engine's own, so that two loops fed the same numbers can be told apart from two engines whose
numbers differ. The logits of a sequence are a pure function of it: the prompt is prefilled once, every longer
sequence extends its parent's KV cache by one token, and answers are memoised; whichever loop asks, in whichever
process, gets the same float32 row. Every query is logged, so the beams a loop kept alive at each step are known.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from pathlib import Path
from typing import Any

KV_KEPT = 256  # KV caches kept for extension (an evicted one is recomputed along the same path: same numbers)


class Oracle:
    def __init__(self, model_path: Path, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model.eval()
        self.forward = self.model.forward  # the model's own forward, even while a loop replaces model.forward
        self.prompt: tuple[int, ...] = ()
        self.memo: dict[tuple[int, ...], Any] = {}
        self.kv: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.queried: list[tuple[int, ...]] = []  # generated tokens of each sequence a loop asked about, in order

    def start(self, prompt_ids: list[int]) -> None:
        """A new loop: an empty query log; for a new prompt, memoised rows of the previous one are dropped."""
        if tuple(prompt_ids) != self.prompt:
            self.prompt = tuple(prompt_ids)
            self.memo.clear()
            self.kv.clear()
        self.queried = []

    def logits(self, sequence: list[int] | tuple[int, ...]) -> Any:
        """The float32 next-token logits after `sequence` (the prompt + generated tokens), logged as a query."""
        key = tuple(int(t) for t in sequence)
        self.queried.append(key[len(self.prompt):])
        return self._row(key)

    def logprobs_of(self, generated: list[int]) -> list[float]:
        """The log-probability of each generated token after the prompt and the tokens before it (not logged)."""
        rows = [self._row(self.prompt + tuple(generated[:i])) for i in range(len(generated))]
        return [float(row.log_softmax(-1)[token]) for row, token in zip(rows, generated)]

    def _row(self, key: tuple[int, ...]) -> Any:
        if key not in self.memo:
            self._compute(key)
        return self.memo[key]

    def _compute(self, key: tuple[int, ...]) -> None:
        """Logits and KV cache of `key`: the prompt prefilled, or the parent's cache extended by the last token."""
        torch = self.torch
        if len(key) < len(self.prompt) or key[: len(self.prompt)] != self.prompt:
            raise ValueError("the oracle answers for sequences that start with its case's prompt only")
        with torch.inference_mode():
            if len(key) == len(self.prompt):
                out = self.forward(input_ids=torch.tensor([key]), use_cache=True)
            else:
                parent = key[:-1]
                if parent not in self.kv:
                    self._compute(parent)
                cache = copy.deepcopy(self.kv[parent])
                out = self.forward(input_ids=torch.tensor([key[-1:]]), past_key_values=cache, use_cache=True)
        self.memo[key] = out.logits[0, -1].to(torch.float32)
        self.kv[key] = out.past_key_values
        while len(self.kv) > KV_KEPT:
            self.kv.popitem(last=False)

    def steps(self) -> list[list[list[int]]]:
        """The sequences the loop asked about, grouped by generated length: the beams alive at each step."""
        by_step: dict[int, dict[tuple[int, ...], None]] = {}
        for generated in self.queried:
            by_step.setdefault(len(generated), {})[generated] = None
        return [[list(g) for g in by_step.get(step, {})] for step in range(max(by_step, default=-1) + 1)]
