"""HF transformers engine: model.generate() on the CPU or a CUDA GPU (option device), raw per-step logits -> top-k
logprobs."""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from adapters.contract import (
    DTYPES,
    Capabilities,
    EngineDescription,
    InProcessOptions,
    Knob,
    LogprobMeaning,
    Requirement,
    SamplingCode,
    apply_patch,
    greedy_ignored,
    request_knobs,
    top_k_of,
)
from adapters.engines.hf_kwargs import as_list, decode_text, generate_kwargs
from adapters.engines.hf_lora import RULES as LORA_RULES
from adapters.engines.hf_lora import with_adapter
from adapters.tracing.arch_maps import ArchMap
from adapters.tracing.capture import LOGITS_SLICE, Capture, layer_inputs, run_traces
from adapters.tracing.forcing import LayerInputs
from harness.core.points import layer_point, parse
from harness.core.types import EngineSetup, Request, Result, TraceRequest, TraceResult, Translation
from harness.core.vocabulary import SamplingParams


class Options(InProcessOptions):
    attn_implementation: Literal["eager", "sdpa"] = "sdpa"
    batched: bool = False  # True: cases with equal params go through generate() together, left-padded
    # n-gram speculative decoding (HF's prompt-lookup decoding): draft this many tokens from the prompt per step;
    # one request at a time
    prompt_lookup: int | None = Field(None, ge=1, le=16)
    # where the model and its inputs live: cuda is seed 001's `.cuda().half()` HF; logits and traces come back to the
    # CPU as on cpu
    device: str = "cpu"
    # torch.compile the model's forward (inductor, dynamic shapes: one graph for every length) for generation; traced
    # passes call the decoder's layers eagerly
    compile: bool = False
    # raw_logprobs: the log-softmax of generate()'s output_logits; processed_logprobs: of its output_scores, after
    # its logits processors (penalties, temperature, truncation), as vLLM's processed_logprobs
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs"

    @field_validator("device")
    @classmethod
    def _a_torch_device(cls, device: str) -> str:
        if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", device):
            raise ValueError(f"{device!r} is not a device HF runs on here: use cpu, cuda or cuda:N")
        return device

    @model_validator(mode="after")
    def _lookup_needs_single_rows(self) -> Options:
        if self.prompt_lookup and self.batched:
            raise ValueError("prompt_lookup drafts for one sequence at a time: drop batched: true")
        return self


def knobs(name: str, options: Options) -> Knob:
    """How HF turns the invariance knobs: batching through batched generate(), speculative decoding through
    prompt-lookup decoding; it has no cross-request cache and prefills a prompt in one pass."""
    turned = {"batch": Knob(variant={"batched": True}), "speculative": Knob(variant={"prompt_lookup": 3}),
              "compile": Knob(baseline={"compile": False} if options.compile else {}, variant={"compile": True})}
    missing = {
        "prefix_cache": "HF transformers keeps no KV cache across generate() calls, so there is no prefix cache",
        "chunked_prefill": "HF generate() prefills each prompt in one forward pass",
        "batch_invariant": "a vLLM mode (VLLM_BATCH_INVARIANT); HF has no such switch",
        "tensor_parallel": "HF's engine here runs the whole model in one process (transformers' tp_plan needs "
                           "torch.distributed over several devices)"}
    if name in turned:
        return turned[name]
    return Knob(unsupported=missing[name]) if name in missing else request_knobs(name, options, server=False)


