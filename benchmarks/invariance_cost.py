"""Cost of an invariance run: `parity run scenarios/invariance.yaml` vs the same work done plainly.

The same work: every engine configuration the run loads (HF as configured and batched; vLLM as configured and with
prefix caching off/on, chunked prefill off/on, n-gram speculative decoding, VLLM_BATCH_INVARIANT; the vLLM server),
sending the same prompt ids in the same groups (alone, one batch, reversed, one at a time vs all at once, the shared
prefix, the seeds, the control). The groups are taken from the harness's own plan, so both sides do identical work;
the plain side then uses each engine's API directly, one fresh process per configuration, one after the other:
  HF     from_pretrained + generate per group (left-padded batches), raw logits kept for top-5 logprobs
  vLLM   LLM(model, dtype=float32, enforce_eager=True, max_model_len=<fits>, kv_cache_memory_bytes=256 MiB,
         <the configuration's switches>) + generate per group with logprobs=5, in-process engine core
  server `python -m vllm.entrypoints.openai.api_server` with the same flags, then the groups through httpx (a group
         of several requests sent concurrently)
Both sides with the harness's thread settings (1 OpenMP thread, passive waiting). Prints both wall times, the ratio
(target <= 1.3x) and where the plain side's time went per configuration. Usage:
    python benchmarks/invariance_cost.py [SCENARIO: another invariance scenario, e.g. the suite's smallest run]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.http.server_process import ServerProcess, free_port  # noqa: E402
from harness.plan import invariance_checks  # noqa: E402
from harness.plan.requests import plan_engines  # noqa: E402
from harness.scenario.prompts import load_tokenizer, tokenize_prompts  # noqa: E402
from harness.scenario.spec import load  # noqa: E402

SCENARIO = ROOT / "scenarios" / "invariance.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}

PLAIN_HF = """
import json, sys, torch
from transformers import AutoModelForCausalLM
path, groups = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
with torch.inference_mode():
    for group in groups:
        width = max(len(r["ids"]) for r in group)
        ids = torch.full((len(group), width), 2, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, r in enumerate(group):
            ids[row, width - len(r["ids"]):] = torch.tensor(r["ids"])
            mask[row, width - len(r["ids"]):] = 1
        p = group[0]["params"]
        kwargs = dict(do_sample=p["sample"], max_new_tokens=p["max_tokens"], repetition_penalty=p["rep"])
        if p["sample"]:
            torch.manual_seed(p["seed"])
            kwargs.update(temperature=p["temperature"], top_k=0, top_p=1.0)
        out = model.generate(ids, attention_mask=mask, pad_token_id=2, return_dict_in_generate=True,
                             output_logits=True, **kwargs)
        torch.stack(out.logits, 1).float().log_softmax(-1).topk(5, dim=-1)
"""

PLAIN_VLLM = """
import json, os, sys
if __name__ == "__main__":
    path, groups, switches = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    if switches.pop("batch_invariant", False):
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=256 * 2**20,
              **switches)
    for group in groups:
        params = [SamplingParams(temperature=r["params"]["temperature"] if r["params"]["sample"] else 0.0,
                                 seed=r["params"]["seed"], max_tokens=r["params"]["max_tokens"], logprobs=5,
                                 repetition_penalty=r["params"]["rep"]) for r in group]
        try:
            llm.generate([TokensPrompt(prompt_token_ids=r["ids"]) for r in group], params, use_tqdm=False)
        except Exception as exc:  # a configuration this device cannot run fails the way the harness's does
            print("generate failed:", type(exc).__name__, exc, file=sys.stderr)
"""

SWITCHES = {"prefix_caching": "enable_prefix_caching", "chunked_prefill": "enable_chunked_prefill",
            "max_num_batched_tokens": "max_num_batched_tokens", "speculative": "speculative_config",
            "batch_invariant": "batch_invariant"}


def plain_groups(plan) -> list[list[dict]]:
    return [[{"ids": r.prompt_ids, "params": {"sample": not r.params.greedy, "temperature": r.params.temperature or 1.0,
                                              "seed": r.params.seed, "max_tokens": r.params.max_new_tokens,
                                              "rep": r.params.repetition_penalty or 1.0}} for r in group]
            for group in plan.batches()]


def timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in ok:
        sys.exit(f"{cmd[:3]} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return time.monotonic() - started


def serve(plan, model_path: Path, workdir: Path) -> float:
    """The vLLM server with the plan's flags, then its groups through httpx, as a plain client would."""
    import httpx

    started = time.monotonic()
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path), "--host",
           "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
           "--generation-config", "vllm", "--max-logprobs", "20"]
    server = ServerProcess(cmd, {**ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}, workdir / "server.log",
                           workdir / "server.pid")
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/health", 900)

        def one(r: dict) -> None:
            p = r["params"]
            body = {"model": str(model_path), "prompt": r["ids"], "max_tokens": p["max_tokens"], "logprobs": 5,
                    "temperature": p["temperature"] if p["sample"] else 0.0, "seed": p["seed"],
                    "repetition_penalty": p["rep"]}
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=300).raise_for_status()

        with ThreadPoolExecutor(max_workers=4) as pool:
            for group in plain_groups(plan):
                list(pool.map(one, group))
    finally:
        server.stop()
    return time.monotonic() - started


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else SCENARIO
    scenario = load(path).with_resolved()  # each engine's model folder, as a run finds it
    model_path = scenario.engine(scenario.spec.reference).model_folder
    tokenizer = load_tokenizer(model_path)
    prompt_ids = tokenize_prompts(tokenizer, list({c.prompt.id: c.prompt for c in scenario.cases}.values()))
    with tempfile.TemporaryDirectory() as tmp:
        plans, _ = invariance_checks.plan(scenario, plan_engines(scenario, Path(tmp), prompt_ids), Path(tmp),
                                   tokenizer.encode(invariance_checks.SHARED_PREFIX))
        started = time.monotonic()
        # exit 1 is this scenario's finding (the vLLM server's repeat is not bitwise identical), not a failure
        timed([sys.executable, "-m", "harness", "run", str(path), "--out", str(Path(tmp) / "reports")],
              dict(os.environ), ok=(0, 1))
        parity = time.monotonic() - started
        plain, parts = 0.0, []
        for plan in plans:
            groups = json.dumps(plain_groups(plan))
            if plan.engine == "hf":
                seconds = timed([sys.executable, "-c", PLAIN_HF, str(model_path), groups], ENV)
            elif plan.engine == "vllm":
                switches = {SWITCHES[k]: v for k, v in plan.setup.options.items() if k in SWITCHES}
                seconds = timed([sys.executable, "-c", PLAIN_VLLM, str(model_path), groups, json.dumps(switches)],
                                {**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
            else:
                seconds = serve(plan, model_path, Path(tmp))
            plain += seconds
            parts.append(f"{plan.name} {seconds:.1f} s ({sum(len(g) for g in plan.batches())} requests)")
            print(f"plain {parts[-1]}", flush=True)
    print(f"\nplain, one configuration after another: {plain:.1f} s")
    print(f"parity run {path.name}: {parity:.1f} s (configurations side by side, 1 thread each)")
    print(f"ratio parity/plain: {parity / plain:.2f}x (target <= 1.3)")


if __name__ == "__main__":
    main()
