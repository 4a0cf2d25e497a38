"""Runs engines' own sampling code (no model weights, no generation) in the engine's interpreter:
`python -m adapters.sampling_worker < job.json` prints one JSON document.

job: {"task": "effective" | "transplant", "engine": type, "options": {...}, "model_path": str, "dtype": str,
      "items": [...]}
  effective items:  {"case_id", "params"}                              -> {"case_id", "effective"}
  transplant items: {"case_id", "variant", "params", "token_ids", "prompt_len", "logits_path", "out_path"}
                    -> {"case_id", "variant", "path", "steps", "sampling", "hazards"} or {"error"}
The logits file is a trace (safetensors with a [positions, vocab] `logits` tensor); step s of a case uses the row
of position prompt_len + s - 1, cast to the engine's dtype (the logits that engine's sampler would receive).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from adapters.registry import sampling_code
from adapters.sampling_common import Recorder
from harness.types import SamplingParams


def effective_items(module: Any, kwargs: dict, job: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for item in job["items"]:
        params = SamplingParams(**item["params"])
        out.append({"case_id": item["case_id"],
                    "effective": module.effective(Path(job["model_path"]), params, job["dtype"], **kwargs).to_json()})
    return out


def transplant_items(module: Any, kwargs: dict, job: dict[str, Any]) -> list[dict[str, Any]]:
    import torch
    from safetensors import safe_open

    out = []
    for item in job["items"]:
        params = SamplingParams(**item["params"])
        start, steps = item["prompt_len"] - 1, len(item["token_ids"]) - item["prompt_len"]
        with safe_open(item["logits_path"], framework="pt") as f:
            logits = f.get_slice("logits")[start : start + steps].to(getattr(torch, job["dtype"]))
        record = Recorder()
        try:
            module.transplant(Path(job["model_path"]), params, logits, item["token_ids"], item["prompt_len"], record,
                              **kwargs)
        except Exception as exc:  # the engine's code refused or crashed outside a recorded op
            out.append({"case_id": item["case_id"], "variant": item["variant"],
                        "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]})
            continue
        out.append({"case_id": item["case_id"], "variant": item["variant"], **record.save(Path(item["out_path"])),
                    "effective": module.effective(Path(job["model_path"]), params, job["dtype"], **kwargs).to_json()})
    return out


def main() -> int:
    answer = os.fdopen(os.dup(1), "w")  # engines print to stdout: keep it for the answer, send theirs to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    job = json.load(sys.stdin)
    code = sampling_code(job["engine"], job["options"])
    if code is None:
        result = {"unavailable": f"no {job['engine']} sampling code to run here"}
    else:
        module = importlib.import_module(code[0])
        runner = effective_items if job["task"] == "effective" else transplant_items
        result = {"items": runner(module, code[1], job)}
    answer.write(json.dumps(result) + "\n")
    answer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
