"""HF transformers' own sampling code, without running the model: the generation config generate() will really use
(explicit kwargs > the model folder's generation_config.json > HF's global defaults, merged by HF's own
_prepare_generation_config), the logits processors it builds from it, and those processors applied to given logits
(the sampler transplant). A model on the meta device carries the config, so no weights are loaded."""

from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from adapters.engines.hf import translate
from adapters.engines.hf_beams import effective_fields, oracle_search
from adapters.engines.hf_kwargs import as_list, generate_kwargs
from adapters.sampling.common import DEFAULT, settings_table, source_of
from harness.core.types import Effective
from harness.core.vocabulary import BEAM, BEAM_OPTIONS, GREEDY_IRRELEVANT, SHAPING, SamplingParams

DISTRIBUTIONS = ("transformers",)
# modules the answers also depend on (cache key)
SOURCES = ("adapters.engines.hf", "adapters.engines.hf_beams", "adapters.engines.hf_kwargs")
# the fields whose source (request or file) is reported
SOURCED = (*SHAPING, "max_new_tokens", "min_new_tokens", *BEAM, "no_repeat_ngram_size")


@lru_cache(maxsize=4)
def meta_model(model_path: Path) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with contextlib.suppress(OSError):  # no generation_config.json: HF's defaults apply
        model.generation_config = GenerationConfig.from_pretrained(model_path)  # from_config does not read it
    return model


