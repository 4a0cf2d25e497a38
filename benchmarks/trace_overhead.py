"""Cost of tracing, measured side by side in one run (this machine is shared and noisy: compare within a run).

1. Per engine (HF, vLLM), in one fresh process each with the model loaded once and warmed up (vLLM compiles its
   CPU kernels on the first generate): an untraced generation of a case (prompt + generated tokens = --positions)
   vs the traced teacher-forced pass over the same token sequence, which captures every layer's points,
   embeddings and final norm at every position and the logits from the prompt's last position on: HF's, the
   reference's, written to disk; vLLM's as explain makes it, every layer started from HF's rows and compared with
   them as captured, then its free logits-only pass. Target <= 1.5x.
2. Peak RSS of an HF worker that generates and then traces the case vs one that only generates (separate
   processes, ru_maxrss). Target: within 300 MB.
3. `parity explain` of a one-case HF-vs-vLLM scenario vs `parity run` of it, wall time of the whole command
   (model loads, the noise-floor engine and the localisation included), and each command's CPU: the harness
   process's own apart from its engine processes'. Target <= 1.3x (issue 56). Beside it, the least time any schedule
   of the explain's passes could take on this machine, from each pass's cost at one thread measured in part 1 (the
   noise floor's too: the reference's own weights in higher precision, loaded where the reference was, each layer
   started from its trace). --dtype runs all of it in bfloat16 or float16 (float32 by default); there the run's
   own near-tie checks (harness/run/tie_checks.py) run whenever vLLM's tokens part from HF's at a near-tie.
   With --model gemma3-270m (a 262,144-token vocabulary: one float32 logits row is 1 MB), the peak RSS of the
   harness process and of each engine process during both commands, sampled from /proc (targets: harness <= 1 GB,
   any process <= 4 GB), and the explain's run directory on disk.
   Past 256 positions the case is a long prompt and 32 generated tokens.

Usage: python benchmarks/trace_overhead.py [--model smollm2-135m|gemma3-270m|tiny-llama] [--positions 128]
       [--repeats 1] [--dtype float32|bfloat16|float16] (the issue's Gemma 3 figure: --model gemma3-270m --positions
       1500; the suite's smallest run: --model tiny-llama --positions 16)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import models  # noqa: E402
from harness.core.processes import worker_env  # noqa: E402
from harness.executors.start_next import usable_cores  # noqa: E402
from harness.run.trace_passes import FLOOR_DTYPE  # noqa: E402
from harness.scenario.prompts import load_tokenizer  # noqa: E402

PROMPT = "Once upon a time, in a small village by the sea,"

# Runs in a fresh process: load one engine, time an untraced generation and (optionally) the traced passes.
# argv: engine, model folder, positions, mode, workdir, prompt, dtype[, the reference's trace, the token ids]
CHILD = """
import cProfile, json, pstats, resource, sys, time
from pathlib import Path

def where_time_goes(profile):
    \"\"\"The four functions with the most time of their own: seconds each.\"\"\"
    stats = pstats.Stats(profile).stats
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:4]
    return ", ".join(f"{name} {own:.1f} s" for (_f, _l, name), (_c, _n, own, _t, _callers) in top)

def timed(engine, request):
    started, profile = time.perf_counter(), cProfile.Profile()
    with profile:
        traced = next(iter(engine.trace([request])))
    return time.perf_counter() - started, traced, where_time_goes(profile)

