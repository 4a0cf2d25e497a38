"""vLLM offline engine: vllm.LLM on CPU, in-process engine core, raw top-k logprobs per step."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from adapters.contract import (
    Capabilities,
    EngineDescription,
    EngineOptions,
    InProcessOptions,
    Knob,
    LogprobMeaning,
    Requirement,
    SamplingCode,
    apply_patch,
    greedy_ignored,
    request_knobs,
)
from adapters.engines.parser_runs import ParserOptions
from adapters.engines.vllm_lora import RULES as LORA_RULES
from adapters.engines.vllm_lora import lora_kwargs, lora_request
from adapters.engines.vllm_parallel import rank_binding, split_problem, too_few_cores
from adapters.engines.vllm_sockets import remove_socket_dir, socket_dir
from adapters.engines.vllm_startup import lighten_vllm_startup
from adapters.http.client import structured_outputs
from adapters.tracing.capture import LOGITS_SLICE, Capture, layer_inputs, run_traces
from adapters.tracing.forcing import LayerInputs
from adapters.tracing.ranks import ShardedCapture, ShardedForcing
from harness.core.agent_requests import wire_messages
from harness.core.types import Beam, EngineSetup, Request, Result, TraceRequest, TraceResult, Translation
from harness.core.vocabulary import SamplingParams
from harness.models.catalog import cache_root


class Options(InProcessOptions, ParserOptions):
    enforce_eager: bool = True  # eager start-up is ~4x faster on CPU, and forward hooks only fire in eager mode
    kv_cache_gib: float = Field(1.0, gt=0)
    max_model_len: int | None = Field(None, ge=16)  # None: what the run needs (its longest prompt + new tokens)
    multiprocessing: bool = False  # False: engine core in the worker process itself (faster start)
    prefix_caching: bool | None = None  # None: vLLM's default (on, on this CPU build)
    chunked_prefill: bool | None = None  # None: vLLM's default (on)
    max_num_batched_tokens: int | None = Field(None, ge=8)  # the prefill chunk size when chunked prefill is on
    speculative: dict[str, Any] | None = None  # vLLM's speculative_config, e.g. {method: ngram, ...}
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT=1: vLLM's promise of batch-invariant results
    # the KV cache's dtype (vLLM's kv_cache_dtype; fp8 needs AVX-512 on the CPU attention backend): auto keeps the
    # model's dtype
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    # layers whose KV cache stays in the model's dtype under a quantised kv_cache_dtype (vLLM's
    # kv_cache_dtype_skip_layers)
    kv_cache_skip_layers: list[int] = []
    # chat prompts: harness (the harness's ids, as every engine gets them) or vllm (rendered by vLLM's own chat path,
    # LLM.enqueue_chat with the tools and template switches: its prompt ids are then compared with the harness's)
    render: Literal["harness", "vllm"] = "harness"
    # what vLLM returns as a logprob (and prompt logprob): raw or after its sampler's processing, as logprobs or logits
    logprobs_mode: LogprobsMode = "raw_logprobs"
    # ranks the model is split over (vLLM's mp executor, a worker process per rank, each bound to cores of its own)
    tensor_parallel_size: int = Field(1, ge=1)


LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]
MODE_WORDS = {
    "raw_logprobs": "the log-softmax of the model's logits, before any processing",
    "processed_logprobs": "the log-softmax after vLLM's sampler processed the logits (bad words, logit bias, min "
                          "tokens, penalties, then temperature and top-k/top-p where sampled)",
    "raw_logits": "the model's logits themselves, not normalised",
    "processed_logits": "the logits after vLLM's sampler processed them, not normalised"}


def logprob_meaning(options: Any) -> LogprobMeaning:
    """vLLM's logprobs_mode, in words (the offline engine and a server the harness starts alike)."""
    mode = getattr(options, "logprobs_mode", "raw_logprobs")
    return LogprobMeaning(mode, f"vLLM's logprobs_mode {mode}: {MODE_WORDS[mode]}")


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def fp8_cache_problem(kv_cache_dtype: str) -> str | None:
    """Why this processor cannot hold vLLM's KV cache in fp8, or None: vLLM's CPU attention backend quantises it
    with AVX-512 kernels only."""
    if not kv_cache_dtype.startswith("fp8"):
        return None
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None  # not Linux: vLLM says for itself
    if " avx512f" in flags:
        return None
    return (f"kv_cache_dtype {kv_cache_dtype}: vLLM's CPU attention quantises the KV cache with AVX-512 kernels, "
            "which this processor lacks: use kv_cache_dtype auto, or run it on a processor with AVX-512")