@lru_cache(maxsize=4)
def tokenizer_of(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def merged_config(model: Any, native: dict[str, Any], model_path: Path) -> Any:
    """The generation config generate() merges from the adapter's kwargs (a tokenizer is loaded only where bad words
    need one), the model's generation_config.json and HF's defaults."""
    tokenizer = tokenizer_of(model_path) if native.get("bad_words") else None
    kwargs = generate_kwargs(native, as_list(model.generation_config.eos_token_id), tokenizer)
    for not_config in ("tokenizer", "stop_strings"):  # generate() arguments, not generation-config fields
        kwargs.pop(not_config, None)
    config, _ = model._prepare_generation_config(None, **kwargs)
    return config


def request_fields(config: Any, native: dict[str, Any], model_eos: list[int]) -> dict[str, Any]:
    """The constraint and detokenisation settings generate() and the adapter's decode will use."""
    skip = native.get("skip_special_tokens", True)
    bias = {seq[0]: value for seq, value in (config.sequence_bias or {}).items() if len(seq) == 1}
    return {"stop_token_ids": [t for t in as_list(config.eos_token_id) if t not in model_eos] or None,
            "include_stop_str_in_output": True if native.get("stop_strings") or not skip else None,
            "no_repeat_ngram_size": config.no_repeat_ngram_size or 0, "logit_bias": bias or None,
            "bad_words": config.bad_words_ids, "skip_special_tokens": skip,
            "spaces_between_special_tokens": None if skip else False}


def effective(model_path: Path, params: SamplingParams, dtype: str) -> Effective:
    native = translate(params).native_params
    try:
        model = meta_model(model_path)
        config = merged_config(model, native, model_path)
        config.validate()  # what generate() does: errors raise, minor issues only warn
    except ValueError as exc:
        return Effective.refused("hf", str(exc).splitlines()[0])
    ignored = minor_issues(config)
    json_config = model.generation_config.to_diff_dict()
    sources = {}
    for field in SOURCED:
        sources[field] = source_of(field, native, json_config)
    sampling = bool(config.do_sample)
    beam = effective_fields(config) if config.num_beams > 1 else {}
    return Effective(
        decoding="beam search" if beam else "sampling" if sampling else "greedy", **beam,
        **request_fields(config, native, as_list(model.generation_config.eos_token_id)),
        temperature=config.temperature if sampling else None, top_k=config.top_k if sampling else None,
        top_p=config.top_p if sampling else None, min_p=config.min_p if sampling else None,
        repetition_penalty=config.repetition_penalty,
        repetition_scope="prompt and output tokens",
        frequency_penalty=None, presence_penalty=None,
        max_new_tokens=config.max_new_tokens, min_new_tokens=config.min_new_tokens or 0,
        seed=native.get("torch_manual_seed"), logits_dtype="float32",
        processors=processor_names(model, config, [1]), sources=sources,
        extra=settings_table(model_path, lambda key, value: _applies(config, key, ignored)),
        notes=[f"{f}={json_config[f]} from the model's generation_config.json"
               for f, s in sources.items() if s == "generation_config.json"
               and (sampling or f not in GREEDY_IRRELEVANT)]
        + [f"generate() warns and ignores {key}: {issue}" for key, issue in ignored.items()]
        + [f"{f}={getattr(config, f)!r}: HF's default (neither the scenario nor generation_config.json sets it)"
           for f in BEAM_OPTIONS if beam and sources[f] == DEFAULT])


def minor_issues(config: Any) -> dict[str, str]:
    """The settings generate() only warns about and does not use (e.g. a sampling flag while decoding greedily),
    as its own strict validation lists them: attribute -> the reason."""
    try:
        config.validate(strict=True)
    except ValueError as exc:
        lines = str(exc).splitlines()
        return {line.split("`")[1]: line.split(":", 1)[1].strip() for line in lines if line.startswith("- `")}
    return {}


def _applies(config: Any, key: str, ignored: dict[str, str]) -> tuple[str, str]:
    """HF merges every generation_config.json field into the config generate() uses; one it does not know is kept
    but unused, and one it only warns about (a sampling flag while greedy) is ignored."""
    from transformers import GenerationConfig

    if not hasattr(GenerationConfig(), key):
        return "no", "not a transformers generation setting: kept in the config, never used"
    if key in ignored:
        return "no", f"generate() warns and ignores it: {ignored[key]}"
    return "yes", f"generate() uses {key}={getattr(config, key)!r}"


def processors(model: Any, config: Any, prompt_ids: list[int]) -> Any:
    import torch

    config._eos_token_tensor = None
    model._prepare_special_tokens(config, kwargs_has_attention_mask=True, device="cpu")
    prompt = torch.tensor([prompt_ids])
    return model._get_logits_processor(generation_config=config, input_ids_seq_length=len(prompt_ids),
                                       encoder_input_ids=prompt, device="cpu", model_kwargs={})


def processor_names(model: Any, config: Any, prompt_ids: list[int]) -> list[str]:
    return [type(p).__name__ for p in processors(model, config, prompt_ids)]


def transplant(model_path: Path, params: SamplingParams, logits: Any, token_ids: list[int], prompt_len: int,
               record: Any) -> None:
    """Run HF's processors over the reference logits of each generated step, as generate() would: logits upcast to
    float32, then the processor list (penalties always; temperature and truncation when sampling). `record` gets
    each step's processed scores and the operations' outputs for hazard checks."""
    import torch

    native = translate(params).native_params
    model = meta_model(model_path)
    config = merged_config(model, native, model_path)
    chain = processors(model, config, token_ids[:prompt_len])
    for step in range(logits.shape[0]):
        context = torch.tensor([token_ids[: prompt_len + step]])
        scores = logits[step : step + 1].to(torch.float32)
        record.op(step, "upcast to float32", scores)
        for processor in chain:
            scores = processor(context, scores)
            record.op(step, type(processor).__name__, scores)
        record.step(step, scores[0], sampling=bool(config.do_sample))


def beam_search(model_path: Path, params: SamplingParams, prompt_ids: list[int], oracle: Any) -> list[Any]:
    """HF's own beam search on the oracle's logits (`parity explain` for beams), with the hf adapter's kwargs."""
    from transformers import AutoTokenizer

    return oracle_search(oracle, prompt_ids, translate(params).native_params, AutoTokenizer.from_pretrained(model_path))