if __name__ == "__main__":
    from adapters.registry import describe
    from harness.run.trace_passes import FLOOR_DTYPE
    from harness.scenario.prompts import load_tokenizer
    from harness.core.vocabulary import SamplingParams
    from harness.core.types import EngineSetup, Request, TraceRequest
    engine_name, model_path, positions, mode, workdir = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), \\
        sys.argv[4], Path(sys.argv[5])
    prompt, dtype = load_tokenizer(model_path).encode(sys.argv[6]), sys.argv[7]
    if mode == "floor":  # the noise floor's pass as explain makes it: the reference's own weights (rounded to the
        # run's dtype) computed in higher precision, loaded in the worker the reference's engine was loaded in, each
        # layer started from the reference's trace (argv[8]) and compared with it as it is captured
        reference = EngineSetup(name=engine_name, model_path=model_path, dtype=dtype, workdir=workdir)
        describe(engine_name).engine(reference).close()
        setup = EngineSetup(name="floor", model_path=model_path, dtype=FLOOR_DTYPE[dtype], weights_dtype=dtype,
                            workdir=workdir, trace=True)
        started = time.perf_counter()
        engine = describe(engine_name).engine(setup)
        load_s = time.perf_counter() - started
        request = TraceRequest(case_id="case", token_ids=json.loads(sys.argv[9]), prompt_len=len(prompt),
                               against=sys.argv[8], inputs_from=sys.argv[8], keep=[], trace_dir=str(workdir))
        trace_s, _, _ = timed(engine, request)
        print("RESULT " + json.dumps({"load_s": load_s, "trace_s": trace_s}), flush=True)
        sys.exit(0)
    setup = EngineSetup(name=engine_name, model_path=model_path, dtype=dtype, workdir=workdir,
                        trace=mode in ("trace", "forced"))
    engine = describe(engine_name).engine(setup)
    params = SamplingParams(temperature=0, max_new_tokens=max(1, positions - len(prompt)), ignore_eos=True)
    warm = SamplingParams(temperature=0, max_new_tokens=2)
    list(engine.generate([Request(case_id="warm-up", prompt_ids=prompt, params=warm)]))
    started, profile = time.perf_counter(), cProfile.Profile()
    with profile:
        result = next(iter(engine.generate([Request(case_id="case", prompt_ids=prompt, params=params)])))
    out = {"generate_s": time.perf_counter() - started, "generate_where": where_time_goes(profile)}
    ids = prompt + result.token_ids
    if mode == "trace":  # the reference's pass: every point, written whole
        trace_s, traced, where = timed(engine, TraceRequest(case_id="case", token_ids=ids, prompt_len=len(prompt)))
        out.update(trace_s=trace_s, points=len(traced.points), trace_mb=Path(traced.path).stat().st_size / 2**20,
                   trace_where=where, path=traced.path, token_ids=ids)
    if mode == "forced":  # another engine's passes, as explain makes them against the reference's trace (argv[8]):
        # every layer started from its rows and compared as captured, then the free logits-only pass
        ids = json.loads(sys.argv[9])
        common = dict(case_id="case", token_ids=ids, prompt_len=len(prompt), against=sys.argv[8],
                      trace_dir=str(workdir / "passes"))
        trace_s, traced, where = timed(engine, TraceRequest(**common, inputs_from=sys.argv[8], keep=["logits"]))
        free_s, _, _ = timed(engine, TraceRequest(**common, points=["logits"], keep=["logits"]))
        out.update(trace_s=trace_s, free_s=free_s, points=len(traced.points), trace_where=where, forced=traced.forced,
                   trace_mb=sum(f.stat().st_size for f in (workdir / "passes").iterdir()) / 2**20)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out), flush=True)
    engine.close()
"""


# The yardstick for an engine process's memory: vLLM's own API, nothing of the harness, generating the same case
# (vLLM's defaults but eager mode and the harness's KV cache size of 1 GiB; in one process, as the harness runs it).
PLAIN_VLLM = """
import os, resource, sys
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], dtype=sys.argv[4], enforce_eager=True, kv_cache_memory_bytes=2**30, seed=0)
    prompt = llm.get_tokenizer()(sys.argv[3]).input_ids
    params = SamplingParams(temperature=0, max_tokens=max(1, int(sys.argv[2]) - len(prompt)), ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)  # vLLM 0.32 divides by its bar's
    # elapsed time, 0 on a tiny model
    assert out[0].outputs[0].token_ids
    print(f"RESULT {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}", flush=True)