def translate(params: SamplingParams) -> Translation:
    """Canonical params -> HF generate() kwargs, with a warning for each param HF cannot honour."""
    warnings = greedy_ignored(params)
    native: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "do_sample": not params.greedy}
    if params.greedy:
        native.update(temperature=None, top_k=None, top_p=None)
    else:
        # Unset truncation means none, as in the canonical vocabulary (HF's own default would be top_k=50).
        native.update(temperature=params.temperature or 1.0, top_k=params.top_k or 0, top_p=params.top_p or 1.0)
        if params.min_p is not None:
            native["min_p"] = params.min_p
    if params.repetition_penalty is not None:
        native["repetition_penalty"] = params.repetition_penalty
    for penalty in ("frequency_penalty", "presence_penalty"):
        if getattr(params, penalty):
            warnings.append(f"{penalty}={getattr(params, penalty)} NOT APPLIED: HF generate has no "
                            f"{penalty} (its repetition_penalty is multiplicative and has other semantics)")
    if params.min_new_tokens:
        native["min_new_tokens"] = params.min_new_tokens
    if params.ignore_eos:
        native["min_new_tokens"] = params.max_new_tokens  # HF has no ignore_eos: forbid EOS until the end
    if params.stop:
        native["stop_strings"] = list(params.stop)
        if params.include_stop_str_in_output is False:
            warnings.append("include_stop_str_in_output=False NOT APPLIED: HF generate ends after the token that "
                            "completes a stop string and keeps it: its text ends with the stop string")
    if params.seed is not None:
        native["torch_manual_seed"] = params.seed
    if params.no_repeat_ngram_size is not None:  # unset: the model's generation_config.json may set it
        native["no_repeat_ngram_size"] = params.no_repeat_ngram_size
    if params.logit_bias:
        native["sequence_bias"] = {(token,): bias for token, bias in params.logit_bias.items()}
    for harness_side in ("stop_token_ids", "bad_words"):  # become generate() kwargs with the model's tokenizer
        if getattr(params, harness_side):
            native[harness_side] = list(getattr(params, harness_side))
    native["skip_special_tokens"] = True if params.skip_special_tokens is None else params.skip_special_tokens
    if params.constraint:
        warnings.append(f"constraint={params.constraint.kind} NOT APPLIED: HF generate has no constrained decoding "
                        "(a scenario's constraint: block leaves the reference unconstrained)")
    if params.spaces_between_special_tokens:
        warnings.append("spaces_between_special_tokens=True NOT APPLIED: a fast (tokenizers) HF tokenizer's decode "
                        "never puts spaces between special tokens")
    if params.num_beams:  # HF's own beam search; length_penalty and early_stopping unset: generation config decides
        native.update(num_beams=params.num_beams, num_return_sequences=params.beams_returned)
        native.update({n: getattr(params, n) for n in ("length_penalty", "early_stopping")
                       if getattr(params, n) is not None})
    return Translation(native_params=native, warnings=warnings)


EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")  # config keys of a mixture of experts


def experts_kwargs(model_path: Any, dtype: str) -> dict[str, str]:
    """A mixture of experts in float64 (the noise floor) runs its experts eagerly: transformers' default grouped matmul
    takes float32, bfloat16 and float16 only."""
    if dtype != "float64":
        return {}
    config = json.loads((Path(model_path) / "config.json").read_text())
    return {"experts_implementation": "eager"} if any(config.get(key) for key in EXPERT_COUNTS) else {}


class EosForbidden:
    """HF's min_new_tokens rule as a logits processor: EOS at -inf until `min_new` tokens are generated. HF's own
    (MinNewTokensLengthLogitsProcessor, and the MinLengthLogitsProcessor it derives) builds a vocabulary-wide mask with
    torch.isin at every step: 15% of a 300-token case's CPU on the tiny model. The raw logits HF keeps are the tensor
    passed in, so it is copied before EOS is masked."""

    def __init__(self, eos_ids: list[int], prompt_width: int, min_new: int):
        self.eos_ids, self.prompt_width, self.min_new = eos_ids, prompt_width, min_new

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if input_ids.shape[-1] - self.prompt_width >= self.min_new:
            return scores
        scores = scores.clone()
        scores[:, self.eos_ids] = float("-inf")
        return scores


HF_LOGPROBS = {
    "raw_logprobs": LogprobMeaning("raw_logprobs", "the log-softmax of generate()'s output_logits, before its logits "
                                   "processors (beam search: the search's own scores, after them)"),
    "processed_logprobs": LogprobMeaning("processed_logprobs", "the log-softmax of generate()'s output_scores, after "
                                         "its logits processors (penalties, temperature, truncation)")}
EAGER_CAPTURE = ("captured in eager mode: a traced pass calls the decoder's layers directly, outside the compiled "
                 "forward the run generated with (hooks do not fire inside a compiled graph); what compiling changes "
                 "is the run's answers (the compile knob)")


