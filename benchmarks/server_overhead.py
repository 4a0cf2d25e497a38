"""Harness overhead against a server, against an honest yardstick: `parity run` vs a plain client, same server, same
request bodies.

One vLLM OpenAI server (SmolLM2 fp32, eager) is started per layout, outside both timings, plainly with vLLM's own
CLI and the settings written below (SERVER, SERVER_ENV; OpenMP threads that wait passively, as ENGINE_NOTES measured
best; not the harness's adapter or environment). Two layouts (--layouts):
  split:  the server on its own cores (all but the last, one OpenMP thread each), both clients on the last core: a
          server on its own hardware, as a served model is; the clients' CPU does not slow the server.
  shared: server (one thread per core) and clients on every core: on this 2-core machine the server alone keeps
          both cores busy, so every CPU second a client spends is about half a second of the server's lost.
The scenario has two `openai` engines attached to it (reference and candidate), each sending the same N completions
requests (token-id prompts, greedy, top-5 logprobs, 4 at a time, --prompts x --tokens). The plain side is the best
plain use of the server's API, written below: one fresh Python process with httpx sending the same 2 x N request
bodies (taken from the harness's own run, so both sides send identical bytes), 8 in flight, which is what the server
sees from the harness's two workers running side by side with 4 each.

Both sides are timed from outside (wall and CPU of the process tree) and broken into phases: process start and
imports, requests, the server's CPU while that side ran, and for the harness its workers' start, effective params
(how long results waited for them: they are computed while the engine generates) and writing results. Repeats are
interleaved, medians and spread printed, cold (the harness's effective-params cache emptied before each repeat:
the `openai` engines in the vllm dialect then run vLLM's own sampling code, once for both) and warm.

Usage: python benchmarks/server_overhead.py [--prompts 16] [--tokens 64] [--repeats 3] [--modes cold,warm]
       [--layouts split,shared] [--url URL: a running server of SmolLM2 fp32 named `served` instead of starting
       one; no layout, no pinning]
Targets (issue 13): <= 1.1x warm, <= 1.25x cold (medians).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import models  # noqa: E402
from harness.scenario.prompts import load_tokenizer  # noqa: E402

SCENARIO = """\
name: server-overhead
model: smollm2-135m
engines:
  reference: {{engine: openai, reference: true, options: {{url: "{url}", dialect: vllm, concurrency: 4}}}}
  candidate: {{engine: openai, options: {{url: "{url}", dialect: vllm, concurrency: 4}}}}
prompts:
{prompts}
params: {{temperature: 0, max_new_tokens: {tokens}, ignore_eos: true}}
"""
SERVER = ["-m", "vllm.entrypoints.openai.api_server", "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
          "--served-model-name", "served", "--generation-config", "vllm", "--host", "127.0.0.1",
          "--disable-uvicorn-access-log"]
SERVER_ENV = {"OMP_WAIT_POLICY": "passive", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
TOPICS = ["the sea", "a city at night", "mountains", "a library", "the moon", "a garden", "trains", "winter"]

PLAIN = """
import json, sys, time
main_at = time.monotonic()
from concurrent.futures import ThreadPoolExecutor
import httpx
imported = time.monotonic()
url, bodies = sys.argv[1], json.loads(sys.argv[2])
with httpx.Client(timeout=300) as client, ThreadPoolExecutor(max_workers=8) as pool:
    answers = list(pool.map(lambda body: client.post(url, json=body).json(), bodies))
assert all(a["choices"][0]["logprobs"]["top_logprobs"] for a in answers)
done = time.monotonic()
print("RESULT " + json.dumps({"main_at": main_at, "imports_s": imported - main_at, "requests_s": done - imported}))
"""


def timed(cmd: list[str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{cmd[:4]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def plain(url: str, bodies: list[dict]) -> dict:
    spawned = time.monotonic()
    wall, cpu, out = timed([sys.executable, "-c", PLAIN, f"{url}/completions", json.dumps(bodies)])
    phases = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
    phases["process_start_s"] = phases.pop("main_at") - spawned
    return {"wall_s": wall, "cpu_s": cpu, "phases": phases}


def parity(scenario: Path, out: Path) -> dict:
    wall, cpu, _ = timed([sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)])
    meta = json.loads(next(out.iterdir()).joinpath("run.json").read_text())
    engines = meta["engines"].values()
    phases = {**meta["phases"], **{f"worker {k}": max(e["phases"].get(k, 0.0) for e in engines)
                                   for k in ("process_start_s", "load_s", "effective_s")}}
    return {"wall_s": wall, "cpu_s": cpu, "phases": phases}


def bodies_of(scenario: Path, tmp: Path) -> list[dict]:
    """The request bodies the harness sends (taken from a run's native params and prompt ids)."""
    import pandas as pd

    out = tmp / "probe"
    timed([sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)])
    results = pd.read_parquet(next(out.iterdir()) / "results.parquet")
    return [{**json.loads(r.native_params), "prompt": [int(t) for t in r.prompt_ids], "model": "served"}
            for r in results.itertuples()]


