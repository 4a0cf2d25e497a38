"""lmdeploy's own sampling code, on CPU, without its (CUDA-only) engine: the generation config the pipeline and the
api_server really use (GenerationConfig, the server's request check and build_generation_config with the model's
generation_config.json defaults, AsyncEngine._determine_gen_config, SamplingParam.from_gen_config), and its
FusedLogitsProcessor plus sampling op applied to given logits (the sampler transplant). On CPU its multinomial
op is pointed at lmdeploy's default torch backend (on CUDA it is a Triton kernel)."""

from __future__ import annotations

import asyncio
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adapters.engines.lmdeploy_params import Defaults, translate
from adapters.http.client import translate as request_body
from adapters.http.dialects import DIALECTS
from adapters.sampling.common import DEFAULT, MODEL_JSON, REQUEST, sent_fields, settings_table
from harness.core.types import Effective
from harness.core.vocabulary import SHAPING, SamplingParams

FIELDS = tuple(n for n in SHAPING if n not in ("frequency_penalty", "presence_penalty"))  # lmdeploy has neither
DISTRIBUTIONS = ("lmdeploy",)
SOURCES = ("adapters.engines.lmdeploy_params", "adapters.http.client", "adapters.http.dialects")  # (cache key)
SERVER_LOGPROBS_MODE = "raw_logprobs"  # what the harness starts lmdeploy's api_server with
# Ranges lmdeploy enforces beyond the canonical ones (api_server check_request; GenerationConfig asserts the same),
# for the harness's preflight; tests check them against lmdeploy's own validation.
LIMITS = {"temperature": (0.0, 2.0, "The temperature {value} must be in [0, 2]")}


@lru_cache(maxsize=4)
def _engine_stand_in(model_path: Path) -> Any:
    """What AsyncEngine._determine_gen_config reads from its engine: tokenizer, stop words, the model's HF
    generation config, session length."""
    from lmdeploy.tokenizer import Tokenizer
    from lmdeploy.utils import get_hf_gen_cfg

    return SimpleNamespace(tokenizer=Tokenizer(str(model_path)), stop_words=None,
                           hf_gen_cfg=get_hf_gen_cfg(str(model_path)), session_len=8192)


def final_config(model_path: Path, params: SamplingParams, mode: str, defaults: Defaults,
                      prompt_ids: list[int], server_config: str = "auto") -> tuple[Any, dict, dict]:
    """(the engine's final GenerationConfig, what the adapter sent, the server's defaults). Raises ValueError
    with lmdeploy's message when lmdeploy refuses the params."""
    from lmdeploy.messages import GenerationConfig
    from lmdeploy.serve.core.async_engine import AsyncEngine

    server_defaults: dict = {}
    if mode == "pipeline":
        sent = translate(params, 5, defaults).native_params
        config = _checked(lambda: GenerationConfig(**sent), sent)
    else:
        from lmdeploy.serve.core.generation_config import build_generation_config, resolve_default_gen_config
        from lmdeploy.serve.openai.endpoints.completions import check_request
        from lmdeploy.serve.openai.protocol import CompletionRequest

        sent = request_body(params, DIALECTS["lmdeploy"], 5, "completions", defaults).native_params
        request = CompletionRequest(model="model", prompt="", **sent)
        context = SimpleNamespace(engine_config=SimpleNamespace(logprobs_mode=SERVER_LOGPROBS_MODE),
                                  session_manager=SimpleNamespace(has=lambda session_id: False))
        problem = check_request(request, context)
        if problem:
            raise ValueError(problem)
        server_defaults = resolve_default_gen_config(server_config, str(model_path), False)
        config = _checked(lambda: build_generation_config(request, server_defaults, max_new_tokens=request.max_tokens,
                                                          stop_words=request.stop, random_seed=request.seed), sent)
    return AsyncEngine._determine_gen_config(_engine_stand_in(model_path), prompt_ids, config), sent, server_defaults


# GenerationConfig.__post_init__ (lmdeploy/messages.py) asserts these ranges, two of them without a message
ASSERTED_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}


def _checked(build, sent: dict[str, Any]) -> Any:
    try:
        return build()
    except AssertionError as exc:
        if str(exc):
            raise ValueError(str(exc)) from exc
        for name, (low, high) in ASSERTED_RANGES.items():
            if name in sent and not low <= sent[name] <= high:
                raise ValueError(f"{name} {sent[name]} is outside [{low:g}, {high:g}] (GenerationConfig)") from exc
        raise ValueError("GenerationConfig refused the params (an assertion without a message)") from exc


# the constraint and detokenisation params each mode takes as the canonical vocabulary means them (bad_words: lmdeploy
# bans single tokens containing a word, another rule; include_stop_str_in_output: the server's /generate only)
TAKEN = {"pipeline": ("stop_token_ids", "skip_special_tokens", "spaces_between_special_tokens"),
         "server": ("stop_token_ids", "skip_special_tokens", "spaces_between_special_tokens",
                    "include_stop_str_in_output")}


