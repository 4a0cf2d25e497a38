"""vLLM's beam search: what its BeamSearchParams carry, what it ignores, how it scores, and its own search loops fed
by the oracle.

vLLM runs beam search outside its engine core, in a loop that asks the engine for each live beam's top
2 x beam_width logprobs one step at a time: `LLM.beam_search` (offline, BeamSearchOfflineMixin) and the OpenAI
server's (BeamSearchOnlineMixin, `use_beam_search` with `n` as the beam width). `parity explain` runs those loops, as
vLLM wrote them, with the engine call replaced by the oracle (adapters.sampling.oracle): each live beam's top
logprobs come from the reference model's logits, through the same float32 log_softmax vLLM's sampler uses.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adapters.engines.vllm_beams import (
    CANDIDATES,
    CARRIED,
    EARLY_STOPPING,
    LENGTH,
    score,
    search_params,
)
from adapters.sampling.common import settings_table
from harness.core.types import Beam, Effective
from harness.core.vocabulary import SamplingParams


def step_output(oracle: Any, tokens: list[int], k: int) -> Any:
    """What vLLM's engine answers a one-token request with logprobs=k: the top-k raw logprobs of the next token."""
    import torch
    from vllm.logprobs import Logprob

    logprobs = torch.log_softmax(oracle.logits(tokens), dim=-1, dtype=torch.float32)
    values, ids = logprobs.topk(k)
    top = {int(t): Logprob(logprob=float(v), rank=r + 1) for r, (v, t) in enumerate(zip(values.tolist(), ids.tolist()))}
    return SimpleNamespace(outputs=[SimpleNamespace(logprobs=[top], finish_reason="length")])


def vllm_params(params: SamplingParams, mode: str) -> Any:
    """The BeamSearchParams vLLM builds for these params: offline from the adapter's kwargs, on the server from the
    request body the harness sends, through vLLM's own CompletionRequest (its defaults for what is not sent)."""
    from vllm.sampling_params import BeamSearchParams

    if mode == "offline":
        return BeamSearchParams(**search_params(params))
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from adapters.http.beam_requests import translate as server_translate
    from adapters.http.dialects import DIALECTS

    body = server_translate(params, DIALECTS["vllm"], 1).native_params
    return CompletionRequest(model="model", prompt=[1], **body).to_beam_search_params(params.max_new_tokens, {})


def offline_loop(oracle: Any, tokenizer: Any, prompt_ids: list[int], search: Any) -> list[Any]:
    """vLLM's LLM.beam_search on the oracle: (generated ids, cumulative logprob) of each returned beam."""
    from vllm.entrypoints.generate.beam_search.offline import BeamSearchOfflineMixin

    class OracleLLM(BeamSearchOfflineMixin):
        """The parts of vllm.LLM that its beam-search loop calls; the engine call asks the oracle."""

        llm_engine = SimpleNamespace(input_processor=SimpleNamespace(resolve_watermarking=lambda params: None))
        renderer = SimpleNamespace(get_tokenizer=lambda: tokenizer)

        def _preprocess_cmpl(self, prompts):
            return [{"type": "token", "prompt_token_ids": list(p["prompt_token_ids"])} for p in prompts]

        def _lora_request_to_seq(self, lora_request, n):
            return [None] * n

        def _params_to_seq(self, params, n):
            return [params] * n

        def _render_and_run_requests(self, prompts, params, output_type, lora_requests, use_tqdm):
            return [step_output(oracle, p["prompt_token_ids"], one.logprobs) for p, one in zip(prompts, params)]

    output = OracleLLM().beam_search([{"prompt_token_ids": prompt_ids}], search)[0]
    return [(s.tokens[len(prompt_ids):], s.cum_logprob) for s in output.sequences]


def online_loop(oracle: Any, tokenizer: Any, prompt_ids: list[int], search: Any) -> list[Any]:
    """The vLLM server's beam search on the oracle: (generated ids, cumulative logprob) of each returned beam."""
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin

    async def generate(prompt, sampling_params, request_id, **kwargs):
        yield step_output(oracle, prompt["prompt_token_ids"], sampling_params.logprobs)

    class OracleServer(BeamSearchOnlineMixin):
        """The parts of vLLM's serving class that its beam-search loop calls; the engine call asks the oracle."""

        renderer = SimpleNamespace(get_tokenizer=lambda: tokenizer)
        engine_client = SimpleNamespace(input_processor=SimpleNamespace(resolve_watermarking=lambda params: None),
                                        generate=generate)

    async def collect():
        return [o async for o in OracleServer().beam_search({"type": "token", "prompt_token_ids": prompt_ids},
                                                            "explain", search)]

    final = asyncio.run(collect())[-1]
    return [(list(o.token_ids), o.cumulative_logprob) for o in final.outputs]


def beam_search(model_path: Path, params: SamplingParams, prompt_ids: list[int], oracle: Any, mode: str = "offline",
                **kwargs: Any) -> list[Beam]:
    """vLLM's own beam-search loop (offline, or the server's for the body the harness would send) on the oracle."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    search = vllm_params(params, mode)
    found = (offline_loop if mode == "offline" else online_loop)(oracle, tokenizer, prompt_ids, search)
    eos = tokenizer.eos_token_id
    return [Beam(token_ids=ids, cum_logprob=cum, score=score(prompt_ids, ids, cum, eos, search.length_penalty),
                 finish_reason="stop" if ids and ids[-1] == eos else "length") for ids, cum in found]


def effective(model_path: Path, params: SamplingParams, mode: str) -> Effective:
    """The beam settings vLLM will really use (its own BeamSearchParams), with the defaults the scenario left to it."""
    try:
        beam = vllm_params(params, mode)
    except Exception as exc:  # vLLM's validation errors
        return Effective.refused("vllm", " ".join(str(exc).split())[:300])
    sent = {n for n in CARRIED if getattr(params, n) is not None}
    notes = [f"length_penalty={beam.length_penalty}: vLLM's default (the scenario leaves it unset)"] \
        if "length_penalty" not in sent else []
    return Effective(decoding="beam search", num_beams=beam.beam_width, length_penalty=beam.length_penalty,
                     early_stopping=EARLY_STOPPING, num_return_sequences=beam.beam_width, beam_length=LENGTH,
                     beam_candidates=CANDIDATES, max_new_tokens=beam.max_tokens, repetition_penalty=1.0,
                     repetition_scope="not applied in beam search", logits_dtype="float32",
                     processors=["float32 log_softmax", f"top {2 * beam.beam_width} logprobs per live beam"],
                     sources={n: "request" if n in sent else "engine default" for n in CARRIED}, notes=notes,
                     skip_special_tokens=params.skip_special_tokens is not False,  # the adapter decodes the beams
                     extra=settings_table(model_path, lambda key, value: _applies(model_path, key, value)))


def _applies(model_path: Path, key: str, value: Any) -> tuple[str, str]:
    """vLLM's beam search reads nothing from generation_config.json: a beam ends on the tokenizer's EOS only."""
    if key != "eos_token_id":
        return "no", "vLLM's beam search has no such setting"
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(model_path).eos_token_id
    listed = value if isinstance(value, list) else [value]
    return ("yes" if eos in listed else "no"), f"its beam search ends a beam on the tokenizer's EOS ({eos}) only"