class Engine:
    def __init__(self, setup: EngineSetup):
        import torch
        from transformers import AutoModelForCausalLM

        self.name, self.options, self.dtype, self.workdir = setup.name, Options(**setup.options), setup.dtype, \
            setup.workdir
        self.torch = torch
        self.model_path = setup.model_path
        weights = setup.weights_dtype or setup.dtype  # the noise floor: the run's weights, then higher precision
        self.model = AutoModelForCausalLM.from_pretrained(
            setup.model_path, dtype=getattr(torch, weights), attn_implementation=self.options.attn_implementation,
            **experts_kwargs(setup.model_path, setup.dtype))
        self.lora = setup.lora
        self.model = with_adapter(self.model, setup.lora, weights).eval().to(self.options.device)
        if setup.weights_dtype:
            self.model.to(getattr(torch, setup.dtype))
        apply_patch(self.options.patch, self.model)  # on the device: a fused projection is made of its weights
        if self.options.compile:  # after the patch, so a patched model is what compiles
            self.model.forward = torch.compile(self.model.forward, dynamic=True)
        self.capture: Capture | None = None  # hooks attached on the first trace: idle outside a traced pass
        self.forcing: LayerInputs | None = None
        self.eos_ids = set(as_list(self.model.generation_config.eos_token_id))

    @functools.cached_property
    def tokenizer(self) -> Any:
        """Loaded when first generating, not for a traced pass (Gemma 3's takes 4.5 s: the noise floor's engine only
        traces)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        tokenizer.padding_side = "left"
        return tokenizer

    @functools.cached_property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)

    def versions(self) -> dict[str, str]:
        import transformers

        versions = {"transformers": transformers.__version__, "torch": self.torch.__version__,
                    "compilation": "torch.compile (inductor, dynamic shapes)" if self.options.compile else "NONE"}
        if self.options.device != "cpu":
            versions.update(device=self.torch.cuda.get_device_name(self.options.device), cuda=self.torch.version.cuda)
        return versions

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        translation = translate(params)
        if self.options.prompt_lookup:
            translation.native_params["prompt_lookup_num_tokens"] = self.options.prompt_lookup
        return translation

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        for request in requests:
            if request.num_samples > 1:
                yield self._samples(request)
            elif request.params.num_beams:
                yield self._beams(request)
        requests = [r for r in requests if r.num_samples == 1 and not r.params.num_beams]
        if not self.options.batched:
            for request in requests:
                yield from self._generate_batch([request])
            return
        groups: dict[str, list[Request]] = {}
        for request in requests:
            groups.setdefault(request.params.model_dump_json(), []).append(request)
        for group in groups.values():
            yield from self._generate_batch(group)

    def _generate_batch(self, batch: list[Request]) -> Iterator[Result]:
        torch = self.torch
        translation = self.translate(batch[0].params, batch[0].top_logprobs)
        kwargs = generate_kwargs(translation.native_params, self.eos_ids, self.tokenizer)
        if "torch_manual_seed" in translation.native_params:
            torch.manual_seed(translation.native_params["torch_manual_seed"])
        width = max(len(r.prompt_ids) for r in batch)
        if kwargs.get("min_new_tokens") and self.eos_ids:  # the same rule as HF's, applied without its cost
            kwargs["logits_processor"] = [EosForbidden(sorted(self.eos_ids), width, kwargs.pop("min_new_tokens"))]
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            input_ids[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            attention[row, width - len(request.prompt_ids):] = 1
        started = time.perf_counter()
        processed = self.options.logprobs_mode == "processed_logprobs"
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids.to(self.model.device),
                                      attention_mask=attention.to(self.model.device), pad_token_id=self.pad_id,
                                      return_dict_in_generate=True, output_logits=True, output_scores=processed,
                                      **kwargs)
        elapsed = time.perf_counter() - started
        generated = out.sequences[:, width:]
        steps = out.scores if processed else out.logits  # processed: after generate()'s logits processors
        logprobs = torch.stack(steps, dim=1).float().log_softmax(dim=-1)  # [batch, steps, vocab]
        k = batch[0].top_logprobs
        for row, request in enumerate(batch):
            ids = generated[row].tolist()
            n, finish = self._trim(ids, request.params)
            row_lp = logprobs[row, :n]
            top_values, top_ids = top_k_of(row_lp, k)
            chosen = row_lp.gather(-1, generated[row, :n, None]).squeeze(-1).tolist()
            yield Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=request.prompt_ids,
                         token_ids=ids[:n], text=decode_text(self.tokenizer, ids[:n], translation.native_params),
                         finish_reason=finish, chosen_logprobs=chosen, top_ids=top_ids, top_logprobs=top_values,
                         native_params=translation.native_params, warnings=translation.warnings,
                         timings={"generate_s": elapsed / len(batch), "batch_size": len(batch)})

    def _samples(self, request: Request, chunk: int = 500) -> Result:
        """num_samples independent draws, as generate() makes them for a batch of identical rows: the prompt's
        KV cache is computed once and repeated for each chunk of rows (the rows would compute the same values)."""
        import copy

        torch = self.torch
        translation = self.translate(request.params, request.top_logprobs)
        kwargs = generate_kwargs(translation.native_params, self.eos_ids, self.tokenizer)
        for unused in ("stop_strings", "tokenizer"):  # samples are drawn to max_new_tokens
            kwargs.pop(unused, None)
        prompt = torch.tensor([request.prompt_ids], device=self.model.device)
        started = time.perf_counter()
        if self.options.prompt_lookup:  # drafting works on one sequence at a time
            chunk = 1
        with torch.inference_mode():
            prefix = self.model(input_ids=prompt[:, :-1], use_cache=True).past_key_values
            torch.manual_seed(translation.native_params.get("torch_manual_seed", 0))
            samples: list[list[int]] = []
            while len(samples) < request.num_samples:
                rows = min(chunk, request.num_samples - len(samples))
                cache = copy.deepcopy(prefix)
                if rows > 1:
                    cache.batch_repeat_interleave(rows)
                mask = torch.ones(rows, prompt.shape[1], dtype=torch.long, device=prompt.device)
                out = self.model.generate(input_ids=prompt.expand(rows, -1), past_key_values=cache, attention_mask=mask,
                                          pad_token_id=self.pad_id, **kwargs)
                samples += out[:, prompt.shape[1]:].tolist()
        return Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=request.prompt_ids,
                      token_ids=samples[0], samples=samples, native_params=translation.native_params,
                      warnings=translation.warnings, finish_reason="length",
                      timings={"generate_s": time.perf_counter() - started, "samples": len(samples)})

    def _beams(self, request: Request) -> Result:
        """Beam search, one prompt at a time: every returned beam, best first (token_ids: the best one's)."""
        from adapters.engines.hf_beams import generate_beams

        translation = translate(request.params)
        started = time.perf_counter()
        beams = generate_beams(self.model, request.prompt_ids, translation.native_params, self.pad_id, self.eos_ids,
                               self.tokenizer)
        best = beams[0]
        return Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=request.prompt_ids,
                      token_ids=best.token_ids, text=best.text, finish_reason=best.finish_reason, beams=beams,
                      native_params=translation.native_params, warnings=translation.warnings,
                      timings={"generate_s": time.perf_counter() - started})

    def _trim(self, ids: list[int], params: SamplingParams) -> tuple[int, str]:
        """Generated length up to and including the first EOS or stop token id (batched rows are padded after it)."""
        ends = self.eos_ids | set(params.stop_token_ids or [])
        if not params.ignore_eos:
            for i, token in enumerate(ids):
                if token in ends and i + 1 >= (params.min_new_tokens or 0):
                    return i + 1, "stop"
        if params.stop and len(ids) < params.max_new_tokens:
            return len(ids), "stop"
        return len(ids), "length"

    def _capture(self) -> Capture:
        from adapters.tracing.arch_maps import arch_map, sizes

        config = self.model.config
        arch = arch_map("hf", config.model_type)
        widths = {} if arch.logits_only else sizes(config)
        derive = HfRope(self.model, arch, widths["head_dim"], config.num_hidden_layers).derive if arch.rope else None
        return Capture(self.model, arch, widths, config.num_hidden_layers, derive)

    def reuse(self, setup: EngineSetup) -> bool:
        """Another plan of this configuration (its traces after its run) on the model as loaded: a traced pass
        needs nothing of the load but the hooks, attached on the first trace."""
        self.name, self.workdir = setup.name, setup.workdir
        return True

    def trace(self, requests: list[TraceRequest]) -> Iterator[TraceResult]:
        torch = self.torch
        if self.capture is None:
            self.capture = self._capture()
            self.forcing = layer_inputs(self.model, self.capture, self.model.config.num_hidden_layers)
        capture = self.capture

        cap_name = capture.arch.logits_softcap
        cap = getattr(self.model.config, cap_name, None) if cap_name else None

        def forward(token_ids: list[int], logits_from: int) -> None:
            """The decoder once, then lm_head (and the family's final soft cap) over the positions from logits_from
            on, a slice at a time (each slice streamed by the capture), so those logits are never all in memory."""
            with torch.inference_mode():
                if capture.arch.logits_only:
                    self._logits(capture, token_ids, logits_from)
                    return
                hidden = self.model.base_model(input_ids=torch.tensor([token_ids], device=self.model.device),
                                               use_cache=False)[0]
                if not capture.wants("logits"):
                    return
                for start in range(logits_from, hidden.shape[1], LOGITS_SLICE):
                    logits = self.model.lm_head(hidden[0, start:start + LOGITS_SLICE])
                    capture.deliver("logits", torch.tanh(logits / cap) * cap if cap else logits)

        store = torch.float64 if self.dtype == "float64" else torch.float32
        for request in requests:
            with threads_for(torch, request.threads):
                for result in run_traces(self.name, capture, [request], self.workdir, store, forward,
                                         {"engine": DESCRIPTION.name, "dtype": self.dtype,
                                          "capture_note": EAGER_CAPTURE if self.options.compile else ""},
                                         after=self._adapter_metadata, forcing=self.forcing):
                    result.threads = torch.get_num_threads()
                    yield result

    def _adapter_metadata(self) -> dict[str, str]:
        """The LoRA update the model holds (adapters.tracing.lora_weights), where it applies one."""
        from adapters.tracing.lora_weights import adapter_metadata

        return adapter_metadata(self.model, self.lora.rank) if self.lora else {}

    def _logits(self, capture: Capture, token_ids: list[int], logits_from: int) -> None:
        """A model type without a map: the logits from the model's own output (a family's final soft-capping
        included), only the rows the trace keeps where the model can be asked for them."""
        import inspect

        keep = len(token_ids) - logits_from
        extra = {"logits_to_keep": keep} if "logits_to_keep" in inspect.signature(self.model.forward).parameters \
            else {}
        logits = self.model(input_ids=self.torch.tensor([token_ids], device=self.model.device), use_cache=False,
                            **extra).logits[0]
        if capture.wants("logits"):
            capture.deliver("logits", logits[-keep:])

    def close(self) -> None:
        for hooks in (self.capture, self.forcing):
            if hooks is not None:
                hooks.close()
        self.model = None


