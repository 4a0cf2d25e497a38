"""The harness at scale: N generated prompts through one engine, `parity run` vs the same work done plainly with that
engine's own API at its best batching; then every chosen engine in one `parity run` vs the plain engines side by side.

plain, per engine (each in a fresh process, the same threads as the harness's engines, written below; vLLM's in
benchmarks/plain_vllm.py, shared with benchmarks/overhead.py):
  vllm         LLM(...) and one LLM.generate call of every prompt (its scheduler batches them), top-5 logprobs
  vllm-server  vLLM's own server (python -m vllm.entrypoints.openai.api_server) started by the script, then every
               request in flight at once from a thread pool of httpx clients; timed from the server's start
  llama.cpp    llama-cpp-python's Llama on the f32 GGUF the harness builds, create_completion per prompt, logprobs 5
  hf           from_pretrained + generate in left-padded batches of 16 (one 1024-row call would hold ~6 GB of logits)
parity: a scenario with that engine alone (hf with `batched: true`, the same batches of 16), default batching.

Prints per count and engine: wall (median and spread), where the time goes on both sides (process start, imports,
load, generate; the harness's prepare and write), the harness's own time per case (plan, verdicts, tables and summary:
prepare_s + write_s over the cases) and its peak RSS (run.json); then the whole run against the plain engines side by
side. Medians of --repeats at counts up to 256, one run above.

Usage: python benchmarks/scale.py [--counts 16,256,1024] [--engines vllm,vllm-server,llama.cpp,hf] [--repeats 3]
       [--tokens 32] [--threads 1] [--no-whole | --whole-only] [--together] [--same-kind]
--same-kind runs only two engines of one kind (vLLM, and vLLM with prefix caching off: two configurations) in one
`parity run`, against two plain vLLM scripts side by side, each side started right after another command (every core
kept busy for BUSY_S first, which leaves the 1-minute load average high): the harness must run them side by side
when the machine is idle now, not queue them behind a lagging average (issue 56: target <= 1.1x).
--together runs an engine's plain script and its `parity run` at the same time (each on its own cores: 2 x threads
needed), so both see the same machine; the one that finishes first leaves the other the machine to itself for the
rest, which favours the slower side. The whole run always runs its two sides one after the other.
Targets (issue 29), at 1024 cases: each engine <= 1.1x plain, the whole run <= 1.1x the plain engines side by side,
the harness's own time <= 5 ms per case and not growing with the count, its peak RSS <= 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import models  # noqa: E402
from harness.scenario.prompts import load_tokenizer  # noqa: E402

MODEL = "smollm2-135m"
WORDS = ("the", "river", "city", "light", "morning", "old", "house", "small", "garden", "quiet", "road", "north",
         "market", "evening", "stone", "bridge", "winter", "music", "letter", "window", "village", "story", "journey",
         "bright", "forest", "harbour")

# Each plain script prints RESULT {phases} (time.monotonic(): one clock for every process here). argv: model path,
# a JSON file of prompt ids, max new tokens, threads (and the GGUF path, the port).
HEAD = """
import json, sys, time
main_at = time.monotonic()
"""
PLAIN = {
    "vllm-server": HEAD + """
import subprocess, os
from concurrent.futures import ThreadPoolExecutor
import httpx
path, prompts, max_new, port = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), sys.argv[5]
server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--port", port,
                           "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
                           "--max-logprobs", "20", "--disable-uvicorn-access-log"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.25)
    loaded = time.monotonic()
    client = httpx.Client(timeout=3600, limits=httpx.Limits(max_connections=len(prompts)))
    model = client.get(base + "/v1/models").json()["data"][0]["id"]
    def one(ids):
        answer = client.post(base + "/v1/completions", json={"model": model, "prompt": ids, "max_tokens": max_new,
                                                             "temperature": 0.0, "logprobs": 5})
        answer.raise_for_status()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        list(pool.map(one, prompts))
    done = time.monotonic()
finally:
    server.terminate()
    server.wait()
print("RESULT " + json.dumps({"main_at": main_at, "imports_s": 0.0, "load_s": loaded - main_at,
                              "generate_s": done - loaded}), flush=True)
""",
    "llama.cpp": HEAD + """
