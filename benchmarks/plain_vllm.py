"""The plain vLLM side of benchmarks/overhead.py and benchmarks/scale.py: vLLM's own offline API at its best settings
here, in a process of its own, timed by phase. `LLM(model, dtype="float32", enforce_eager=True, max_model_len=512,
kv_cache_memory_bytes=KV_CACHE_BYTES, seed=0)`, then one `generate` call of every prompt's ids (its scheduler batches
them), greedy, top-5 logprobs. Prints one line: RESULT {"main_at", "imports_s", "load_s", "generate_s"}, in
time.monotonic() (one clock for every process of a benchmark: the caller subtracts its spawn time from main_at).

Usage: python benchmarks/plain_vllm.py MODEL_PATH PROMPT_IDS_JSON MAX_NEW_TOKENS KV_CACHE_BYTES [--no-prefix-caching]
"""

import time

main_at = time.monotonic()

import json  # noqa: E402
import sys  # noqa: E402


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    imported = time.monotonic()
    path, prompts_file, max_new, kv_cache_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    switches = {"enable_prefix_caching": False} if "--no-prefix-caching" in sys.argv[5:] else {}
    with open(prompts_file) as file:
        prompts = json.load(file)
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=kv_cache_bytes,
              seed=0, **switches)
    loaded = time.monotonic()
    llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                 SamplingParams(temperature=0.0, max_tokens=max_new, logprobs=5), use_tqdm=False)
    done = time.monotonic()
    print("RESULT " + json.dumps({"main_at": main_at, "imports_s": imported - main_at, "load_s": loaded - imported,
                                  "generate_s": done - loaded}), flush=True)


if __name__ == "__main__":
    main()