@contextmanager
def threads_for(torch: Any, threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` for a pass (None: left as the worker's), then set back."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class HfRope:
    """q and k after rope, computed the way HF's attention computes them inside forward (the modeling module's own
    apply_rotary_pos_emb on the captured points rope is applied to, with the (cos, sin) each layer's attention
    received), since HF has no module whose output they are."""

    def __init__(self, model: Any, arch: ArchMap, head_dim: int, num_layers: int):
        import sys

        if arch.rope is None:
            raise ValueError(f"architecture map {arch.name} derives no rope")
        self.apply = sys.modules[type(model).__module__].apply_rotary_pos_emb
        self.rope, self.head_dim = arch.rope, head_dim
        self.cos_sin: dict[int, tuple | None] = {}  # None: the layer's attention got no position_embeddings
        self.q = None
        modules = dict(model.named_modules())
        for layer in range(num_layers):
            modules[f"{arch.layers}.{layer}.{self.rope.attention}"].register_forward_pre_hook(
                lambda _m, _args, kwargs, layer=layer: self._keep(layer, kwargs), with_kwargs=True)

    def _keep(self, layer: int, kwargs: dict[str, Any]) -> None:
        self.cos_sin[layer] = kwargs.get("position_embeddings")

    def _heads(self, rows):  # [seq, heads*dim] -> [1, heads, seq, dim], HF's attention layout
        return rows.reshape(1, rows.shape[0], -1, self.head_dim).transpose(1, 2)

    def derive(self, name: str, rows) -> list[tuple[str, Any]]:
        layer, point = parse(name)
        if point == self.rope.q:
            self.q = rows
        if point != self.rope.k:
            return []
        cos_sin = self.cos_sin.get(layer)
        if cos_sin is None:
            raise RuntimeError(f"trace: layer {layer}'s attention got no position_embeddings to derive rope from")
        q, k = self.apply(self._heads(self.q), self._heads(rows), *cos_sin)
        flat = [t.transpose(1, 2)[0].reshape(rows.shape[0], -1) for t in (q, k)]
        return [(layer_point(layer, "q_rope"), flat[0]), (layer_point(layer, "k_rope"), flat[1])]


DESCRIPTION = EngineDescription(
    name="hf", summary="HF transformers generate() on the CPU or a CUDA GPU (option device)", engine=Engine,
    options=Options, on_cuda=lambda options: None if options.device == "cpu" else
    f"its options say device: {options.device}; device: cpu runs it on the CPU",
    requirement=Requirement(module="transformers", distribution="transformers"),
    capabilities=Capabilities(traces=True, forced_layers=True, samples=True, dtypes=(*DTYPES, "float64"),
                              beam_search=True),
    batch_size=16,  # generate() keeps every step's logits of the batch: 16 rows of SmolLM2 x 32 steps are 100 MB
    sampling=lambda options: SamplingCode("adapters.sampling.hf"), knobs=knobs,
    worker_reuse=lambda options: (), lora=LORA_RULES,
    logprobs=lambda options: HF_LOGPROBS[options.logprobs_mode])