def effective(model_path: Path, params: SamplingParams, dtype: str, mode: str = "pipeline",
              defaults: Defaults = "canonical", generation_config: str = "auto") -> Effective:
    """generation_config: the server's --generation-config (auto: the model's generation_config.json)."""
    from lmdeploy.pytorch.messages import SamplingParam

    try:
        config, sent, server_defaults = final_config(model_path, params, mode, defaults, [1], generation_config)
    except ValueError as exc:
        return Effective.refused(f"lmdeploy {mode}", " ".join(str(exc).split()))
    engine = SamplingParam.from_gen_config(config)
    greedy = engine.top_k == 1
    sources = {f: REQUEST if sent.get(f) is not None else MODEL_JSON if f in server_defaults else DEFAULT
               for f in FIELDS}
    notes = [f"{f}={server_defaults[f]} from the model's generation_config.json (server --generation-config "
             f"{generation_config})" for f in FIELDS if sources[f] == MODEL_JSON]
    if mode == "pipeline" and not config.do_sample:
        notes.append("do_sample false: lmdeploy decodes greedily as top_k=1, temperature=1, repetition_penalty=1")
    if mode == "server":
        notes.append("the server always samples (do_sample true); temperature 0 becomes top_k=1")
    if dtype != "float32":
        notes.append(f"temperature divides the {dtype} logits as they are (HF and vLLM upcast to float32 first)")
    steps = ["repetition penalty", "temperature"]
    steps += ["argmax"] if greedy else ["top_k", "top_p", "min_p", "softmax", "multinomial"]
    return Effective(
        decoding="greedy" if greedy else "sampling", temperature=engine.temperature, top_k=engine.top_k,
        top_p=engine.top_p, min_p=engine.min_p, repetition_penalty=engine.repetition_penalty,
        repetition_scope="generated tokens only",
        frequency_penalty=None, presence_penalty=None, max_new_tokens=config.max_new_tokens,
        min_new_tokens=config.min_new_tokens or 0, seed=config.random_seed if params.seed is not None else None,
        **{**sent_fields(params, TAKEN[mode], stop_included=False if mode == "server" else None),
           "bad_words": [[t] for t in sorted(config.bad_token_ids or [])] if params.bad_words else None},
        logits_dtype=dtype, processors=steps, sources=sources, notes=notes,
        extra=settings_table(model_path, lambda key, value: _applies(config, server_defaults, key)))


def _applies(config: Any, server_defaults: dict[str, Any], key: str) -> tuple[str, str]:
    """lmdeploy adds the file's eos_token_id to its stop tokens (GenerationConfig.update_from_hf_gen_cfg); its api_
    server with --generation-config auto also takes the file's fields that are GenerationConfig fields."""
    if key == "eos_token_id":
        return "yes", f"added to the stop token ids ({sorted(config.stop_token_ids or [])})"
    if key in server_defaults:
        return "yes", f"the api_server default from the file (--generation-config auto): {server_defaults[key]!r}"
    return "no", "lmdeploy does not read this field: not applied"


def _use_torch_multinomial() -> None:
    """lmdeploy's sampling op dispatches to a Triton kernel on CUDA; on CPU use its own default torch backend."""
    import lmdeploy.pytorch.nn.multinomial_sampling as multinomial
    from lmdeploy.pytorch.backends.default.op_backend import DefaultOpsBackend

    multinomial.get_backend = lambda *args, **kwargs: DefaultOpsBackend


def transplant(model_path: Path, params: SamplingParams, logits: Any, token_ids: list[int], prompt_len: int,
               record: Any, mode: str = "pipeline", defaults: Defaults = "canonical",
               generation_config: str = "auto") -> None:
    import numpy as np
    import torch
    from lmdeploy.pytorch.engine.logits_process import (
        FusedLogitsProcessor,
        _filter_minp_sorted_,
        _filter_topk_sorted_,
        _filter_topp_sorted_,
        _torch_topk,
    )
    from lmdeploy.pytorch.messages import SamplingParam
    from lmdeploy.pytorch.strategies.ar.sampling import ARSamplingStrategy

    _use_torch_multinomial()
    config, _, _ = final_config(model_path, params, mode, defaults, token_ids[:prompt_len], generation_config)
    engine_params = SamplingParam.from_gen_config(config)
    strategy = ARSamplingStrategy(pad_token_id=0)
    for step in range(logits.shape[0]):
        generated = np.array(token_ids[prompt_len : prompt_len + step], dtype=np.int64)
        valid = np.array(token_ids[: prompt_len + step], dtype=np.int64)
        sequence = SimpleNamespace(sampling_param=engine_params, num_valid_ids=len(valid), valid_ids=valid,
                                   num_new_tokens=len(generated), generated_ids=generated,
                                   session=SimpleNamespace(session_id=0), seq_id=0)
        inputs = strategy.make_sampling_inputs([sequence]).to_device("cpu")
        processor = FusedLogitsProcessor(inputs)
        scores, _ = asyncio.run(processor(logits[step : step + 1].clone()))
        record.op(step, f"repetition penalty and temperature division (in {str(scores.dtype)[6:]})", scores)
        greedy = inputs.max_top_k == 1
        if not greedy:
            kept, indices = (scores.sort(1, descending=True) if inputs.max_top_k <= 0
                             else _torch_topk(scores, inputs.max_top_k, dim=1))
            for _name, apply, value in (("top_k", _filter_topk_sorted_, inputs.top_k),
                                       ("top_p", _filter_topp_sorted_, inputs.top_p),
                                       ("min_p", _filter_minp_sorted_, inputs.min_p)):
                if value is not None:
                    kept = apply(kept, value)
            record.op(step, "softmax", kept.softmax(1))
            try:
                processor.sampling(scores.clone())  # the engine's own op, on what its processor produced
            except RuntimeError as exc:
                record.failure(step, "multinomial sampling", exc)
            scores = torch.full_like(scores, float("-inf")).scatter(1, indices, kept)
        record.step(step, scores[0], sampling=not greedy)
