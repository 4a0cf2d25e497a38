"""Runs engines' own sampling code (no model weights, no generation) in the engine's interpreter:
`python -m adapters.sampling.worker < job.json` prints one JSON document.

job: {"task": "effective" | "transplant", "module": the engine's sampling module, "kwargs": {...},
      "model_path": str, "dtype": str, "items": [...], "cached": answers through the effective-params cache}
  effective items:  {"case_id", "params"} (+ an engine's own "module", "kwargs", "model_path", "dtype")
                                                                       -> {"case_id", "effective"}
  transplant items: {"case_id", "variant", "params", "token_ids", "prompt_len", "logits_path", "out_path"}
                    (+ "engine" and the engine's own "module", "kwargs", "model_path", "dtype")
                    -> {"case_id", "variant", "engine", "path", "steps", "sampling", "hazards"} or {..., "error"}
  beams items:      {"case_id", "engine", "module", "kwargs" (its sampling code), "params", "prompt_ids",
                     "real": [token ids of each beam the engine returned]}
                    -> {"case_id", "engine", "beams", "steps", "real_logprobs"} or {"case_id", "engine", "error"}
The logits file is a trace (safetensors with a `logits` tensor whose first row is position `logits_from` of its
metadata, 0 if absent); step s of a case uses the row of position prompt_len + s - 1, cast to the engine's dtype
(the logits that engine's sampler would receive).
For beams, model_path and dtype are the reference's: the engine's own beam-search loop runs on the reference model's
logits (adapters.sampling.oracle); `steps` are the beams it kept alive at each step, `real_logprobs` the oracle's
logprob of each token of the engine's real beams.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from adapters.sampling.common import Recorder
from adapters.sampling.effective_cache import effective_for
from harness.core.vocabulary import SamplingParams

ITEM_OVERRIDES = ("module", "kwargs", "model_path", "dtype")


def _effective(module: Any, kwargs: dict, job: dict[str, Any], params: SamplingParams) -> dict[str, Any]:
    if job.get("cached"):  # through the cache: a failure is a note in the answer
        return effective_for(module.__name__, kwargs, job["model_path"], job["dtype"], params)
    return module.effective(Path(job["model_path"]), params, job["dtype"], **kwargs).model_dump(mode="json")


def _own(job: dict[str, Any], module: Any, kwargs: dict, item: dict[str, Any]) -> dict[str, Any]:
    """The job as one item sees it: an item may name its own module, kwargs, model_path and dtype (several engines of
    one interpreter in one job: `params` and `transplant` import an engine package once for all that use it)."""
    return {**job, "module": module.__name__, "kwargs": kwargs, **{k: item[k] for k in ITEM_OVERRIDES if k in item}}


def effective_items(module: Any, kwargs: dict, job: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for item in job["items"]:
        own = _own(job, module, kwargs, item)
        params = SamplingParams(**item["params"])
        answer = _effective(importlib.import_module(own["module"]), own["kwargs"], own, params)
        out.append({"case_id": item["case_id"], "effective": answer})
    return out


def transplant_items(module: Any, kwargs: dict, job: dict[str, Any]) -> list[dict[str, Any]]:
    import torch
    from safetensors import safe_open

    out = []
    for item in job["items"]:
        own = _own(job, module, kwargs, item)
        code = importlib.import_module(own["module"])
        params = SamplingParams(**item["params"])
        steps = len(item["token_ids"]) - item["prompt_len"]
        with safe_open(item["logits_path"], framework="pt") as f:
            start = item["prompt_len"] - 1 - int((f.metadata() or {}).get("logits_from", 0))
            logits = f.get_slice("logits")[start : start + steps].to(getattr(torch, own["dtype"]))
        record = Recorder()
        answer = {"case_id": item["case_id"], "variant": item["variant"], "engine": item.get("engine")}
        try:
            code.transplant(Path(own["model_path"]), params, logits, item["token_ids"], item["prompt_len"], record,
                            **own["kwargs"])
        except Exception as exc:  # the engine's code refused or crashed outside a recorded op
            out.append({**answer, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]})
            continue
        out.append({**answer, **record.save(Path(item["out_path"])),
                    "effective": _effective(code, own["kwargs"], own, params)})
    return out


def beam_items(module: Any, kwargs: dict, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Each item names its engine's sampling module and kwargs: the engines sharing this interpreter share one
    oracle, so the numbers of a sequence are computed once, whichever loop asks."""
    from adapters.sampling.oracle import Oracle

    oracle = Oracle(Path(job["model_path"]), job["dtype"])
    out = []
    for item in job["items"]:
        answer = {"case_id": item["case_id"], "engine": item["engine"]}
        loop = getattr(importlib.import_module(item["module"]), "beam_search", None)
        if loop is None:
            out.append({**answer, "error": "its sampling code has no beam-search loop to run here"})
            continue
        oracle.start(item["prompt_ids"])
        try:
            beams = loop(Path(job["model_path"]), SamplingParams(**item["params"]), item["prompt_ids"], oracle,
                         **item["kwargs"])
        except Exception as exc:  # the engine's loop refused or crashed on these params
            out.append({**answer, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]})
            continue
        out.append({**answer, "beams": [b.model_dump(mode="json") for b in beams], "steps": oracle.steps(),
                    "real_logprobs": [oracle.logprobs_of(ids) for ids in item["real"]]})
    return out


RUNNERS = {"effective": effective_items, "transplant": transplant_items, "beams": beam_items}
MISSING = {"transplant": ("transplant", "NO_TRANSPLANT", "no sampler code to run here")}


def main() -> int:
    answer = os.fdopen(os.dup(1), "w")  # engines print to stdout: keep it for the answer, send theirs to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    job = json.load(sys.stdin)
    module = importlib.import_module(job["module"])
    needed, reason_attr, reason = MISSING.get(job["task"], ("__name__", "", ""))
    if not hasattr(module, needed):
        result = {"unavailable": getattr(module, reason_attr, reason)}
    else:
        result = {"items": RUNNERS[job["task"]](module, job["kwargs"], job)}
    answer.write(json.dumps(result) + "\n")
    answer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
