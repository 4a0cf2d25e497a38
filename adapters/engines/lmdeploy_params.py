"""Canonical params -> lmdeploy pipeline GenerationConfig kwargs. Shared by the pipeline engine and lmdeploy's
sampling module (effective params, transplant), which must see exactly what the engine would be given."""

from __future__ import annotations

from typing import Any, Literal

from adapters.contract import greedy_ignored
from harness.core.types import Translation
from harness.core.vocabulary import SamplingParams

# canonical: an unset param means its canonical neutral value (greedy when temperature is unset, no truncation);
# engine: only what the scenario set is passed, so lmdeploy's own defaults apply (pipeline: do_sample False,
# temperature 0.8, top_k 50)
Defaults = Literal["canonical", "engine"]


def translate(params: SamplingParams, top_logprobs: int = 5, defaults: Defaults = "canonical") -> Translation:
    warnings = greedy_ignored(params)
    native: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "logprobs": top_logprobs}
    if defaults == "engine":
        set_fields = params.set_fields()
        for name in ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty"):
            if name in set_fields:
                native[name] = set_fields[name]
    else:
        native["do_sample"] = not params.greedy
        if not params.greedy:
            native.update(temperature=params.temperature or 1.0, top_k=params.top_k or 0,
                          top_p=params.top_p or 1.0, min_p=params.min_p or 0.0)
        native["repetition_penalty"] = params.repetition_penalty or 1.0
    if params.greedy and (params.repetition_penalty or 1.0) != 1.0:
        warnings.append(f"repetition_penalty={params.repetition_penalty} NOT APPLIED: the lmdeploy pipeline resets "
                        "it to 1.0 when do_sample is false")
    elif params.repetition_penalty not in (None, 1.0):
        warnings.append(f"repetition_penalty={params.repetition_penalty}: lmdeploy counts generated tokens only, "
                        "never the prompt (HF and vLLM count both)")
    for penalty in ("frequency_penalty", "presence_penalty"):
        if getattr(params, penalty):
            warnings.append(f"{penalty}={getattr(params, penalty)} NOT APPLIED: lmdeploy has no {penalty}")
    if params.min_new_tokens:
        native["min_new_tokens"] = params.min_new_tokens
    if params.ignore_eos:
        native["ignore_eos"] = True
    if params.seed is not None:
        native["random_seed"] = params.seed
    if params.stop:
        native["stop_words"] = list(params.stop)
    native.update({name: value for name in SAME_NAMED if (value := getattr(params, name)) is not None})
    warnings += [f"{name}={value.kind if name == 'constraint' else value} NOT APPLIED: {why}"
                 for name, why in NOT_APPLIED.items() if (value := getattr(params, name)) not in (None, 0, False)]
    if params.bad_words:
        warnings.append(f"bad_words={params.bad_words}: lmdeploy bans every single token whose text contains a word "
                        "(Tokenizer.indexes_containing_token), not the word's token sequence (HF, vLLM)")
    if params.include_stop_str_in_output and params.stop:
        warnings.append("include_stop_str_in_output=True NOT APPLIED: the pipeline's GenerationConfig has no such "
                        "field (its api_server's /generate has)")
    return Translation(native_params=native, warnings=warnings)


# canonical params lmdeploy's GenerationConfig takes under the same name and meaning (bad_words: another rule)
SAME_NAMED = ("stop_token_ids", "bad_words", "skip_special_tokens", "spaces_between_special_tokens")
NOT_APPLIED = {
    "no_repeat_ngram_size": "lmdeploy has no n-gram ban (its repetition_ngram_size ends a generation that repeats, "
                            "it bans nothing)",
    "logit_bias": "lmdeploy's GenerationConfig has no logit_bias (only custom logits_processors)",
    "constraint": "this adapter does not pass lmdeploy's response_format (its guided decoding)",
}
