"""Faults planted in HF copies of the tiny mixture-of-experts models (scenarios/moe-*.yaml), each in layer LAYER only,
each the class of a reported engine bug; `parity explain` names the first three and glm4_moe's ignored bias with
their layer and kind, and the batch knob catches batch_dependent_router (scenarios/moe-invariance.yaml). Each is a
model patch (an engine option: `patch: "moe_faults:<name>"`); the router hooks rewrite what HF's router module
returns: (router logits, the chosen experts' weights, their ids)."""

from __future__ import annotations

from typing import Any

LAYER, EXPERT = 1, 0  # expert 0 wins at about half of the positions (the tiny routers' row a; expert 1's is -a)


def _scores(model: Any, logits: Any) -> Any:
    """The family's own selection scores: sigmoid for GLM-4.5, softmax for the others."""
    return logits.float().sigmoid() if model.config.model_type == "glm4_moe" else logits.float().softmax(-1)


def _renormalises(model: Any) -> bool:
    return model.config.model_type != "qwen2_moe"


def _router(model: Any) -> Any:
    return model.model.layers[LAYER].mlp.gate


def weighting(model: Any) -> None:
    """The chosen experts' weights left raw where the family renormalises them and renormalised where it does not
    (sglang#35160: a renormalize=False path returned unnormalised weights)."""
    def hook(module: Any, args: Any, out: Any) -> Any:
        logits, weights, ids = out
        raw = _scores(model, logits).gather(1, ids) * getattr(module, "routed_scaling_factor", 1.0)
        return logits, (raw if _renormalises(model) else raw / raw.sum(-1, keepdim=True)).to(weights.dtype), ids

    _router(model).register_forward_hook(hook)


def shifted_rule(model: Any) -> None:
    """The experts chosen from the router logits shifted all-negative by a maximum search that starts at 0, a rule
    not invariant to a constant shift (vllm#38859: routing wrong when every router logit is negative). The router
    logits themselves are unchanged; the weights are the family's scores of the experts chosen."""
    def hook(module: Any, args: Any, out: Any) -> Any:
        logits, weights, ids = out
        shifted = logits - logits.max(-1, keepdim=True).values - 1.0
        chosen = shifted.clamp(min=0.0).topk(ids.shape[1], dim=-1).indices
        picked = _scores(model, logits).gather(1, chosen)
        if _renormalises(model):
            picked = picked / picked.sum(-1, keepdim=True)
        return logits, picked.to(weights.dtype), chosen

    _router(model).register_forward_hook(hook)


def expert(model: Any) -> None:
    """Expert EXPERT's down projection scaled by 1.01 (an expert kernel's error)."""
    model.model.layers[LAYER].mlp.experts.down_proj.data[EXPERT] *= 1.01


def batch_dependent_router(model: Any) -> None:
    """Expert 3's router logit raised by 0.05 whenever the block sees more than one sequence, enough to flip the tiny
    routers' near tie between experts 2 and 3 (sglang#19431: outputs change with the batch size)."""
    block = model.model.layers[LAYER].mlp
    batch = {"size": 1}
    block.register_forward_pre_hook(lambda module, args: batch.update(size=args[0].shape[0]))

    def hook(module: Any, args: Any, out: Any) -> Any:
        logits, weights, ids = out
        if batch["size"] == 1:
            return out
        raised = logits.clone()
        raised[:, 3] += 0.05
        scores = _scores(model, raised)
        chosen = scores.topk(ids.shape[1], dim=-1).indices
        picked = scores.gather(1, chosen)
        if _renormalises(model):
            picked = picked / picked.sum(-1, keepdim=True)
        return raised, picked.to(weights.dtype), chosen

    _router(model).register_forward_hook(hook)


def ignored_bias(model: Any) -> None:
    """GLM-4.5's experts chosen by their sigmoid scores alone, the score-correction bias left out of the selection (an
    engine that drops the load-balancing bias chooses otherwise wherever the bias decides); the weights are the scores
    of the experts chosen, renormalised. The router logits are unchanged."""
    if model.config.model_type != "glm4_moe":
        raise ValueError("ignored_bias: only glm4_moe's router has a score-correction bias")

    def hook(module: Any, args: Any, out: Any) -> Any:
        logits, weights, ids = out
        scores = _scores(model, logits)
        chosen = scores.topk(ids.shape[1], dim=-1).indices
        picked = scores.gather(1, chosen)
        picked = picked / picked.sum(-1, keepdim=True) * getattr(module, "routed_scaling_factor", 1.0)
        return logits, picked.to(weights.dtype), chosen

    _router(model).register_forward_hook(hook)
