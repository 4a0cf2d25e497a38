"""HF transformers beam search: generate(num_beams=...) (GenerationMixin._beam_search) and the beams it returns.

Shared by the hf engine (the real run) and HF's beam loop fed by the oracle (`parity explain`): the same call, the
same reading of its output. Per beam: the generated ids (up to its own end; HF pads shorter beams), the logprob of
each token as the search scored it (compute_transition_scores: log_softmax after HF's logits processors), their sum,
and HF's own final score (sequences_scores: the sum divided by the generated length ** length_penalty).
"""

from __future__ import annotations

from typing import Any

from adapters.engines.hf_kwargs import as_list, decode_text, generate_kwargs
from harness.core.types import Beam


def generate_beams(model: Any, prompt_ids: list[int], native: dict[str, Any], pad_id: int, eos_ids: set[int],
                   tokenizer: Any, **extra: Any) -> list[Beam]:
    """Run HF's beam search for one prompt with the adapter's native kwargs; the returned beams, best first."""
    import torch

    kwargs = generate_kwargs(native, eos_ids, tokenizer)
    ends = set(eos_ids) | set(native.get("stop_token_ids") or [])
    prompt = torch.tensor([prompt_ids], device=model.device)
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
                          finish_reason="stop" if ids and ids[-1] in ends else "length",
                          text=decode_text(tokenizer, ids, native)))
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

    eos_ids = set(as_list(model.generation_config.eos_token_id))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    saved = model.__dict__.get("forward")  # a forward set on the instance (a hook) comes back afterwards
    model.forward = answer
    try:
        return generate_beams(model, prompt_ids, native, pad, eos_ids, tokenizer, use_cache=False)
    finally:
        if saved is None:
            del model.forward
        else:
            model.forward = saved
