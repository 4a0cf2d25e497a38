"""What vLLM's beam search takes: the BeamSearchParams a scenario's params become, the params it does not apply, and
its own score of a finished beam (vLLM's code). The engines use these to run beam search; adapters.sampling.vllm_beams
runs vLLM's search loops on the oracle for `parity explain`."""

from __future__ import annotations

from typing import Any

from harness.core.vocabulary import GREEDY_IRRELEVANT, SamplingParams

# canonical param -> BeamSearchParams field: all vLLM's beam search takes (temperature is 0: the search is greedy)
CARRIED = {"num_beams": "beam_width", "max_new_tokens": "max_tokens", "ignore_eos": "ignore_eos",
           "length_penalty": "length_penalty"}
WHY_NOT = {
    "early_stopping": "vLLM's beam search has no early stopping: it runs to max_tokens and keeps every finished "
                      "beam",
    "no_repeat_ngram_size": "vLLM has no n-gram ban, in beam search or elsewhere",
    "num_return_sequences": "vLLM returns beam_width beams (on its server n is the beam width); the comparison "
                            "uses the best {value}",
}
LENGTH = "prompt + generated tokens excl. EOS"
CANDIDATES = "any EOS among a live beam's top 2 x width"
EARLY_STOPPING = "none: runs to max_tokens"


def not_applied(params: SamplingParams) -> list[str]:
    """A NOT APPLIED warning for each param the scenario set that vLLM's beam search does not take."""
    warnings = []
    for name, value in params.set_fields().items():
        if name in CARRIED or name in GREEDY_IRRELEVANT or name in ("do_sample", "skip_special_tokens") or \
                (name == "num_return_sequences" and value == params.num_beams):
            continue  # greedy-irrelevant params are warned about already; the adapter decodes the beams' text
        why = WHY_NOT.get(name, f"vLLM's beam search takes only {', '.join(CARRIED)}").format(value=value)
        warnings.append(f"{name}={value} NOT APPLIED: {why}")
    return warnings


def search_params(params: SamplingParams) -> dict[str, Any]:
    """BeamSearchParams kwargs for these canonical params (length_penalty unset: vLLM's default)."""
    native = {CARRIED[n]: getattr(params, n) for n in CARRIED if getattr(params, n) is not None}
    return {**native, "temperature": 0.0}


def score(prompt_ids: list[int], beam_ids: list[int], cum_logprob: float, eos_id: int, length_penalty: float) -> float:
    """vLLM's own score of a finished beam (the key its loop ranks by), from vLLM's code."""
    from vllm.entrypoints.generate.beam_search.utils import get_beam_search_score

    return get_beam_search_score([*prompt_ids, *beam_ids], cum_logprob, eos_id, length_penalty)