def renders_own_chat(options: dict[str, Any]) -> bool:
    """Whether an engine's options have vLLM render chat prompts through its own chat path (render: vllm)."""
    return options.get("render") == "vllm"


def knobs(name: str, options: EngineOptions) -> Knob:
    """How vLLM turns the invariance knobs: batching and order through the requests of one generate() call,
    the rest through its engine configuration (each distinct configuration is one engine load)."""
    turned = {
        "batch": Knob(),
        "prefix_cache": Knob(baseline={"prefix_caching": False}, variant={"prefix_caching": True}),
        "chunked_prefill": Knob(baseline={"chunked_prefill": False},
                                variant={"chunked_prefill": True, "max_num_batched_tokens": 32}),
        "speculative": Knob(variant={"speculative": NGRAM}),
        "batch_invariant": Knob(baseline={"batch_invariant": True}, variant={"batch_invariant": True}),
        "tensor_parallel": tensor_parallel_knob(getattr(options, "tensor_parallel_size", 1)),
        "compile": Knob(baseline={} if getattr(options, "enforce_eager", True) else {"enforce_eager": True},
                        variant={"enforce_eager": False}),
    }
    return turned.get(name) or request_knobs(name, options, server=False)


def tensor_parallel_knob(configured: int) -> Knob:
    """The model on one rank against the same model split over two, where this machine has a core for each; the
    side the engine is configured as already is its configuration as it stands (no second load of it)."""
    problem = too_few_cores(2)
    if problem:
        return Knob(unsupported=problem)
    return Knob(baseline={} if configured == 1 else {"tensor_parallel_size": 1},
                variant={} if configured == 2 else {"tensor_parallel_size": 2})


def compilation(config: Any) -> str:
    """The graph mode vLLM settled on (its CPU platform turns VLLM_COMPILE into DYNAMO_TRACE_ONCE and a LoRA
    configuration into NONE): the mode, with its backend where it compiles."""
    mode = config.mode.name if hasattr(config.mode, "name") else str(config.mode)
    return mode if mode == "NONE" else f"{mode} ({config.backend or 'inductor'})"


EAGER_CAPTURE = ("captured in eager mode, in a load of its own: forward hooks do not fire inside the compiled graph "
                 "the run used, so the layers read are eager vLLM's; what compiling changes is the run's answers "
                 "(the compile knob)")


