"""`lmdeploy` engine: lmdeploy's pipeline with its PyTorch backend, in-process in the worker. lmdeploy runs on CUDA
only (no CPU device type), so this engine is available where `torch.cuda.is_available()` holds in the interpreter
that runs it (normally its own venv: `parity env create lmdeploy`). Prompts go in as the harness's token ids; the
engine returns raw logprobs (logprobs_mode raw_logprobs) of the top-k tokens per step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from adapters.contract import (
    Capabilities,
    EngineDescription,
    EngineOptions,
    Knob,
    LogprobMeaning,
    Requirement,
    SamplingCode,
    request_knobs,
)
from adapters.engines.lmdeploy_params import Defaults, translate
from harness.core.types import EngineSetup, Request, Result, Translation
from harness.core.vocabulary import SamplingParams

LMDEPLOY_DTYPES = ("bfloat16", "float16")  # its engine config accepts auto/float16/bfloat16 only


class Options(EngineOptions):
    defaults: Defaults = "canonical"  # engine: params the scenario leaves unset are not passed (lmdeploy decides)
    session_len: int = Field(4096, ge=64)
    cache_max_entry_count: float = Field(0.2, gt=0, lt=1)  # share of free GPU memory for the KV cache
    eager_mode: bool = True  # no CUDA graphs: faster start, and what the sampler sees is what the model computed


def to_result(name: str, request: Request, translation: Translation, response: Any, elapsed: float) -> Result:
    """An lmdeploy Response -> Result (top-k sorted by logprob; the chosen token's logprob from the same step)."""
    steps = response.logprobs or []
    top_ids, top_values, chosen = [], [], []
    for token, step in zip(response.token_ids, steps, strict=False):
        ranked = sorted(step.items(), key=lambda kv: -kv[1])[: request.top_logprobs]
        top_ids.append([int(t) for t, _ in ranked])
        top_values.append([float(v) for _, v in ranked])
        chosen.append(float(step.get(token, float("nan"))))
    warnings = list(translation.warnings)
    if len(steps) != len(response.token_ids):
        warnings.append(f"lmdeploy returned logprobs for {len(steps)} of {len(response.token_ids)} steps")
    return Result(case_id=request.case_id, engine=name, status="ok", prompt_ids=request.prompt_ids,
                  token_ids=list(response.token_ids), text=response.text, finish_reason=response.finish_reason or "",
                  chosen_logprobs=chosen, top_ids=top_ids, top_logprobs=top_values,
                  native_params=translation.native_params, warnings=warnings,
                  timings={"generate_s": elapsed, "batch_size": 1})


class Engine:
    def __init__(self, setup: EngineSetup):
        from lmdeploy import PytorchEngineConfig, pipeline

        self.name, self.options = setup.name, Options(**setup.options)
        config = PytorchEngineConfig(dtype=setup.dtype, session_len=self.options.session_len,
                                     cache_max_entry_count=self.options.cache_max_entry_count,
                                     eager_mode=self.options.eager_mode, logprobs_mode="raw_logprobs")
        self.pipe = pipeline(str(setup.model_path), backend_config=config, log_level="WARNING")

    def versions(self) -> dict[str, str]:
        import lmdeploy
        import torch

        return {"lmdeploy": lmdeploy.__version__, "torch": torch.__version__,
                "cuda": torch.version.cuda or "", "gpu": torch.cuda.get_device_name(0)}

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        return translate(params, top_logprobs, self.options.defaults)

    async def _one(self, request: Request, translation: Translation) -> Any:
        from lmdeploy import GenerationConfig

        engine = self.pipe.async_engine
        prepared = await engine.preprocess(messages=None, session_id=self.pipe.session_mgr.get(),
                                           gen_config=GenerationConfig(**translation.native_params),
                                           input_ids=request.prompt_ids, do_preprocess=False)
        response = None
        async for out in engine.generate(prepared, stream_response=False):
            part = out.to_response(0)
            response = response.extend(part) if response else part
        return response

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        for request in requests:
            translation = self.translate(request.params, request.top_logprobs)
            started = time.perf_counter()
            future = asyncio.run_coroutine_threadsafe(self._one(request, translation), self.pipe.internal_thread.loop)
            response = future.result()
            if response is None or response.finish_reason == "error":
                error = getattr(response, "error_message", "no response")
                yield Result.engine_error(request.case_id, self.name, f"engine error: lmdeploy: {error}")
                continue
            yield to_result(self.name, request, translation, response, time.perf_counter() - started)

    def reuse(self, setup: EngineSetup) -> bool:
        self.name = setup.name
        return True

    def close(self) -> None:
        if getattr(self, "pipe", None) is not None:
            self.pipe.close()
            self.pipe = None


DESCRIPTION = EngineDescription(
    name="lmdeploy", summary="lmdeploy pipeline, PyTorch backend (CUDA only)", engine=Engine, options=Options,
    requirement=Requirement(module="lmdeploy", distribution="lmdeploy", env="lmdeploy", cuda=True),
    capabilities=Capabilities(dtypes=LMDEPLOY_DTYPES),
    sampling=lambda options: SamplingCode("adapters.sampling.lmdeploy", {"mode": "pipeline",
                                                                         "defaults": options.defaults}),
    knobs=lambda name, options: knobs(name, options),
    logprobs=lambda options: LogprobMeaning("raw_logprobs", "lmdeploy's logprobs_mode raw_logprobs, pinned here"))


def knobs(name: str, options: Options) -> Knob:
    """The adapter sends the pipeline one request at a time and sets none of its cache or scheduler switches: the
    knobs that need only requests."""
    if name == "batch":
        return Knob(unsupported="the lmdeploy adapter sends the pipeline one request at a time")
    if name in ("prefix_cache", "chunked_prefill", "speculative", "batch_invariant"):
        return Knob(unsupported="the lmdeploy adapter does not set this engine switch (not checkable without CUDA)")
    return request_knobs(name, options, server=False)