import llama_cpp
imported = time.monotonic()
prompts, max_new, threads, gguf = json.load(open(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llm = llama_cpp.Llama(model_path=gguf, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads,
                      n_threads_batch=threads, logits_all=True, verbose=False)
loaded = time.monotonic()
for ids in prompts:
    llm.create_completion(prompt=ids, max_tokens=max_new, temperature=0.0, logprobs=5)
done = time.monotonic()
print("RESULT " + json.dumps({"main_at": main_at, "imports_s": imported - main_at, "load_s": loaded - imported,
                              "generate_s": done - loaded}), flush=True)
""",
    "hf": HEAD + """
import torch
from transformers import AutoModelForCausalLM
imported = time.monotonic()
path, prompts, max_new = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
pad = model.generation_config.eos_token_id
pad = pad[0] if isinstance(pad, list) else pad
loaded = time.monotonic()
with torch.inference_mode():
    for start in range(0, len(prompts), 16):
        batch = prompts[start:start + 16]
        width = max(len(ids) for ids in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        out = model.generate(ids, attention_mask=mask, pad_token_id=pad, do_sample=False, max_new_tokens=max_new,
                             return_dict_in_generate=True, output_logits=True)
        torch.stack(out.logits, 1).float().log_softmax(-1).topk(5, dim=-1)
done = time.monotonic()
print("RESULT " + json.dumps({"main_at": main_at, "imports_s": imported - main_at, "load_s": loaded - imported,
                              "generate_s": done - loaded}), flush=True)
""",
}
PLAIN_VLLM = ROOT / "benchmarks" / "plain_vllm.py"  # the vLLM engines' plain script, with these switches
VLLM_SWITCHES = {"vllm": [], "vllm-b": ["--no-prefix-caching"]}
VLLM_KV_CACHE_BYTES = 2**30
BUSY_S = 90  # --same-kind: every core busy this long before each side starts (the 1-minute load average then reads
#             about 1.6 on 2 cores, a busy machine by the load-average rule the harness used before)
SCENARIO_ENGINE = {"vllm": "{engine: vllm}", "vllm-b": "{engine: vllm, options: {prefix_caching: false}}",
                   "vllm-server": "{engine: vllm-server}",
                   "llama.cpp": "{engine: llama.cpp, options: {gguf: f32}}",
                   "hf": "{engine: hf, options: {batched: true}}"}


def texts(count: int) -> list[str]:
    """Deterministic prompts of varied length (4 to 60 words)."""
    rng = random.Random(29)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60))).capitalize() for _ in range(count)]


def scenario(path: Path, engines: list[str], prompts: list[str], tokens: int, threads: int) -> Path:
    """The first engine is the reference; one engine alone runs with `--engines` naming it, a second one (the next of
    ENGINES) listed only because a scenario compares two."""
    listed = engines if len(engines) > 1 else [*engines, next(e for e in SCENARIO_ENGINE if e not in engines)]
    lines = [f"name: scale-{len(prompts)}", f"model: {MODEL}", "dtype: float32", f"threads: {threads}", "engines:"]
    for i, engine in enumerate(listed):
        spec = SCENARIO_ENGINE[engine]
        lines.append(f"  {engine}: " + (spec[:-1] + ", reference: true}" if i == 0 else spec))
    lines += ["expect: {tokens: any}", f"params: {{temperature: 0, max_new_tokens: {tokens}, ignore_eos: true}}",
              "prompts:", *[f"  - {json.dumps(t)}" for t in prompts]]
    path.write_text("\n".join(lines) + "\n")
    return path


def env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "passive", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def plain_command(engine: str, ids_file: Path, tokens: int, threads: int, model_path: Path, gguf: Path) -> list[str]:
    if engine in VLLM_SWITCHES:
        return [sys.executable, str(PLAIN_VLLM), str(model_path), str(ids_file), str(tokens), str(VLLM_KV_CACHE_BYTES),
                *VLLM_SWITCHES[engine]]
    return [sys.executable, "-c", PLAIN[engine], str(model_path), str(ids_file), str(tokens), str(threads),
            str(gguf) if engine == "llama.cpp" else free_port()]


class Child:
    """A process whose output goes to files and whose CPU (its own and its waited descendants') comes from wait4,
    so each side's CPU is its own even when the two sides run at the same time."""

    def __init__(self, command: list[str], env: dict[str, str], folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.out, self.err = folder / "stdout", folder / "stderr"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=err, text=True)

    def wait(self) -> tuple[int, str, str, float]:
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        return (self.proc.returncode, self.out.read_text(), self.err.read_text(),
                usage.ru_utime + usage.ru_stime)


def plain(engines: list[str], ids_file: Path, tokens: int, threads: int, model_path: Path, gguf: Path,
          folder: Path) -> dict:
    """The plain scripts of `engines`, side by side (one engine: alone): wall and CPU of them all, phases each."""
    started = time.monotonic()
    children = {e: Child(plain_command(e, ids_file, tokens, threads, model_path, gguf), env(threads), folder / e)
                for e in engines}
    phases, cpu = {}, 0.0
    for engine, child in children.items():
        code, out, err, used = child.wait()
        if code != 0:
            sys.exit(f"a plain script exited {code}: {err[-2000:]}")
        phases[engine] = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
        phases[engine]["process_start_s"] = phases[engine].pop("main_at") - started
        cpu += used
    return {"wall_s": time.monotonic() - started, "cpu_s": cpu, **phases}


def parity(scenario_file: Path, engines: list[str], out: Path, count: int) -> dict:
    started = time.monotonic()
    child = Child([sys.executable, "-m", "harness", "run", str(scenario_file), "--out", str(out / "runs"),
                   "--engines", ",".join(engines)], dict(os.environ), out)
    code, stdout, stderr, cpu = child.wait()
    wall = time.monotonic() - started
    if code != 0:
        sys.exit(f"parity run exited {code}: {stdout[-1500:]}{stderr[-1500:]}")
    meta = json.loads(next((out / "runs").iterdir()).joinpath("run.json").read_text())
    own = meta["phases"]["prepare_s"] + meta["phases"]["write_s"]
    return {"wall_s": wall, "cpu_s": cpu, "own_ms_per_case": 1000 * own / count,
            "peak_rss_mb": meta["phases"].get("peak_rss_mb", float("nan")),
            "harness": meta["phases"], **{name: e["phases"] for name, e in meta["engines"].items()}}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} s" + (f" (min {min(values):.1f}, max {max(values):.1f})"
                                                    if len(values) > 1 else "")


def phases(rows: list[dict], engine: str) -> str:
    """Median seconds per phase. A server engine's generate is its requests' latencies summed: they overlap."""
    keys = [k for k in ("process_start_s", "imports_s", "load_s", "generate_s", "effective_s") if k in rows[0][engine]]
    summed = " (requests' latencies summed: they were in flight together)" if \
        statistics.median(r[engine]["generate_s"] for r in rows) > statistics.median(r["wall_s"] for r in rows) else ""
    return ", ".join(f"{k[:-2]} {statistics.median(r[engine][k] for r in rows):.1f}" for k in keys) + summed


def busy(seconds: float) -> None:
    """Another command just before: every core spinning for `seconds` (the load average then reads the machine busy
    for a minute after it is idle again)."""
    spin = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin, str(seconds)]) for _ in range(os.cpu_count() or 1)]
    for proc in procs:
        proc.wait()
    print(f"  (every core busy for {seconds:.0f} s just before; load average now {os.getloadavg()[0]:.2f})",
          flush=True)