def engine_env(workdir: Path, options: Options, sockets: Path) -> dict[str, str]:
    """Environment vLLM reads at import time. Temporary files (and sockets, where the path allows) stay in the run
    dir; compile caches are shared by runs under $LLM_PARITY_CACHE/compile, as vLLM's own ~/.cache/vllm would be (a
    cache in the run dir made every run a cold start)."""
    cache, compiled = workdir / "cache", cache_root() / "compile"
    return {
        **cache_space(options.kv_cache_gib),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if options.multiprocessing else "0",
        # one rank: its threads come from OMP_NUM_THREADS, set by the harness; several: each bound to its own cores
        "VLLM_CPU_OMP_THREADS_BIND": rank_binding(ranks) if (ranks := options.tensor_parallel_size) > 1 else "nobind",
        "VLLM_CACHE_ROOT": str(compiled / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(compiled / "inductor"),
        "XDG_CACHE_HOME": str(compiled / "xdg"),
        "VLLM_RPC_BASE_PATH": str(sockets),
        "TMPDIR": str(cache / "tmp"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_BATCH_INVARIANT": "1" if getattr(options, "batch_invariant", False) else "0",
    }


def cache_space(gib: float) -> dict[str, str]:
    """VLLM_CPU_KVCACHE_SPACE, whole GiB only (vLLM reads it as an integer and it overrides kv_cache_memory_bytes):
    below 1 GiB it is left unset (and removed from the environment where set), so the exact bytes asked for apply
    (the engine's kv_cache_memory_bytes, the server's --kv-cache-memory-bytes)."""
    return {"VLLM_CPU_KVCACHE_SPACE": str(round(gib))} if gib >= 1 else {}


def prepare_env(workdir: Path, options: Options, sockets: Path) -> dict[str, str]:
    env = engine_env(workdir, options, sockets)
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_RPC_BASE_PATH", "TMPDIR"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env


def model_runner(llm: Any) -> str:
    """The model runner vLLM chose at load: V2 for a dense model on CUDA (vLLM 0.25 on), V1 where V2 cannot run
    (no Triton, as on CPU here)."""
    uses_v2 = getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", False)
    return "v2" if uses_v2 else "v1"


def attention_backend(model: Any) -> str:
    """The attention backend of the model's first attention layer, with FlashAttention's version where it is the
    one (FLASH_ATTN runs FlashAttention 3 on Hopper, 2 before it)."""
    layer = next((m for m in model.modules() if getattr(m, "attn_backend", None) is not None), None)
    if layer is None:
        return "unknown"
    version = getattr(getattr(layer, "impl", None), "vllm_flash_attn_version", None)
    name = layer.attn_backend.get_name()
    return f"{name} (FlashAttention {version})" if version else name


def parallel_kwargs(ranks: int) -> dict[str, Any]:
    """vllm.LLM's arguments for `ranks` tensor-parallel ranks: the mp executor, a worker process per rank (vLLM's
    CPU platform picks it too; said here so a reader of the configuration sees it)."""
    return {"tensor_parallel_size": ranks, "distributed_executor_backend": "mp"} if ranks > 1 else {}


def context_length(needed: int | None) -> int | None:
    """A max_model_len that fits what the run sends (rounded up to 256, at least 512), so vLLM does not size its
    memory profiling and scheduler for the model's full context; None (the model's maximum) when unknown."""
    return max(512, -(-needed // 256) * 256) if needed else None


def translate(params: SamplingParams, top_logprobs: int = 5) -> Translation:
    """Canonical params -> vllm.SamplingParams kwargs (unset means neutral, as in the canonical vocabulary); for
    beam search, BeamSearchParams kwargs."""
    if params.num_beams:
        from adapters.engines import vllm_beams

        return Translation(native_params=vllm_beams.search_params(params),
                           warnings=greedy_ignored(params) + vllm_beams.not_applied(params))
    native: dict[str, Any] = {
        "temperature": 0.0 if params.greedy else (params.temperature or 1.0),
        "top_k": params.top_k or 0, "top_p": params.top_p or 1.0, "min_p": params.min_p or 0.0,
        "repetition_penalty": params.repetition_penalty or 1.0,
        "frequency_penalty": params.frequency_penalty or 0.0,
        "presence_penalty": params.presence_penalty or 0.0,
        "max_tokens": params.max_new_tokens, "min_tokens": params.min_new_tokens or 0,
        "ignore_eos": params.ignore_eos, "logprobs": top_logprobs,
    }
    if params.seed is not None:
        native["seed"] = params.seed
    if params.stop:
        native["stop"] = list(params.stop)
    native.update({name: value for name in SAME_NAMED if (value := getattr(params, name)) is not None})
    if params.constraint:
        native["structured_outputs"] = structured_outputs(params.constraint.model_dump(exclude_none=True))
    return Translation(native_params=native, warnings=greedy_ignored(params) + ngram_not_applied(params))


# canonical params vLLM's SamplingParams takes under the same name and meaning
SAME_NAMED = ("stop_token_ids", "include_stop_str_in_output", "logit_bias", "bad_words", "skip_special_tokens",
              "spaces_between_special_tokens")


def sampling_kwargs(native: dict[str, Any]) -> dict[str, Any]:
    """translate()'s params as vllm.SamplingParams kwargs (structured outputs as vLLM's own params object)."""
    if "structured_outputs" not in native:
        return native
    from vllm.sampling_params import StructuredOutputsParams

    return {**native, "structured_outputs": StructuredOutputsParams(**native["structured_outputs"])}


def ngram_not_applied(params: SamplingParams) -> list[str]:
    """vLLM has no n-gram ban (its users write a logits processor of their own)."""
    if not params.no_repeat_ngram_size:
        return []
    return [f"no_repeat_ngram_size={params.no_repeat_ngram_size} NOT APPLIED: vLLM has no n-gram ban (neither "
            "SamplingParams nor its server's request take one)"]


def speculative_not_applied(params: SamplingParams, speculative: dict[str, Any] | None) -> list[str]:
    """With speculative decoding on, vLLM builds no min_p processor (vllm/v1/sample/logits_processor: it only logs
    "min_p and logit_bias parameters won't work with speculative decoding"), so a sampled request's min_p is dropped."""
    if not speculative or params.greedy or not params.min_p:
        return []
    return [f"min_p={params.min_p} NOT APPLIED: vLLM ignores min_p when speculative decoding is on"]


class Engine:
    def __init__(self, setup: EngineSetup):
        self.name, self.options, self.dtype, self.workdir = setup.name, Options(**setup.options), setup.dtype, \
            setup.workdir
        self.capture_note = ""  # how a traced pass differs from the run's configuration
        if setup.trace:  # forward hooks fire only in eager mode, and only on a model in this process
            self.capture_note = "" if self.options.enforce_eager else EAGER_CAPTURE
            self.options = self.options.model_copy(update={"enforce_eager": True, "multiprocessing": False})
        if self.options.patch and self.options.multiprocessing:
            raise RuntimeError("option patch needs the model in the worker process: set multiprocessing: false")
        self.sockets = socket_dir(setup.workdir)
        try:
            self._load(setup)
        except BaseException:  # no close() follows a constructor that raised: its /tmp socket directory would stay
            remove_socket_dir(self.sockets)
            raise

    def _load(self, setup: EngineSetup) -> None:
        trace, workdir = setup.trace, setup.workdir
        problem = fp8_cache_problem(self.options.kv_cache_dtype) or split_problem(setup.model_path,
                                                                                 self.options.tensor_parallel_size)
        if problem:
            raise RuntimeError(problem)
        env = prepare_env(workdir, self.options, self.sockets)
        os.environ.update(env)
        if "VLLM_CPU_KVCACHE_SPACE" not in env:  # a cache under 1 GiB: the exact bytes below apply
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if "vllm.envs" in sys.modules:  # a worker reused after another vLLM engine: vLLM cached its environment
            sys.modules["vllm.envs"].disable_envs_cache()
        from vllm import LLM

        lighten_vllm_startup()
        # vLLM's start-up calls gc.collect() five times, each walking every object its imports made (2.0 s of LLM()'s
        # 10-11 s under a profiler, SmolLM2 on an AVX2 EPYC); collected once here, then frozen, they are not walked
        # again: LLM() medians of 3, 6.9 s to 5.4 s. A reused worker's previous engine is collected before freezing.
        gc.collect()
        gc.freeze()
        self.max_model_len = self.options.max_model_len or context_length(setup.max_context)
        self.prefix_caching = self.options.prefix_caching is not False and not trace
        self.llm = LLM(model=str(setup.model_path), dtype=setup.dtype, enforce_eager=self.options.enforce_eager,
                       max_model_len=self.max_model_len, seed=0,
                       max_logprobs=20,
                       kv_cache_memory_bytes=int(self.options.kv_cache_gib * 2**30),
                       enable_prefix_caching=False if trace else self.options.prefix_caching,  # a cached prefix is
                       # not recomputed, so a traced pass must not read one
                       enable_chunked_prefill=self.options.chunked_prefill,
                       max_num_batched_tokens=self.options.max_num_batched_tokens,
                       speculative_config=self.options.speculative, kv_cache_dtype=self.options.kv_cache_dtype,
                       kv_cache_dtype_skip_layers=[str(layer) for layer in self.options.kv_cache_skip_layers],
                       logprobs_mode=self.options.logprobs_mode,
                       **parallel_kwargs(self.options.tensor_parallel_size),
                       generation_config="vllm",  # no implicit defaults from the model's generation_config.json
                       **lora_kwargs(setup.lora))
        self.lora = lora_request(setup.lora)  # given with every request (None: no adapter)
        self.rank = setup.lora.rank if setup.lora else 0
        self.env = env
        self.capture: Capture | None = None  # hooks attached on the first trace: idle outside a traced pass
        self.forcing: LayerInputs | None = None
        self.sharded: ShardedCapture | None = None  # a tensor-parallel engine's: every rank's hooks
        self.sharded_forcing: ShardedForcing | None = None
        if self.options.patch and self.options.tensor_parallel_size > 1:  # each rank patches its shard
            self.llm.collective_rpc(apply_patch_in_rank, args=(self.options.patch,))
        elif self.options.patch:
            apply_patch(self.options.patch, self.llm.apply_model(lambda m: m)[0])  # the in-process nn.Module

    def reuse(self, setup: EngineSetup) -> bool:
        """Another plan of this configuration on the engine as loaded (its traces after its run): a traced pass needs
        the model in this process and eager mode (hooks do not fire in compiled graphs), and a context as long as
        its sequence; a prefix cached by the run is dropped before each traced pass (trace())."""
        if setup.trace and (self.options.multiprocessing or not self.options.enforce_eager):
            return False
        needed = context_length(setup.max_context)
        if self.max_model_len is not None and needed is not None and needed > self.max_model_len:
            return False
        self.name, self.workdir = setup.name, setup.workdir
        return True

    def _capture(self, model: Any) -> Capture:
        from adapters.tracing.arch_maps import arch_map, sizes

        config = self.llm.llm_engine.model_config.hf_config
        arch = arch_map("vllm", config.model_type)
        return Capture(model, arch, {} if arch.logits_only else sizes(config), config.num_hidden_layers)

    def trace(self, requests: list[TraceRequest]) -> Iterator[TraceResult]:
        """Teacher forcing: one prefill over the whole sequence (max_tokens=1) computes every position's hidden
        states; the logits from the prompt's last position on are then computed from the final norm's rows with the
        model's own compute_logits, LOGITS_SLICE positions at a time. Not through prompt_logprobs: vLLM would hold
        the logits of every position and their log-softmax at once (3.1 GB for 1,500 positions of a 262k
        vocabulary). Several tensor-parallel ranks: each rank captures its shard (adapters.tracing.ranks)."""
        if self.options.tensor_parallel_size > 1:
            yield from self._sharded_traces(requests)
            return
        import torch

        model = self.llm.apply_model(lambda m: m)[0]
        if self.capture is None:
            self.capture = self._capture(model)
            self.forcing = layer_inputs(model, self.capture, self.capture.num_layers)
        capture = self.capture

        def forward(token_ids: list[int], logits_from: int) -> None:
            with capture.mute("logits"):  # the sampler's own logits call: the last position only
                self._prefill(token_ids)
            if not capture.wants("logits"):
                return
            hidden = torch.cat(capture.keep["final_norm"])
            with torch.inference_mode():
                for start in range(logits_from, hidden.shape[0], LOGITS_SLICE):
                    model.compute_logits(hidden[start:start + LOGITS_SLICE])

        yield from run_traces(self.name, capture, requests, self.workdir, self._store_dtype(), forward,
                              self._trace_metadata(), keep=("final_norm",),
                              after=lambda: self._adapter_metadata(model), forcing=self.forcing)

    def _sharded_traces(self, requests: list[TraceRequest]) -> Iterator[TraceResult]:
        """Traced passes of a tensor-parallel engine: every rank hooks its shard of the model in its own worker,
        and the ranks' captures are joined into one trace per pass."""
        from adapters.tracing.arch_maps import arch_map, sizes
        from harness.core.shards import ShardLayout

        if self.sharded is None:
            config = self.llm.llm_engine.model_config.hf_config
            arch = arch_map("vllm", config.model_type)
            if arch.logits_only:
                raise RuntimeError(f"trace: no per-layer map of {config.model_type} for vLLM, and a tensor-parallel "
                                   "engine's logits are captured only through its layers' map")
            layout = ShardLayout.of(self.options.tensor_parallel_size, sizes(config))
            self.sharded = ShardedCapture(self.llm.collective_rpc, arch, layout, config.num_hidden_layers)
            self.sharded_forcing = None if LayerInputs.possible(arch) else ShardedForcing(self.sharded)
        capture, forcing = self.sharded, self.sharded_forcing

        def forward(token_ids: list[int], _logits_from: int) -> None:
            capture.start(forcing.source if forcing is not None else None)
            self._prefill(token_ids)
            capture.logits()

        yield from run_traces(self.name, capture, requests, self.workdir, self._store_dtype(), forward,
                              {**self._trace_metadata(),
                               "tensor_parallel_size": str(self.options.tensor_parallel_size)},
                              after=capture.metadata, forcing=forcing)

    def _trace_metadata(self) -> dict[str, str]:
        cache = self.options.kv_cache_dtype
        held = ("" if cache == "auto" else cache if not self.options.kv_cache_skip_layers else
                f"{cache}, except layers {', '.join(map(str, self.options.kv_cache_skip_layers))}")
        return {"engine": DESCRIPTION.name, "dtype": self.dtype, "capture_note": self.capture_note, "kv_cache": held}

    def _prefill(self, token_ids: list[int]) -> None:
        """One prefill over the sequence (a prefix cached by the run is dropped first: a cached prefix is not
        recomputed, so its positions would pass no hook)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        if self.prefix_caching:
            self.llm.reset_prefix_cache()
        self.llm.generate([TokensPrompt(prompt_token_ids=token_ids)], VllmSamplingParams(max_tokens=1, temperature=0.0),
                          use_tqdm=False, lora_request=self.lora)

    def _store_dtype(self) -> Any:
        import torch

        return torch.float64 if self.dtype == "float64" else torch.float32

    def _adapter_metadata(self, model: Any) -> dict[str, str]:
        """The LoRA update vLLM holds once a request has loaded the adapter (adapters.tracing.lora_weights)."""
        from adapters.tracing.lora_weights import adapter_metadata

        return adapter_metadata(model, self.rank) if self.lora else {}

    def versions(self) -> dict[str, str]:
        import torch
        import vllm

        cache = self.llm.llm_engine.vllm_config.cache_config
        parallel = self.llm.llm_engine.vllm_config.parallel_config
        skipped = f", except layers {', '.join(cache.kv_cache_dtype_skip_layers)}" if (
            cache.kv_cache_dtype_skip_layers and cache.cache_dtype != "auto") else ""
        chosen = {"model_runner": model_runner(self.llm), "kv_cache": f"{cache.cache_dtype}{skipped}",
                  "tensor_parallel_size": str(parallel.tensor_parallel_size),
                  "compilation": compilation(self.llm.llm_engine.vllm_config.compilation_config)}
        if parallel.tensor_parallel_size > 1:
            chosen["threads_bind"] = self.env["VLLM_CPU_OMP_THREADS_BIND"]
        elif not self.options.multiprocessing:  # the model is in this process
            chosen["attention"] = attention_backend(self.llm.apply_model(lambda m: m)[0])
        return {"vllm": vllm.__version__, "torch": torch.__version__, **chosen}

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        translation = translate(params, top_logprobs)
        translation.warnings.extend(speculative_not_applied(params, self.options.speculative))
        return translation

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        from vllm import SamplingParams as VllmSamplingParams

        yield from self._beams([r for r in requests if r.params.num_beams])
        requests = [r for r in requests if not r.params.num_beams]
        if not requests:
            return
        translations = [self.translate(r.params, r.top_logprobs) for r in requests]
        sampling = [VllmSamplingParams(**{**sampling_kwargs(t.native_params), **({"n": r.num_samples, "logprobs": None}
                                                                if r.num_samples > 1 else {})})
                    for r, t in zip(requests, translations, strict=False)]
        last = time.perf_counter()
        for index, output in self._finished(self._enqueue(requests, sampling)):
            request, translation = requests[index], translations[index]
            now = time.perf_counter()
            elapsed, last = now - last, now  # the call's time since the previous case finished: they sum to it
            completion = output.outputs[0]
            if request.num_samples > 1:
                yield Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=request.prompt_ids,
                             token_ids=list(completion.token_ids), samples=[list(o.token_ids) for o in output.outputs],
                             native_params={**translation.native_params, "n": request.num_samples},
                             warnings=translation.warnings, finish_reason="length",
                             timings={"generate_s": elapsed, "samples": len(output.outputs)})
                continue
            top_ids, top_values, chosen = [], [], []
            for token, step in zip(completion.token_ids, completion.logprobs or [], strict=False):
                ranked = sorted((lp.rank, tid, lp.logprob) for tid, lp in step.items() if lp.rank is not None)
                ranked = ranked[: request.top_logprobs]
                top_ids.append([tid for _, tid, _ in ranked])
                top_values.append([value for _, _, value in ranked])
                chosen.append(step[token].logprob)
            yield Result(case_id=request.case_id, engine=self.name, status="ok",
                         prompt_ids=list(output.prompt_token_ids or request.prompt_ids),
                         token_ids=list(completion.token_ids), text=completion.text,
                         finish_reason=completion.finish_reason or "", chosen_logprobs=chosen, top_ids=top_ids,
                         top_logprobs=top_values, native_params=translation.native_params,
                         warnings=translation.warnings,
                         timings={"generate_s": elapsed, "batch_size": len(requests)})

    def _enqueue(self, requests: list[Request], sampling: list[Any]) -> list[str]:
        """Queue the requests (vLLM's internal ids, in the requests' order): as the harness's prompt ids, or chat
        prompts through vLLM's own chat path (render: vllm), those with the same tools and switches together."""
        from vllm.inputs import TokensPrompt

        ids: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            own = self.options.render == "vllm" and request.messages is not None
            key = json.dumps([request.tools, request.chat_template_kwargs], sort_keys=True) if own else ""
            groups.setdefault(key, []).append(i)
        for key, members in groups.items():
            chosen = [sampling[i] for i in members]
            if not key:
                queued = self.llm.enqueue([TokensPrompt(prompt_token_ids=requests[i].prompt_ids) for i in members],
                                          chosen, use_tqdm=False, lora_request=self.lora)
            else:
                first = requests[members[0]]
                queued = self.llm.enqueue_chat([wire_messages(requests[i].messages or []) for i in members], chosen,
                                               use_tqdm=False, lora_request=self.lora, tools=first.tools,
                                               chat_template_kwargs=first.chat_template_kwargs or None)
            for i, request_id in zip(members, queued, strict=True):
                ids[i] = request_id
        return ids

    def _finished(self, ids: list[str]) -> Iterator[tuple[int, Any]]:
        """What LLM.generate does (enqueue every prompt, step the engine until none is unfinished), yielding each
        request's output, with its index, as soon as it finishes rather than all at the end: the harness journals
        each case then. A call that stops early (an error, the harness interrupted) aborts what it left queued.
        ids: the queued requests' internal ids, "<the id an output carries>-<8 random characters>"."""
        index = {request_id.rsplit("-", 1)[0]: i for i, request_id in enumerate(ids)}
        engine = self.llm.llm_engine
        try:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        yield index[output.request_id], output
        finally:
            if engine.has_unfinished_requests():
                engine.abort_request(ids, internal=True)

    def _beams(self, requests: list[Request]) -> Iterator[Result]:
        """LLM.beam_search, the prompts of equal params together: every returned beam, best first, with the logprob
        of each token and its cumulative logprob as vLLM tracked them, and vLLM's own score of it."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import BeamSearchParams

        from adapters.engines.vllm_beams import score

        groups: dict[str, list[Request]] = {}
        for request in requests:
            groups.setdefault(request.params.model_dump_json(), []).append(request)
        eos = self.llm.get_tokenizer().eos_token_id
        for group in groups.values():
            translation = self.translate(group[0].params, group[0].top_logprobs)
            params = BeamSearchParams(**translation.native_params)
            started = time.perf_counter()
            outputs = self.llm.beam_search([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in group], params,
                                           lora_request=self.lora)
            elapsed = time.perf_counter() - started
            for request, output in zip(group, outputs):
                beams = []
                for sequence in output.sequences:
                    ids = sequence.tokens[len(request.prompt_ids):]
                    logprobs = [step[token].logprob for token, step in zip(ids, sequence.logprobs)]
                    beams.append(Beam(token_ids=ids, logprobs=logprobs, cum_logprob=sequence.cum_logprob,
                                      score=score(request.prompt_ids, ids, sequence.cum_logprob, eos,
                                                  params.length_penalty),
                                      finish_reason="stop" if ids and ids[-1] == eos else "length",
                                      text=self.llm.get_tokenizer().decode(
                                          ids, skip_special_tokens=request.params.skip_special_tokens is not False)))
                yield Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=request.prompt_ids,
                             token_ids=beams[0].token_ids, text=beams[0].text, finish_reason=beams[0].finish_reason,
                             beams=beams, native_params=translation.native_params, warnings=translation.warnings,
                             timings={"generate_s": elapsed / len(group), "batch_size": len(group)})

    def close(self) -> None:
        for hooks in (self.capture, self.forcing, self.sharded):
            if hooks is not None:
                hooks.close()
        self.llm = None
        remove_socket_dir(self.sockets)


def apply_patch_in_rank(worker: Any, spec: str) -> None:
    """Run in every rank's worker (LLM.collective_rpc): the user's patch on that rank's shard of the model (it can
    read the rank with vllm.distributed.get_tensor_model_parallel_rank())."""
    apply_patch(spec, worker.model_runner.get_model())


def reuse_settings(options: Options) -> tuple | None:
    """A worker whose in-process vLLM engine was closed loads the next one in 1-3 s instead of 10-15 s (vLLM's
    imports and its sampler's compiled kernel stay): with the settings vLLM reads once per process alike. Not
    reused: an engine core in a process of its own, and speculative decoding (its n-gram proposer imports numba,
    whose objects break the kernel registration vLLM repeats at each load in the same process: AttributeError
    '_lib_fn_wrapper' object has no attribute 'get', vLLM 0.32), and several ranks (their worker processes go with
    the engine)."""
    if options.multiprocessing or options.speculative or options.tensor_parallel_size > 1:
        return None
    gib = options.kv_cache_gib
    return (max(1, round(gib)) if gib >= 1 else gib), options.batch_invariant


DESCRIPTION = EngineDescription(
    name="vllm", summary="vLLM offline LLM on CPU (in-process engine core)", engine=Engine, options=Options,
    requirement=Requirement(module="vllm", distribution="vllm-cpu", extra="vllm"),
    capabilities=Capabilities(traces=True, forced_layers=True, samples=True, beam_search=True), batch_size=None,
    sampling=lambda options: SamplingCode("adapters.sampling.vllm", {"mode": "offline"}), knobs=knobs,
    worker_reuse=reuse_settings, lora=LORA_RULES, logprobs=logprob_meaning)
