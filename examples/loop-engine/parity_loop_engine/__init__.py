"""`loop`: an engine written by following docs/adding-an-engine.md, registered through the `llm_parity.engines`
entry point. It decodes greedily with the HF model's forward pass in a plain Python loop (a KV cache, one token per
step): a second, independent implementation of greedy decoding to hold HF's generate() to."""

from __future__ import annotations

import time
from collections.abc import Iterator

from pydantic import Field

from adapters.contract import Capabilities, EngineDescription, EngineOptions, Requirement, SamplingCode, greedy_ignored
from harness.core.types import EngineSetup, Request, Result, Translation
from harness.core.vocabulary import PENALTIES, SamplingParams


class Options(EngineOptions):
    use_cache: bool = True  # False: recompute the whole sequence at every step (slow, but no cache at all)
    top_logprobs_cap: int = Field(20, ge=1)


def translate(params: SamplingParams) -> Translation:
    """Greedy is all this engine does: every param that would change that is reported, not silently dropped."""
    warnings = greedy_ignored(params)
    if not params.greedy:
        warnings.append("do_sample NOT APPLIED: the loop engine decodes greedily only")
    warnings += [f"{name}={getattr(params, name)} NOT APPLIED: the loop engine has no penalties"
                 for name in PENALTIES if getattr(params, name) not in (None, 0.0, 1.0)]
    if params.stop:
        warnings.append("stop NOT APPLIED: the loop engine stops on EOS or max_new_tokens only")
    native = {"max_new_tokens": params.max_new_tokens, "stop_on_eos": not params.ignore_eos,
              "min_new_tokens": params.min_new_tokens or 0}
    return Translation(native_params=native, warnings=warnings)


class Engine:
    def __init__(self, setup: EngineSetup):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch, self.name, self.options = torch, setup.name, Options(**setup.options)
        self.model = AutoModelForCausalLM.from_pretrained(setup.model_path, dtype=getattr(torch, setup.dtype))
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def versions(self) -> dict[str, str]:
        import transformers

        return {"transformers": transformers.__version__, "torch": self.torch.__version__}

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        return translate(params)

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        for request in requests:
            yield self._one(request)

    def _one(self, request: Request) -> Result:
        torch = self.torch
        translation = self.translate(request.params, request.top_logprobs)
        native = translation.native_params
        k = min(request.top_logprobs, self.options.top_logprobs_cap)
        ids = list(request.prompt_ids)
        generated, chosen, top_ids, top_values, cache = [], [], [], [], None
        finish = "length"
        started = time.perf_counter()
        with torch.inference_mode():
            for step in range(native["max_new_tokens"]):
                fresh = ids if cache is None else ids[-1:]
                out = self.model(input_ids=torch.tensor([fresh]), past_key_values=cache,
                                 use_cache=self.options.use_cache)
                cache = out.past_key_values if self.options.use_cache else None
                logprobs = out.logits[0, -1].float().log_softmax(-1)
                values, best = logprobs.topk(k)
                scores = logprobs.clone()
                if step < native["min_new_tokens"] or not native["stop_on_eos"]:
                    scores[list(self.eos_ids)] = -float("inf")  # EOS forbidden, as HF's min_new_tokens does
                token = int(scores.argmax())
                generated.append(token)
                chosen.append(float(logprobs[token]))
                top_ids.append(best.tolist())
                top_values.append(values.tolist())
                ids.append(token)
                if native["stop_on_eos"] and token in self.eos_ids:
                    finish = "stop"
                    break
        return Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=request.prompt_ids,
                      token_ids=generated, finish_reason=finish, chosen_logprobs=chosen, top_ids=top_ids,
                      top_logprobs=top_values, native_params=native, warnings=translation.warnings,
                      timings={"generate_s": time.perf_counter() - started})

    def close(self) -> None:
        self.model = None


DESCRIPTION = EngineDescription(
    name="loop", summary="example plugin: HF forward pass in a plain greedy loop (docs/adding-an-engine.md)",
    engine=Engine, options=Options,
    requirement=Requirement(module="transformers", distribution="transformers"),
    capabilities=Capabilities(dtypes=("float32", "bfloat16", "float16"), text=False),  # ids only: no detokeniser
    sampling=lambda options: SamplingCode("parity_loop_engine.sampling"))