def compare(label: str, engines: list[str], run_plain, run_parity, repeats: int, together: bool,
            after_busy: float = 0.0) -> None:
    """Each repeat runs the two sides one after the other (alternating which goes first) or, `together`, at the same
    time: the machine's speed, which drifts here, is then the same for both. after_busy: each side starts right
    after every core was busy that long."""
    rows: dict[str, list[dict]] = {"plain": [], "parity": []}
    if after_busy:
        run_plain, run_parity = (lambda i, run=run_plain: (busy(after_busy), run(i))[1],
                                 lambda i, run=run_parity: (busy(after_busy), run(i))[1])
    for i in range(repeats):
        if together:
            with ThreadPoolExecutor(2) as pool:
                done = {"plain": pool.submit(run_plain, i), "parity": pool.submit(run_parity, i)}
                runs = [(side, future.result()) for side, future in done.items()]
        else:
            order = ("plain", "parity") if i % 2 == 0 else ("parity", "plain")
            runs = [(side, run_plain(i) if side == "plain" else run_parity(i)) for side in order]
        for side, row in runs:
            rows[side].append(row)
            print(f"  {label} repeat {i + 1} {side:6}: wall {row['wall_s']:.1f} s, cpu {row['cpu_s']:.1f} s"
                  + (" (both sides at once)" if together else ""), flush=True)
    p, h = rows["plain"], rows["parity"]
    ratio = statistics.median(r["wall_s"] for r in h) / statistics.median(r["wall_s"] for r in p)
    print(f"== {label}: plain {spread([r['wall_s'] for r in p])}, parity {spread([r['wall_s'] for r in h])}: "
          f"{ratio:.2f}x (target <= 1.1x at 1024 cases)")
    for engine in engines:
        print(f"   plain  {engine:11}: {phases(p, engine)}")
        print(f"   parity {engine:11}: {phases(h, engine)}")
    own = [r["own_ms_per_case"] for r in h]
    print(f"   parity harness: prepare {statistics.median(r['harness']['prepare_s'] for r in h):.2f} s, write "
          f"{statistics.median(r['harness']['write_s'] for r in h):.2f} s: {statistics.median(own):.2f} ms per case "
          f"(target <= 5); peak RSS {statistics.median(r['peak_rss_mb'] for r in h):.0f} MB (target <= 500)",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="16,256,1024")
    parser.add_argument("--engines", default="vllm,vllm-server,llama.cpp,hf")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-whole", action="store_true", help="skip the whole run against the engines side by side")
    parser.add_argument("--whole-only", action="store_true", help="only the whole run, no engine alone")
    parser.add_argument("--together", action="store_true",
                        help="an engine alone: its plain script and parity at the same time, each on its own cores")
    parser.add_argument("--same-kind", action="store_true",
                        help="only two vLLM configurations in one run against two plain vLLM scripts side by "
                             "side, each side right after another command")
    args = parser.parse_args()
    if args.same_kind:
        args.engines, args.whole_only = "vllm,vllm-b", True
    if args.together and 2 * args.threads > (os.cpu_count() or 1):
        parser.error(f"--together needs 2 x {args.threads} threads of cores, this machine has {os.cpu_count()}")
    engines = args.engines.split(",")
    model_path = models.resolve(MODEL, "float32")
    tokenizer = load_tokenizer(model_path)
    gguf = Path()
    if "llama.cpp" in engines:
        from adapters.engines.llamacpp_gguf import ensure

        gguf = ensure(model_path, "f32")
    with tempfile.TemporaryDirectory() as tmp:
        for count in [int(c) for c in args.counts.split(",")]:
            repeats = args.repeats if count <= 256 else 1
            prompts = texts(count)
            ids_file = Path(tmp) / f"ids-{count}.json"
            ids_file.write_text(json.dumps([tokenizer.encode(t) for t in prompts]))
            print(f"\n# {count} cases x {args.tokens} greedy tokens, {args.threads} thread(s) per engine, "
                  f"{repeats} repeat(s)", flush=True)
            plain_args = (ids_file, args.tokens, args.threads, model_path, gguf)
            groups = ([] if args.whole_only else [[e] for e in engines]) + \
                ([] if args.no_whole or len(engines) < 2 else [engines])
            for group in groups:
                label = f"{count} cases, {'+'.join(group)}"
                file = scenario(Path(tmp) / f"{count}-{'-'.join(group)}.yaml", group, prompts, args.tokens,
                                args.threads)
                work = Path(tmp) / f"{count}-{'-'.join(group)}"
                compare(label, group, lambda i, g=group, a=plain_args, w=work: plain(g, *a, w / f"plain-{i}"),
                        lambda i, f=file, g=group, w=work, c=count: parity(f, g, w / f"parity-{i}", c),
                        repeats, together=args.together and len(group) == 1, after_busy=BUSY_S if args.same_kind else 0)


if __name__ == "__main__":
    main()