"""

GENERATED = 32  # tokens generated after a long prompt (--positions over 256), as in scenarios/gemma3-long.yaml


def long_prompt(model_path: Path, tokens: int) -> str:
    """PROMPT repeated until it tokenises to at least `tokens` tokens: a long case is a long prompt and a short
    generation, like the longest case of scenarios/gemma3-long.yaml."""
    tokenizer, text = load_tokenizer(model_path), PROMPT
    while len(tokenizer.encode(text)) < tokens:
        text += " " + PROMPT
    return text


def plain_vllm_peak_mb(model_path: Path, positions: int, prompt: str, dtype: str) -> float:
    proc = subprocess.run([sys.executable, "-c", PLAIN_VLLM, str(model_path), str(positions), prompt, dtype],
                          env=worker_env(threads=1), cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the plain vLLM script exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return float(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT ")).split()[1])


def child(engine: str, model_path: Path, positions: int, mode: str, workdir: Path, prompt: str, dtype: str,
          *reference: str) -> dict:
    env = worker_env(threads=1)
    if engine == "vllm":
        from adapters.engines.vllm_offline import Options, prepare_env, socket_dir

        env.update(prepare_env(workdir, Options(), socket_dir(workdir)))
    proc = subprocess.run([sys.executable, "-c", CHILD, engine, str(model_path), str(positions), mode, str(workdir),
                           prompt, dtype, *reference], env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{engine}'s {mode} process exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


SCENARIO = """\
name: trace-bench
model: {model}
dtype: {dtype}
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
prompts: [{prompt!r}]
params: {{max_new_tokens: {tokens}, ignore_eos: true}}
"""


class PeakRss:
    """Samples the RSS of a process and all its descendants every 0.2 s from /proc: the peak of the root process
    and the peak of each descendant, by its command line; and the root process's own CPU (not its children's) at the
    last sample."""

    def __init__(self, pid: int):
        self.pid, self.root_mb, self.children_mb, self.own_cpu_s = pid, 0.0, {}, 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    @staticmethod
    def _rss_mb(pid: int) -> float:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    @staticmethod
    def _descendants(pid: int) -> list[int]:
        found, todo = [], [pid]
        while todo:
            for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                todo += children
        return found

    def _poll(self) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        while not self.done.wait(0.2):
            try:
                fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.own_cpu_s = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime: its own threads only
                self.root_mb = max(self.root_mb, self._rss_mb(self.pid))
                for child in self._descendants(self.pid):
                    name = " ".join(Path(f"/proc/{child}/cmdline").read_bytes().decode().split())[:60]
                    key = f"{child} {name.strip()}"
                    self.children_mb[key] = max(self.children_mb.get(key, 0.0), self._rss_mb(child))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue  # a process ended between two reads

    def stop(self) -> str:
        self.done.set()
        self.thread.join()
        biggest = sorted(self.children_mb.items(), key=lambda kv: -kv[1])[:4]
        return (f"harness {self.root_mb:.0f} MB (target <= 1024); largest engine processes "
                + ", ".join(f"{mb:.0f} MB ({key.split(' ', 2)[-1]})" for key, mb in biggest) + " (target <= 4096)")


def timed_cli(args: list[str]) -> tuple[float, str, str]:
    """Wall time of one CLI command, the peak RSS of its processes, and where its CPU went: the harness process's own
    against its engine processes' (wait4: the command and every process it waited for)."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=ROOT, env=worker_env(threads=1),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peaks = PeakRss(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        sys.exit(f"parity {args[0]} exited {proc.returncode}")
    wall, rss = time.perf_counter() - started, peaks.stop()
    total = usage.ru_utime + usage.ru_stime
    return wall, rss, f"CPU {total:.1f} s: harness {peaks.own_cpu_s:.1f} s, engines {total - peaks.own_cpu_s:.1f} s"


