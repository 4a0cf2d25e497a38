"""Harness overhead against a server: `parity run` vs bare OpenAI-client calls, same server, same requests.

One vLLM OpenAI server (SmolLM2 fp32, eager) is started once and excluded from both timings. The scenario has two
`openai` engines attached to it (reference and candidate), each sending the same N completions requests
(token-id prompts, greedy, top-5 logprobs, 4 at a time); the bare side sends those 2 x N requests with the
`openai` package and 4 threads, engine by engine like `parity run --parallel 1`. Prints both wall times and
the ratio (target <= 1.15). Usage:  python benchmarks/server_overhead.py [--prompts N] [--tokens T] [--repeats R]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.engines.vllm_server import Options, launch  # noqa: E402
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

TOPICS = ["the sea", "a city at night", "mountains", "a library", "the moon", "a garden", "trains", "winter"]


def prompt_texts(n: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]} (version {i})." for i in range(n)]


def bare(base_url: str, model: str, prompt_ids: list[list[int]], tokens: int) -> float:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none")

    def one(ids: list[int]) -> None:
        client.completions.create(model=model, prompt=ids, max_tokens=tokens, temperature=0.0, logprobs=5,
                                  extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True,
                                              "return_token_ids": True})

    started = time.perf_counter()
    for _engine in ("reference", "candidate"):
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(one, prompt_ids))
    return time.perf_counter() - started


def parity(scenario: Path, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out), "--parallel", "1"],
                   cwd=ROOT, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model_path = models.resolve("smollm2-135m", "float32")
    tokenizer = load_tokenizer(model_path)
    texts = prompt_texts(args.prompts)
    prompt_ids = [tokenizer.encode(t) for t in texts]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        server, base, _ = launch(model_path, "float32", Path(tmp), Options())
        print(f"server start-up: {time.perf_counter() - started:.1f} s (excluded)", flush=True)
        try:
            scenario = Path(tmp) / "scenario.yaml"
            scenario.write_text(SCENARIO.format(url=base, tokens=args.tokens,
                                                prompts="\n".join(f"  - {t!r}" for t in texts)))
            bare(base, str(model_path), prompt_ids[:2], 4)  # warm the server up once, for both sides
            rows = []
            for i in range(args.repeats):
                b = bare(base, str(model_path), prompt_ids, args.tokens)
                p = parity(scenario, Path(tmp) / f"reports{i}")
                rows.append((b, p))
                print(f"run {i + 1}: bare openai client {b:.1f} s | parity run {p:.1f} s | ratio {p / b:.3f}",
                      flush=True)
        finally:
            server.stop()
    b, p = (min(col) for col in zip(*rows, strict=False))
    print(f"requests: 2 engines x {args.prompts} prompts x {args.tokens} tokens, 4 concurrent")
    print(f"ratio parity/bare (best of {args.repeats}): {p / b:.3f}  (target <= 1.15)")


if __name__ == "__main__":
    main()
