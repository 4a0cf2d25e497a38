"""Cost of tracing, measured side by side in one run (this machine is shared and noisy: compare within a run).

1. Per engine (HF, vLLM), in one fresh process each with the model loaded once and warmed up (vLLM compiles its
   CPU kernels on the first generate): an untraced generation of a case (prompt + generated tokens = --positions)
   vs the traced teacher-forced pass over the same token sequence, which captures 30 layers x 13 points +
   embeddings, final norm and logits and streams them to disk. Target <= 1.5x.
2. Peak RSS of an HF worker that generates and then traces the case vs one that only generates (separate
   processes, ru_maxrss). Target: within 300 MB.
3. `parity explain` of a one-case HF-vs-vLLM scenario vs `parity run` of it, wall time of the whole command
   (model loads, the noise-floor engine and the localisation included). Target <= 3x.

Usage: python benchmarks/trace_overhead.py [--positions 128] [--repeats 1]
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

from harness import models  # noqa: E402
from harness.run.worker_process import worker_env  # noqa: E402
from harness.scenario.prompts import load_tokenizer  # noqa: E402

PROMPT = "Once upon a time, in a small village by the sea,"

# Runs in a fresh process: load one engine, time an untraced generation and (optionally) the traced pass.
CHILD = """
import json, resource, sys, time
from pathlib import Path
if __name__ == "__main__":
    from adapters.registry import describe
    from harness.scenario.prompts import load_tokenizer
    from harness.scenario.vocabulary import SamplingParams
    from harness.types import EngineSetup, Request, TraceRequest
    engine_name, model_path, positions, trace, workdir = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), \\
        sys.argv[4] == "trace", Path(sys.argv[5])
    prompt = load_tokenizer(model_path).encode(sys.argv[6])
    setup = EngineSetup(name=engine_name, model_path=model_path, dtype="float32", workdir=workdir, trace=trace)
    engine = describe(engine_name).engine(setup)
    params = SamplingParams(temperature=0, max_new_tokens=positions - len(prompt), ignore_eos=True)
    warm = SamplingParams(temperature=0, max_new_tokens=2)
    list(engine.generate([Request(case_id="warm-up", prompt_ids=prompt, params=warm)]))
    started = time.perf_counter()
    result = next(iter(engine.generate([Request(case_id="case", prompt_ids=prompt, params=params)])))
    out = {"generate_s": time.perf_counter() - started}
    if trace:
        started = time.perf_counter()
        forced = TraceRequest(case_id="case", token_ids=prompt + result.token_ids, prompt_len=len(prompt))
        traced = next(iter(engine.trace([forced])))
        out.update(trace_s=time.perf_counter() - started, points=len(traced.points),
                   trace_mb=Path(traced.path).stat().st_size / 2**20)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out), flush=True)
    engine.close()
"""


def child(engine: str, model_path: Path, positions: int, mode: str, workdir: Path) -> dict:
    env = worker_env(threads=1)
    if engine == "vllm":
        from adapters.engines.vllm_offline import Options, prepare_env, socket_dir

        env.update(prepare_env(workdir, Options(), socket_dir(workdir)))
    proc = subprocess.run([sys.executable, "-c", CHILD, engine, str(model_path), str(positions), mode, str(workdir),
                           PROMPT], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


SCENARIO = """\
name: trace-bench
model: smollm2-135m
engines:
  hf: {{engine: hf, reference: true}}
  vllm: {{engine: vllm}}
prompts: [{prompt!r}]
params: {{max_new_tokens: {tokens}, ignore_eos: true}}
"""


def timed_cli(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=worker_env(threads=1),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # exit codes 0/1 are both fine here
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    model_path = models.resolve("smollm2-135m", "float32")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        for engine in ("hf", "vllm"):
            r = child(engine, model_path, args.positions, "trace", tmp_path / f"{engine}-traced")
            print(f"{engine}: untraced generation {r['generate_s']:.2f} s | traced teacher-forced pass "
                  f"{r['trace_s']:.2f} s ({r['points']} points, {r['trace_mb']:.0f} MB) | ratio "
                  f"{r['trace_s'] / r['generate_s']:.2f} (target <= 1.5)", flush=True)
        plain = child("hf", model_path, args.positions, "plain", tmp_path / "hf-plain")
        traced = child("hf", model_path, args.positions, "trace", tmp_path / "hf-traced-rss")
        print(f"hf worker peak RSS: untraced {plain['peak_rss_mb']:.0f} MB | generate + trace "
              f"{traced['peak_rss_mb']:.0f} MB | difference {traced['peak_rss_mb'] - plain['peak_rss_mb']:.0f} MB "
              f"(target <= 300)", flush=True)
        prompt_len = len(load_tokenizer(model_path).encode(PROMPT))
        scenario = tmp_path / "trace-bench.yaml"
        scenario.write_text(SCENARIO.format(prompt=PROMPT, tokens=args.positions - prompt_len))
        for i in range(args.repeats):
            run_s = timed_cli(["run", str(scenario), "--out", str(tmp_path / f"run{i}")])
            explain_s = timed_cli(["explain", str(scenario), "--out", str(tmp_path / f"explain{i}")])
            print(f"parity run {run_s:.1f} s | parity explain {explain_s:.1f} s | ratio {explain_s / run_s:.2f} "
                  f"(target <= 3)", flush=True)


if __name__ == "__main__":
    main()