def _megabytes(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def best_schedule(passes: dict[str, dict], floor: dict, run_dir: Path, run_s: float) -> str:
    """The least wall time any schedule of explain's work could take here: the run, then the passes' CPU at one
    thread's efficiency (the reference's full pass, vLLM's layer-forced pass and its free logits pass, the floor's
    load and forced pass, as measured above) spread over the cores, less the core the reference's worker leaves idle
    from its answer to the run's end (vLLM, the slower engine, still runs). The run's own near-tie checks are in
    run_s. Compare, write and the workers' end are left out: a bound, not an estimate."""
    meta = json.loads((run_dir / "run.json").read_text())
    phases = meta["engines"][meta["reference"]]["phases"]
    answered = sum(phases[k] for k in ("process_start_s", "imports_s", "load_s", "generate_s"))
    cores = usable_cores()
    idle = max(0.0, (cores - 1) * (meta["phases"]["engines_s"] - answered))
    vllm = passes["vllm"]
    work = passes["hf"]["trace_s"] + vllm["trace_s"] + vllm["free_s"] + floor["load_s"] + floor["trace_s"]
    best = run_s + max(0.0, work - idle) / cores
    return (f"no schedule of explain's passes beats {best:.1f} s here, ratio {best / run_s:.2f}: {work:.1f} s of CPU "
            f"at one thread each (hf {passes['hf']['trace_s']:.1f}, vllm forced {vllm['trace_s']:.1f} + free "
            f"{vllm['free_s']:.1f}, floor {floor['load_s']:.1f} + {floor['trace_s']:.1f}) on {cores:g} cores, "
            f"{idle:.1f} s of a core idle in the run after the reference's answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "gemma3-270m", "tiny-llama"])
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    model_path = models.resolve(args.model, args.dtype)
    prompt = long_prompt(model_path, args.positions - GENERATED) if args.positions > 256 else PROMPT
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        passes = {"hf": child("hf", model_path, args.positions, "trace", tmp_path / "hf-traced", prompt, args.dtype)}
        reference = (passes["hf"]["path"], json.dumps(passes["hf"]["token_ids"]))
        passes["vllm"] = child("vllm", model_path, args.positions, "forced", tmp_path / "vllm-traced", prompt,
                               args.dtype, *reference)
        for engine, r in passes.items():
            kind = ("layer-forced pass, compared as captured" if engine == "vllm" else "full teacher-forced pass")
            free = f" + free logits pass {r['free_s']:.2f} s" if "free_s" in r else ""
            print(f"{engine}: untraced generation {r['generate_s']:.2f} s | {kind} {r['trace_s']:.2f} s{free} "
                  f"({r['points']} points, {r['trace_mb']:.0f} MB) | ratio {r['trace_s'] / r['generate_s']:.2f} "
                  f"(target <= 1.5) | peak RSS {r['peak_rss_mb']:.0f} MB\n"
                  f"  generation: {r['generate_where']}\n  traced pass: {r['trace_where']}", flush=True)
        floor = child("hf", model_path, args.positions, "floor", tmp_path / "floor", prompt, args.dtype, *reference)
        print(f"hf on its {args.dtype} weights in {FLOOR_DTYPE[args.dtype]} (the noise floor): load in an engine's "
              f"worker {floor['load_s']:.2f} s | layer-forced pass compared with hf's trace as captured "
              f"{floor['trace_s']:.2f} s", flush=True)
        plain = child("hf", model_path, args.positions, "plain", tmp_path / "hf-plain", prompt, args.dtype)
        traced = child("hf", model_path, args.positions, "trace", tmp_path / "hf-traced-rss", prompt, args.dtype)
        print(f"hf worker peak RSS: untraced {plain['peak_rss_mb']:.0f} MB | generate + trace "
              f"{traced['peak_rss_mb']:.0f} MB | difference {traced['peak_rss_mb'] - plain['peak_rss_mb']:.0f} MB "
              f"(target <= 300)", flush=True)
        yardstick = plain_vllm_peak_mb(model_path, args.positions, prompt, args.dtype)
        print(f"plain vLLM script generating the same case: peak RSS {yardstick:.0f} MB (the yardstick for any vLLM "
              "process)", flush=True)
        prompt_len = len(load_tokenizer(model_path).encode(prompt))
        scenario = tmp_path / "trace-bench.yaml"
        scenario.write_text(SCENARIO.format(model=args.model, prompt=prompt, dtype=args.dtype,
                                            tokens=max(1, args.positions - prompt_len)))
        for i in range(args.repeats):
            run_s, run_peaks, run_cpu = timed_cli(["run", str(scenario), "--out", str(tmp_path / f"run{i}")])
            explain_s, explain_peaks, explain_cpu = timed_cli(["explain", str(scenario), "--out",
                                                               str(tmp_path / f"explain{i}")])
            print(f"parity run {run_s:.1f} s | parity explain {explain_s:.1f} s | ratio {explain_s / run_s:.2f} "
                  f"(target <= 1.3)", flush=True)
            print(f"  run: {run_cpu}; explain: {explain_cpu}", flush=True)
            print(f"  peak RSS during run: {run_peaks}", flush=True)
            print(f"  peak RSS during explain: {explain_peaks}", flush=True)
            print(f"  explain's run directory: {_megabytes(next((tmp_path / f'explain{i}').iterdir()))} MB on disk",
                  flush=True)
            print(f"  {best_schedule(passes, floor, next((tmp_path / f'run{i}').iterdir()), run_s)}", flush=True)


if __name__ == "__main__":
    main()
