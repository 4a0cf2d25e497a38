"""Harness overhead: `parity run scenarios/quickstart.yaml` vs the same work with bare HF and bare vLLM.

Both sides run in this one process tree, one after the other, model loads and process starts included:
  bare:   a fresh python process doing HF load + generate (top-5 logprobs per step), then one doing vLLM load +
          generate, with the same threads, env, prompt ids and params the harness uses;
  parity: `parity run` on the scenario, engines one at a time (--parallel 1) and, for reference, concurrently.
Prints each wall time and the ratio parity/bare (target <= 1.25 for the sequential run). Usage:
    python benchmarks/overhead.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.vllm_offline import Options as VllmOptions, prepare_env, socket_dir  # noqa: E402
from harness import models  # noqa: E402
from harness.prompts import load_tokenizer, tokenize_prompts  # noqa: E402
from harness.scenario import load  # noqa: E402
from harness.worker_handle import worker_env  # noqa: E402

SCENARIO = ROOT / "scenarios" / "quickstart.yaml"

BARE_HF = """
import json, sys, torch
from transformers import AutoModelForCausalLM
path, prompts, max_new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
for ids in prompts:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new, return_dict_in_generate=True, output_logits=True)
    torch.stack(out.logits, 1).float().log_softmax(-1).topk(5, dim=-1)
"""

BARE_VLLM = """
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    path, prompts, max_new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model=path, dtype="float32", enforce_eager=True, seed=0, max_logprobs=20,
              kv_cache_memory_bytes=2**30, generation_config="vllm")
    llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                 SamplingParams(temperature=0.0, max_tokens=max_new, logprobs=5), use_tqdm=False)
"""


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def bare(model_path: Path, prompt_ids: list[list[int]], max_new: int, workdir: Path) -> float:
    env = worker_env(threads=1)
    args = [str(model_path), json.dumps(prompt_ids), str(max_new)]
    hf = timed([sys.executable, "-c", BARE_HF, *args], env)
    vllm_env = {**env, **prepare_env(workdir, VllmOptions(), socket_dir(workdir))}
    return hf + timed([sys.executable, "-c", BARE_VLLM, *args], vllm_env)


def parity(out: Path, parallel: int) -> float:
    cmd = [sys.executable, "-m", "harness", "run", str(SCENARIO), "--out", str(out), "--parallel", str(parallel)]
    return timed(cmd, worker_env(threads=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    repeats = parser.parse_args().repeats
    scenario = load(SCENARIO)
    model_path = models.resolve(scenario.spec.model, scenario.spec.dtype)
    prompts = {c.prompt.id: c.prompt for c in scenario.cases}
    prompt_ids = list(tokenize_prompts(load_tokenizer(model_path), list(prompts.values())).values())
    max_new = scenario.spec.params.max_new_tokens
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            b = bare(model_path, prompt_ids, max_new, Path(tmp) / f"bare{i}")
            seq = parity(Path(tmp) / f"seq{i}", 1)
            par = parity(Path(tmp) / f"par{i}", 2)
            rows.append((b, seq, par))
            print(f"run {i + 1}: bare HF+vLLM {b:.1f} s | parity --parallel 1 {seq:.1f} s | "
                  f"parity --parallel 2 {par:.1f} s", flush=True)
    b, seq, par = (min(col) for col in zip(*rows))
    print(f"ratio parity/bare (sequential engines): {seq / b:.3f}  (target <= 1.25)")
    print(f"ratio parity/bare (engines in parallel): {par / b:.3f}")


if __name__ == "__main__":
    main()
