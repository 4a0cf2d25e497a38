"""HF transformers beam search: generate(num_beams=...) (GenerationMixin._beam_search) and the beams it returns.

Shared by the hf engine (the real run) and HF's beam loop fed by the oracle (`parity explain`): the same call, the
same reading of its output. Per beam: the generated ids (up to its own end; HF pads shorter beams), the logprob of
each token as the search scored it (compute_transition_scores: log_softmax after HF's logits processors), their sum,
and HF's own final score (sequences_scores: the sum divided by the generated length ** length_penalty).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core.types import Beam

NOT_GENERATE_KWARGS = ("torch_manual_seed",)  # adapter bookkeeping, not a generate() argument


def generate_beams(model: Any, prompt_ids: list[int], native: dict[str, Any], pad_id: int, eos_ids: set[int],
                   decode: Callable[[list[int]], str], **extra: Any) -> list[Beam]:
    """Run HF's beam search for one prompt with the adapter's native kwargs; the returned beams, best first."""
    import torch

    kwargs = {k: v for k, v in native.items() if k not in NOT_GENERATE_KWARGS}
    prompt = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), pad_token_id=pad_id,
                             return_dict_in_generate=True, output_scores=True, **kwargs, **extra)
        steps = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices, normalize_logits=False)
    beams = []
    for row in range(out.sequences.shape[0]):
        length = int((out.beam_indices[row] >= 0).sum())  # -1 marks the steps after this beam ended
        ids = out.sequences[row, len(prompt_ids): len(prompt_ids) + length].tolist()
        logprobs = steps[row, :length].tolist()
        beams.append(Beam(token_ids=ids, logprobs=logprobs, cum_logprob=sum(logprobs),
                          score=float(out.sequences_scores[row]),
                          finish_reason="stop" if ids and ids[-1] in eos_ids else "length", text=decode(ids)))
    return beams


LENGTH = "generated tokens incl. EOS"
CANDIDATES = "EOS only among the top num_beams candidates"
EARLY_STOPPING = {True: "true: once num_beams beams finished", False: "false: heuristic at the current length",
                  "never": "never: heuristic at max_length"}


def effective_fields(config: Any) -> dict[str, Any]:
    """The beam settings generate() will really use (HF's merged generation config), for Effective."""
    return {"num_beams": config.num_beams, "length_penalty": config.length_penalty,
            "early_stopping": EARLY_STOPPING.get(config.early_stopping, str(config.early_stopping)),
            "num_return_sequences": config.num_return_sequences, "beam_length": LENGTH, "beam_candidates": CANDIDATES}


def oracle_search(oracle: Any, prompt_ids: list[int], native: dict[str, Any], tokenizer: Any) -> list[Beam]:
    """HF's own beam search (generate -> _beam_search) with the oracle's logits in place of the model's: for this
    call the model's forward answers each row's last position from the oracle (use_cache off, so each row is a
    whole sequence); every other step is HF's."""
    import torch
    from transformers.modeling_outputs import CausalLMOutputWithPast

    model = oracle.model

    def answer(input_ids: Any = None, **kwargs: Any) -> Any:
        rows = [oracle.logits(row.tolist()) for row in input_ids]
        return CausalLMOutputWithPast(logits=torch.stack(rows)[:, None, :])

    eos_ids = set(_as_list(model.generation_config.eos_token_id))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    extra = {"tokenizer": tokenizer} if "stop_strings" in native else {}
    saved = model.__dict__.get("forward")  # a forward set on the instance (a hook) comes back afterwards
    model.forward = answer
    try:
        return generate_beams(model, prompt_ids, native, pad, eos_ids,
                              lambda ids: tokenizer.decode(ids, skip_special_tokens=True), use_cache=False, **extra)
    finally:
        if saved is None:
            del model.forward
        else:
            model.forward = saved


def _as_list(value: Any) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
