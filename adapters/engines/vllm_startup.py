"""What the offline vLLM engine skips of vllm.LLM's start-up, none of which changes a token or a logprob: work done
for a CUDA process, an API server or chat requests, which a harness worker (one thread, token ids in, on CPU) never
is or sends. Measured on an AVX2 EPYC, one thread, medians of two: LLM() for Gemma 3 270M 19.5 -> 9.1 s of CPU,
SmolLM2-135M 4.5 -> 3.4 s, the same greedy tokens."""

from __future__ import annotations


def lighten_vllm_startup() -> None:
    """Call before vllm.LLM(...). Each change names the vLLM 0.32 code it replaces (and is in 0.25.1, the CUDA build
    the GPU check runs). The model-inspection subprocess stays where CUDA is: it keeps CUDA out of the engine's
    process until vLLM initialises it itself."""
    import torch
    from vllm.model_executor.models import registry
    from vllm.renderers import hf as renderers

    # vLLM inspects a model class it has not cached yet ($VLLM_CACHE_ROOT/modelinfos, once per architecture) in a
    # subprocess that imports vLLM again, so as not to initialise CUDA in the engine's process: 30 s of CPU on a 2-core
    # machine, the first time each architecture runs on a fresh machine (every time in a fresh CI container). On CPU
    # there is no CUDA to protect, and the worker imports the model's module anyway: it inspects the class itself, and
    # vLLM caches the result as before (its server, started later, reads that cache).
    if not torch.cuda.is_available():
        registry._run_in_subprocess = lambda inspect: inspect()
    # The renderer deep-copies the tokenizer twice into a pool for threads rendering requests at once (an API
    # server's); a worker tokenizes and detokenizes in its one thread. Gemma 3's 262k-entry tokenizer: 3.3 s a copy.
    renderers.maybe_make_thread_pool = lambda tokenizer, copies=1: tokenizer
    # LLM() warms the chat template up by rendering a chat, for which transformers loads the model's processor (the
    # tokenizer again: 4.3 s for Gemma 3). The harness sends token ids it rendered itself, never a chat.
    renderers.HfRenderer.warmup = lambda self, chat_params: None
