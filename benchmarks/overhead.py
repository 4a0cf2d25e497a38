"""Harness overhead against an honest yardstick: `parity run scenarios/quickstart.yaml` vs the same work done plainly.

plain:   in fresh processes, one after the other, each engine's own API at its best settings here, written below
         (vLLM's in benchmarks/plain_vllm.py, shared with benchmarks/scale.py):
         HF transformers `from_pretrained` + `generate` (greedy, raw logits kept for top-5 logprobs), then vLLM
         `LLM(model, dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=64 MiB)` +
         `generate` of the same prompt ids with top-5 logprobs, in-process engine core
         (VLLM_ENABLE_V1_MULTIPROCESSING=0). Both with 2 OpenMP threads (this machine's cores) and passive waiting.
parity:  `parity run scenarios/quickstart.yaml` (the two engines side by side, one thread each).

Both sides are timed from outside (wall and CPU of the whole process tree) and break their time down into phases:
process start, imports, model load, generation, and for the harness effective params, its own preparation and
writing results. Repeats are interleaved (plain, parity, plain, parity...); medians and spread are printed. Each
side runs cold (the harness's effective-params cache and every compile cache emptied first) and warm.

Usage: python benchmarks/overhead.py [--repeats 3] [--modes cold,warm] [--scenario FILE: another HF-vs-vLLM scenario,
       e.g. the suite's smallest run (tests/engines/test_benchmarks.py)]
Target (issue 13): parity <= 1.0x plain, medians of 3.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import models  # noqa: E402
from harness.scenario.prompts import load_tokenizer, tokenize_prompts  # noqa: E402
from harness.scenario.spec import load  # noqa: E402

SCENARIO = ROOT / "scenarios" / "quickstart.yaml"
PLAIN_THREADS = os.environ.get("PLAIN_THREADS", "2")
PLAIN_VLLM = ROOT / "benchmarks" / "plain_vllm.py"
VLLM_KV_CACHE_BYTES = 64 * 2**20

# Each plain script prints RESULT {phases}; times are time.monotonic() (one clock for every process here).
PLAIN_HF = """
import json, sys, time
main_at = time.monotonic()
import torch
from transformers import AutoModelForCausalLM
imported = time.monotonic()
path, prompts, max_new = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
loaded = time.monotonic()
with torch.inference_mode():
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new, return_dict_in_generate=True, output_logits=True)
        torch.stack(out.logits, 1).float().log_softmax(-1).topk(5, dim=-1)
done = time.monotonic()
print("RESULT " + json.dumps({"main_at": main_at, "imports_s": imported - main_at, "load_s": loaded - imported,
                              "generate_s": done - loaded}), flush=True)
"""

def plain_env(cache: Path) -> dict[str, str]:
    """The plain scripts' environment: best thread settings here, caches in a directory the run owns."""
    return {**os.environ, "OMP_NUM_THREADS": PLAIN_THREADS, "OMP_WAIT_POLICY": "passive", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "XDG_CACHE_HOME": str(cache)}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process tree, stdout) of one command that must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{cmd[:4]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def plain_commands(model_path: Path, ids_file: Path, max_new: int) -> dict[str, list[str]]:
    """Each engine's plain script, run one after the other."""
    args = [str(model_path), str(ids_file), str(max_new)]
    return {"hf": [sys.executable, "-c", PLAIN_HF, *args],
            "vllm": [sys.executable, str(PLAIN_VLLM), *args, str(VLLM_KV_CACHE_BYTES)]}


def plain(model_path: Path, ids_file: Path, max_new: int, cache: Path) -> dict:
    total = {"wall_s": 0.0, "cpu_s": 0.0}
    for name, command in plain_commands(model_path, ids_file, max_new).items():
        spawned = time.monotonic()
        wall, cpu, out = timed(command, plain_env(cache))
        phases = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
        phases["process_start_s"] = phases.pop("main_at") - spawned
        total["wall_s"] += wall
        total["cpu_s"] += cpu
        total[name] = phases
    return total


def parity(scenario: Path, out: Path) -> dict:
    wall, cpu, _ = timed([sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)], dict(os.environ))
    meta = json.loads(next(out.iterdir()).joinpath("run.json").read_text())
    if meta["exit_code"] != 0:
        sys.exit(f"parity run exited {meta['exit_code']}")
    return {"wall_s": wall, "cpu_s": cpu, "harness": meta["phases"],
            **{name: e["phases"] for name, e in meta["engines"].items()}}


def empty_caches(*folders: Path) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} s (min {min(values):.1f}, max {max(values):.1f})"


def phase_line(rows: list[dict], engine: str) -> str:
    keys = [k for k in ("process_start_s", "imports_s", "load_s", "generate_s", "effective_s") if k in rows[0][engine]]
    return ", ".join(f"{k[:-2]} {statistics.median(r[engine][k] for r in rows):.1f}" for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    args = parser.parse_args()
    scenario = load(args.scenario)
    model_path = models.resolve(scenario.spec.model, scenario.spec.dtype)
    prompts = list({c.prompt.id: c.prompt for c in scenario.cases}.values())
    prompt_ids = list(tokenize_prompts(load_tokenizer(model_path), prompts).values())
    max_new = scenario.spec.params.max_new_tokens
    effective_cache = models.cache_root() / "effective"
    with tempfile.TemporaryDirectory() as tmp:
        plain_cache = Path(tmp) / "plain-cache"
        ids_file = Path(tmp) / "prompt-ids.json"
        ids_file.write_text(json.dumps(prompt_ids))
        for mode in args.modes.split(","):
            rows: dict[str, list[dict]] = {"plain": [], "parity": []}
            for i in range(args.repeats):
                order = ("plain", "parity") if i % 2 == 0 else ("parity", "plain")
                for side in order:
                    if mode == "cold":
                        empty_caches(effective_cache, plain_cache, models.cache_root() / "compile")
                    row = plain(model_path, ids_file, max_new, plain_cache) if side == "plain" else \
                        parity(args.scenario, Path(tmp) / f"{mode}-{i}")
                    rows[side].append(row)
                    print(f"{mode} repeat {i + 1} {side:6}: wall {row['wall_s']:.1f} s, cpu {row['cpu_s']:.1f} s",
                          flush=True)
            p, h = rows["plain"], rows["parity"]
            print(f"\n== {mode}: medians of {args.repeats} ==")
            print(f"plain  wall {spread([r['wall_s'] for r in p])}, cpu {spread([r['cpu_s'] for r in p])}")
            print(f"parity wall {spread([r['wall_s'] for r in h])}, cpu {spread([r['cpu_s'] for r in h])}")
            ratio = statistics.median(r["wall_s"] for r in h) / statistics.median(r["wall_s"] for r in p)
            cpu_ratio = statistics.median(r["cpu_s"] for r in h) / statistics.median(r["cpu_s"] for r in p)
            print(f"ratio parity/plain: wall {ratio:.2f}x (target <= 1.0), cpu {cpu_ratio:.2f}x")
            for engine in ("hf", "vllm"):
                print(f"  plain  {engine:4}: {phase_line(p, engine)}")
                print(f"  parity {engine:4}: {phase_line(h, engine)}")
            harness = ", ".join(f"{k[:-2]} {statistics.median(r['harness'][k] for r in h):.1f}"
                                for k in h[0]["harness"])
            print(f"  parity harness: {harness} (engines = both workers side by side)\n", flush=True)


if __name__ == "__main__":
    main()