@contextlib.contextmanager
def plain_server(model_path: Path, tmp: Path, cpus: set[int]) -> Iterator[tuple[str, int]]:
    """vLLM's OpenAI server started with its own CLI on these cores (one OpenMP thread each), in a process group of
    its own; yields its /v1 URL (once it answers) and that group's id."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp / "server.log").open("w")
    server = subprocess.Popen([sys.executable, *SERVER, "--model", str(model_path), "--port", str(port)],
                              env={**os.environ, **SERVER_ENV, "OMP_NUM_THREADS": str(len(cpus))},
                              stdout=log, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True,
                              preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                sys.exit(f"the vLLM server exited {server.returncode}: see {tmp / 'server.log'}")
            try:
                if urllib.request.urlopen(f"{url}/models", timeout=5).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("the vLLM server did not answer within 600 s")
                time.sleep(1)
        yield url, server.pid
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
        log.close()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} s (min {min(values):.1f}, max {max(values):.1f})"


def group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the processes of a process group (the server and its engine processes)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while being read
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measure(args: argparse.Namespace, url: str, tmp: Path, effective_cache: Path, server_pgid: int | None) -> None:
    prompts = "\n".join(f'  - {{id: p{i}, text: "Write a few sentences about {TOPICS[i % len(TOPICS)]}, '
                        f'part {i}."}}' for i in range(args.prompts))
    scenario = tmp / "server-overhead.yaml"
    scenario.write_text(SCENARIO.format(url=url, prompts=prompts, tokens=args.tokens))
    bodies = bodies_of(scenario, tmp)
    for mode in args.modes.split(","):
        rows: dict[str, list[dict]] = {"plain": [], "parity": []}
        for i in range(args.repeats):
            for side in (("plain", "parity") if i % 2 == 0 else ("parity", "plain")):
                if mode == "cold":
                    shutil.rmtree(effective_cache, ignore_errors=True)
                server_before = group_cpu_s(server_pgid) if server_pgid else 0.0
                row = plain(url, bodies) if side == "plain" else \
                    parity(scenario, tmp / f"{mode}-{i}")
                if server_pgid:
                    row["phases"]["server_cpu_s"] = group_cpu_s(server_pgid) - server_before
                rows[side].append(row)
                print(f"{mode} repeat {i + 1} {side:6}: wall {row['wall_s']:.1f} s, cpu {row['cpu_s']:.1f} s",
                      flush=True)
        p, h = rows["plain"], rows["parity"]
        ratio = statistics.median(r["wall_s"] for r in h) / statistics.median(r["wall_s"] for r in p)
        target = 1.1 if mode == "warm" else 1.25
        print(f"\n== {mode}: medians of {args.repeats}, {len(bodies)} requests of {args.tokens} tokens ==")
        print(f"plain  wall {spread([r['wall_s'] for r in p])}, cpu {spread([r['cpu_s'] for r in p])}")
        print(f"parity wall {spread([r['wall_s'] for r in h])}, cpu {spread([r['cpu_s'] for r in h])}")
        print(f"ratio parity/plain: wall {ratio:.2f}x (target <= {target})")
        for name, side in (("plain", p), ("parity", h)):
            keys = side[0]["phases"]
            print(f"  {name:6} " + ", ".join(f"{k.removesuffix('_s')} "
                                             f"{statistics.median(r['phases'][k] for r in side):.1f}"
                                             for k in keys))
        print(flush=True)


def layout_cpus(layout: str, every: set[int]) -> tuple[set[int], set[int]]:
    """(server's cores, clients' cores) of a layout."""
    if layout == "shared":
        return every, every
    if layout == "split" and len(every) >= 2:
        last = max(every)
        return every - {last}, {last}
    sys.exit(f"--layouts: '{layout}' is not a layout here (split needs 2 cores; known: split, shared)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument("--layouts", default="split,shared")
    parser.add_argument("--url", help="attach to this server (SmolLM2 fp32, --served-model-name served)")
    args = parser.parse_args()
    model_path = models.resolve("smollm2-135m", "float32")
    load_tokenizer(model_path)
    effective_cache = models.cache_root() / "effective"
    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            measure(args, args.url, Path(tmp), effective_cache, None)
            return
        every = os.sched_getaffinity(0)
        for layout in args.layouts.split(","):
            server_cpus, client_cpus = layout_cpus(layout, every)
            print(f"\n### layout {layout}: server on cores {sorted(server_cpus)}, clients on cores "
                  f"{sorted(client_cpus)}; starting the vLLM server (outside both timings)...", flush=True)
            with plain_server(model_path, Path(tmp), server_cpus) as (url, pgid):
                os.sched_setaffinity(0, client_cpus)  # the clients' processes inherit it
                try:
                    measure(args, url, Path(tmp), effective_cache, pgid)
                finally:
                    os.sched_setaffinity(0, every)


if __name__ == "__main__":
    main()
