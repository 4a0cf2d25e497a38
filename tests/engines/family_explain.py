"""What the tiny-family explain tests share: the scenario (HF reference, vLLM, an HF copy with a fault planted by a
patch module written beside it, named after the family), the seeded draw of the fault, and the capture points a
family's map yields."""

from __future__ import annotations

import json
import random
from pathlib import Path

from adapters.tracing.arch_maps import ArchMap

from helpers import ParityRun, parity, write_scenario

# max_logprob_delta: vLLM's float32 logprobs against HF's on the tiny families stayed under 1e-4 on an AVX-512
# machine; on an AVX2 one (AMD EPYC) at most 2.7e-5, except tiny-glm4's last step, 1.2e-4 in every run: vLLM's CPU
# kernels differ by instruction set. A broken layer moves them by far more; the traces hold each point to the noise
# floor.
SCENARIO = """\
name: tiny-{family}
model: tiny-{family}
dtype: float32
engines:
  hf: {{engine: hf, reference: true{hf_options}}}
{engines}prompts:
  - "The quick brown fox jumps over the lazy dog while"
params: {{max_new_tokens: 16, ignore_eos: true}}
expect: {{tokens: exact, max_logprob_delta: 0.0005}}
"""

FAULT_MODULE = """\
def plant(model):
    \"\"\"Scale {path}'s output by 1.01.\"\"\"
    module = dict(model.named_modules())["{path}"]
    module.register_forward_hook(lambda _module, _args, out: out * 1.01)
"""

SEED = 27
LAYERS = 2  # every tiny model's


def planted_fault(family: str, arch: ArchMap) -> tuple[int, str, str]:
    """(layer, point, module path) of a family's fault: a per-layer module of HF's map whose output is a capture
    point (the first of its points, if it is fused), drawn with a seed."""
    taps = [t for t in arch.per_layer if t.take == "output" and t.module]
    rng = random.Random(f"{SEED}-{family}")
    layer, tap = rng.randrange(LAYERS), rng.choice(taps)
    return layer, tap.points[0], f"{arch.layers}.{layer}.{tap.module}"


def expected_points(arch: ArchMap) -> set[str]:
    """The capture points of HF's map for a tiny model, rope derived where the family has it."""
    per_layer = {p for t in arch.per_layer for p in t.points} | ({"q_rope", "k_rope"} if arch.rope else set())
    return {"embeddings", "final_norm", "logits"} | {f"layers.{n}.{p}" for n in range(LAYERS) for p in per_layer}


def fault_engine(folder: Path, family: str, path: str, hf_options: dict) -> str:
    """The scenario line of an HF copy whose module at `path` is 1% off, its patch module written into `folder`
    (one module name per family: several families' scenarios may run in one command)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"tiny_faults_{family}.py").write_text(FAULT_MODULE.format(path=path))
    options = {**hf_options, "patch": f"tiny_faults_{family}:plant"}
    return f"  fault: {{engine: hf, options: {json.dumps(options)}, expect: {{tokens: any}}}}\n"


VLLM = "  vllm: {engine: vllm}\n"


def write_explain_scenario(family: str, folder: Path, hf_options: dict | None = None, engines: str = VLLM) -> Path:
    """The family's prompt against HF (the reference), written into `folder`; `engines`: the scenario lines of the
    other engines."""
    options = f", options: {json.dumps(hf_options)}" if hf_options else ""
    folder.mkdir(parents=True, exist_ok=True)
    return write_scenario(folder / f"tiny-{family}.yaml",
                          SCENARIO.format(family=family, hf_options=options, engines=engines))


def explain(family: str, folder: Path, hf_options: dict | None = None, engines: str = VLLM) -> ParityRun:
    """`parity explain` of the family's scenario (write_explain_scenario), which must exit 0."""
    scenario = write_explain_scenario(family, folder, hf_options, engines)
    run = parity("explain", str(scenario), "--case", "p0", out=folder / "reports")
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


def localisations(run: ParityRun) -> dict[str, dict]:
    data = json.loads((run.run_dir / "explain" / "localisation.json").read_text())
    return {loc["engine"]: loc for loc in data["localisations"]}
