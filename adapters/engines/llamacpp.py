"""`llama.cpp` engine: llama-cpp-python in the worker process, reading a GGUF variant of the scenario's model.

Generation is llama-cpp-python's own Llama.generate (its sampler chain: penalties over the last `last_n_tokens`
generated tokens, then greedy, or top-k, typical, top-p, min-p, temperature and a seeded draw), stopped as its
create_completion stops: at an end-of-generation token (returned, as llama.cpp sampled it), a stop string or
max_new_tokens. The raw logits of every step come from the library's own score buffer (logits_all), so the top-k
logprobs are those of the model before any sampler. Teacher forcing evaluates a given token sequence in one batch
with logits for every position; per-layer traces come from llama.cpp's graph evaluation callback (cb_eval)
(adapters.tracing.ggml_graph).
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from adapters.contract import (
    Capabilities,
    EngineDescription,
    EngineOptions,
    LogprobMeaning,
    OwnBosRule,
    Requirement,
    SamplingCode,
    greedy_ignored,
)
from adapters.engines import gguf_cache, llamacpp_gguf
from adapters.engines.gguf_tensors import describe
from adapters.engines.llamacpp_lora import RULES as LORA_RULES
from adapters.engines.llamacpp_lora import adapter_gguf
from harness.core.numeric import log_softmax, top_k_ids
from harness.core.types import EngineSetup, Request, Result, TraceRequest, TraceResult, Translation
from harness.core.vocabulary import SamplingParams
from harness.models.catalog import gguf_metadata

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}  # ggml_type of the KV cache
CacheType = Literal["f32", "f16", "q8_0", "q4_0"]


class CacheOptions(EngineOptions):
    """The KV cache of both llama.cpp engines: kv_cache for K and V, kv_cache_k / kv_cache_v for one of them. f32
    keeps attention in f32 (llama.cpp's default: f16); q8_0 and q4_0 quantise it, and llama.cpp quantises the V cache
    only with flash attention (it fails to create the context otherwise), so a quantised V needs flash_attn."""

    kv_cache: CacheType = "f32"
    kv_cache_k: CacheType | None = None
    kv_cache_v: CacheType | None = None
    flash_attn: bool = False  # llama-cpp-python's default (off)

    @model_validator(mode="after")
    def _quantised_v_needs_flash_attention(self) -> CacheOptions:
        v = self.cache_types()[1]
        if v.startswith("q") and not self.flash_attn:
            raise ValueError(f"a {v} V cache: llama.cpp quantises the V cache only with flash attention: set "
                             "flash_attn: true (or quantise K alone: kv_cache_k)")
        return self

    def cache_types(self) -> tuple[str, str]:
        """(K, V) cache types."""
        return self.kv_cache_k or self.kv_cache, self.kv_cache_v or self.kv_cache

    def cache_words(self) -> str:
        k, v = self.cache_types()
        return k if k == v else f"K {k}, V {v}"


class Options(CacheOptions):
    # which GGUF of the scenario's model: f32, f16 (written from the HF folder's weights), q8_0, q4_k_m (llama.cpp's
    # quantiser on the f32 file), bundled (the GGUF the named model was converted from), or a path to a .gguf file
    gguf: str = "f32"
    last_n_tokens: int = Field(64, ge=0)  # the penalties' window of generated tokens (llama-cpp-python's default)
    # llama.cpp's extra weight buffers (AMX and repacked layouts of quantised weights, its default: on); auto: off on
    # a CPU whose build uses AMX, where llama-cpp-python 0.3.36 crashes (SIGSEGV) evaluating a quantised model with
    # them (measured 2026-11-25 on SmolLM2 q8_0 and q4_k_m and Gemma 3 q4_k_m; f32 and f16 are not repacked)
    extra_buffers: Literal["auto", "on", "off"] = "auto"
    # the context llama.cpp is asked to allocate (the run's and the traced context); unset: the run's longest
    # sequence rounded up to 256, at least 512. llama.cpp itself pads it up to a multiple of 256 (versions record
    # what it allocated), and chooses LongRoPE's long or short factors by it, not by a sequence's length
    n_ctx: int | None = Field(None, ge=1)

    @field_validator("gguf")
    @classmethod
    def _known_variant(cls, value: str) -> str:
        if value not in gguf_cache.VARIANTS and not value.endswith(".gguf"):
            raise ValueError(f"gguf: {value!r} is neither a variant ({', '.join(gguf_cache.VARIANTS)}) nor a path "
                             "to a .gguf file")
        return value


def gguf_file(setup: EngineSetup, gguf: str) -> str:
    """The GGUF file the engine reads (gguf: the option, here and in llama.cpp-server), built once from the model
    folder if it is a variant not yet prepared."""
    if gguf.endswith(".gguf"):
        if not os.path.exists(gguf):
            raise RuntimeError(f"gguf: {gguf} does not exist")
        return gguf
    return str(llamacpp_gguf.ensure(setup.model_path, gguf))


def user_gguf_bos(gguf: str) -> OwnBosRule | None:
    """The BOS rule in a user's GGUF file (the gguf option, a path): its tokenizer.ggml.add_bos_token and
    bos_token_id. The variants are written from the scenario's folder, whose rule the harness holds the prompts to
    already. A file that cannot be read says nothing here: loading it fails with the reason."""
    if not gguf.endswith(".gguf"):
        return None
    keys = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id")
    try:
        found = gguf_metadata(Path(gguf), keys)
    except (OSError, ValueError, struct.error):
        return None
    add, bos = found.get(keys[0]), found.get(keys[1])
    said = "unset" if add is None else str(bool(add)).lower()
    return OwnBosRule(add_bos=None if add is None else bool(add), bos_id=bos if isinstance(bos, int) else None,
                      source=f"{keys[0]} {said} in {os.path.basename(gguf)}")


def context_size(setup: EngineSetup, n_ctx: int | None) -> int:
    """The n_ctx llama.cpp is given (here and in llama.cpp-server): the option n_ctx, refused in one line when the
    run's longest sequence (prompt + max_new_tokens, setup.max_context) would not fit; unset, that length rounded up
    to a multiple of 256, at least 512."""
    needed = setup.max_context or 0
    if n_ctx is None:
        return max(512, -(-(needed or 512) // 256) * 256)
    if n_ctx < needed:
        raise RuntimeError(f"n_ctx: {n_ctx} is below the {needed} tokens this run's longest sequence needs (prompt + "
                           f"max_new_tokens): set n_ctx to at least {needed}, or leave it unset")
    return n_ctx


def asked_context(n_ctx: int, option: int | None) -> str:
    """The n_ctx llama.cpp was given, and whether the scenario's n_ctx option set it (the versions' n_ctx entry)."""
    return f"{n_ctx} asked" + (" (n_ctx option)" if option is not None else "")


YARN_BETAS = ("yarn_beta_fast", "yarn_beta_slow")


def yarn_betas(gguf: str) -> dict[str, float]:
    """The YaRN correction betas a GGUF file sets (<arch>.rope.scaling.yarn_beta_fast / _slow, written from a
    config's beta_fast / beta_slow), as llama_cpp.Llama arguments: llama-cpp-python 0.3.36 gives every context its
    own (32 and 1) and this llama.cpp build does not read the file's (measured on a tiny YaRN Llama: beta_slow 4 in
    the file changed no logit; passed to Llama, HF's logits within 3e-4). A file that cannot be read gives none."""
    try:
        arch = gguf_metadata(Path(gguf), ("general.architecture",)).get("general.architecture")
        keys = {f"{arch}.rope.scaling.{name}": name for name in YARN_BETAS}
        found = gguf_metadata(Path(gguf), tuple(keys))
    except (OSError, ValueError, struct.error):
        return {}
    return {keys[key]: float(value) for key, value in found.items() if isinstance(value, (int, float))}


def translate(params: SamplingParams, last_n_tokens: int = 64) -> Translation:
    """Canonical params -> Llama.generate kwargs, with a warning wherever llama.cpp's sampler means something else."""
    warnings = greedy_ignored(params)
    native: dict[str, Any] = {
        "temp": 0.0 if params.greedy else (params.temperature or 1.0),
        "top_k": params.top_k or 0, "top_p": params.top_p or 1.0, "min_p": params.min_p or 0.0, "typical_p": 1.0,
        "repeat_penalty": params.repetition_penalty or 1.0, "frequency_penalty": params.frequency_penalty or 0.0,
        "presence_penalty": params.presence_penalty or 0.0, "max_tokens": params.max_new_tokens,
        "penalty_last_n": last_n_tokens}
    window = f"the last {last_n_tokens} generated tokens, never the prompt"
    if params.repetition_penalty not in (None, 1.0):
        warnings.append(f"repetition_penalty={params.repetition_penalty}: llama.cpp divides/multiplies the logits "
                        f"as HF does but counts {window} (HF: every prompt and output token)")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(params, name):
            warnings.append(f"{name}={getattr(params, name)}: llama.cpp counts {window} (OpenAI/vLLM: every "
                            "generated token)")
    truncated = [n for n in ("top_k", "top_p", "min_p") if getattr(params, n) is not None]
    if not params.greedy and truncated and (params.temperature or 1.0) != 1.0:
        warnings.append(f"{', '.join(truncated)} with temperature {params.temperature}: llama.cpp truncates before "
                        "dividing by the temperature (top-k, top-p and min-p see the untempered distribution), HF "
                        "after")
    if params.min_new_tokens:
        warnings.append(f"min_new_tokens={params.min_new_tokens} NOT APPLIED: llama-cpp-python's generate has none")
    if params.stop:
        native["stop"] = list(params.stop)
    if params.seed is not None:
        native["seed"] = params.seed
    if params.ignore_eos:
        native["ignore_eos"] = True  # generation goes on past an end-of-generation token
    native.update({name: value for name in CLIENT_SIDE if (value := getattr(params, name)) is not None})
    warnings += [f"{name}={value} NOT APPLIED: {NOT_APPLIED[name]}" for name in NOT_APPLIED
                 if (value := getattr(params, name)) not in (None, 0, False)]
    if params.constraint and params.constraint.kind == "regex":
        warnings.append("constraint=regex NOT APPLIED: llama-cpp-python turns JSON schemas into GBNF grammars, not "
                        "regular expressions")
    elif params.constraint:
        native["grammar"] = params.constraint.model_dump(exclude_none=True)
    if params.include_stop_str_in_output is False and params.stop:
        warnings.append("include_stop_str_in_output=False NOT APPLIED: the adapter ends on the token that completes "
                        "a stop string and keeps it, as llama-cpp-python's generate() loop leaves it")
    return Translation(native_params=native, warnings=warnings)


# params applied around llama-cpp-python's generate() loop, as its create_completion() does (logit_bias through a
# logits processor) or as a client's loop does (stop token ids, the detokeniser's special tokens)
CLIENT_SIDE = ("stop_token_ids", "logit_bias", "skip_special_tokens")
NOT_APPLIED = {
    "no_repeat_ngram_size": "llama.cpp has no n-gram ban (its DRY sampler penalises repeats instead)",
    "bad_words": "llama-cpp-python has no bad-words ban (a GBNF grammar or logit_bias on single tokens can do it)",
    "spaces_between_special_tokens": "llama.cpp's detokeniser puts no spaces between special tokens",
}


def grammar(constraint: dict[str, Any]) -> Any:
    """A constraint as a llama.cpp grammar: a JSON schema through llama-cpp-python's own converter, choices as a
    GBNF alternation of literals."""
    from llama_cpp.llama_grammar import LlamaGrammar

    if "json_schema" in constraint:
        return LlamaGrammar.from_json_schema(json.dumps(constraint["json_schema"]), verbose=False)
    literals = " | ".join(json.dumps(choice, ensure_ascii=False) for choice in constraint["choice"])
    return LlamaGrammar.from_string(f"root ::= {literals}", verbose=False)


def bias_processor(bias: dict[int, float]) -> Any:
    """llama-cpp-python's logit_bias rule (create_completion): each biased token's score plus its bias."""
    def add_bias(input_ids: Any, scores: Any) -> Any:
        for token, value in bias.items():
            scores[token] += value
        return scores
    return add_bias


GENERATE_KWARGS = ("temp", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "frequency_penalty",
                   "presence_penalty")


def extra_buffers(llama_cpp: Any, option: str) -> bool:
    """Whether the model loads with llama.cpp's extra weight buffers (see Options.extra_buffers)."""
    if option != "auto":
        return option == "on"
    return "AMX_INT8 = 1" not in llama_cpp.llama_print_system_info().decode()


@contextmanager
def model_params(llama_cpp: Any, **fields: Any) -> Iterator[None]:
    """llama_cpp.Llama builds its model params from llama_model_default_params(), with no argument for some fields:
    set these on top while a model loads."""
    module = llama_cpp.llama_cpp
    default = module.llama_model_default_params

    def with_fields() -> Any:
        params = default()
        for name, value in fields.items():
            setattr(params, name, value)
        return params

    module.llama_model_default_params = with_fields
    try:
        yield
    finally:
        module.llama_model_default_params = default


class Engine:
    def __init__(self, setup: EngineSetup):
        import llama_cpp

        self.name, self.options = setup.name, Options(**setup.options)
        self.llama_cpp = llama_cpp
        self.threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        self.path = gguf_file(setup, self.options.gguf)
        self.n_ctx = context_size(setup, self.options.n_ctx)
        self.extra_buffers = extra_buffers(llama_cpp, self.options.extra_buffers)
        with model_params(llama_cpp, use_extra_bufts=self.extra_buffers):
            self.llm = llama_cpp.Llama(
                model_path=self.path, n_ctx=self.n_ctx, n_batch=self.n_ctx, n_ubatch=self.n_ctx,
                n_threads=self.threads, n_threads_batch=self.threads, logits_all=True,
                flash_attn=self.options.flash_attn,
                type_k=GGML_TYPES[self.options.cache_types()[0]], type_v=GGML_TYPES[self.options.cache_types()[1]],
                last_n_tokens_size=self.options.last_n_tokens, verbose=False, **yarn_betas(self.path),
                lora_path=str(adapter_gguf(setup.model_path, Path(setup.lora.path))) if setup.lora else None)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.workdir = setup.workdir
        self.tracer: Any = None  # made on the first trace

    def reuse(self, setup: EngineSetup) -> bool:
        """Another plan of this configuration on the model as loaded (its traces after its run), if its sequences
        fit the context."""
        needed = context_size(setup, None) if self.options.n_ctx is None else setup.max_context or 0
        if needed > self.n_ctx:
            return False
        self.name, self.workdir = setup.name, setup.workdir
        return True

    def versions(self) -> dict[str, str]:
        from adapters.engines.served import installed_version

        return {"llama-cpp-python": installed_version("llama-cpp-python"), "gguf": os.path.basename(self.path),
                "weights": self._file_type(), "tensor_types": describe(Path(self.path)),
                "kv_cache": self.options.cache_words(), "flash_attn": "on" if self.options.flash_attn else "off",
                "n_ctx": self._context(),
                "extra_buffers": "on" if self.extra_buffers else "off"}

    def _context(self) -> str:
        """The context llama.cpp allocated (it pads the n_ctx it is given), and per sequence (the length its
        LongRoPE compares with the original context to choose the long or short factors)."""
        ctx = self.llm.ctx
        allocated, per_sequence = self.llama_cpp.llama_n_ctx(ctx), self.llama_cpp.llama_n_ctx_seq(ctx)
        return f"{allocated} allocated, {per_sequence} per sequence, {asked_context(self.n_ctx, self.options.n_ctx)}"

    def _file_type(self) -> str:
        """llama.cpp's own description of the loaded model (architecture, size, weight type)."""
        import ctypes

        buffer = ctypes.create_string_buffer(128)
        self.llama_cpp.llama_model_desc(self.llm.model, buffer, len(buffer))
        return buffer.value.decode(errors="replace")

    def translate(self, params: SamplingParams, top_logprobs: int) -> Translation:
        return translate(params, self.options.last_n_tokens)

    def generate(self, requests: list[Request]) -> Iterator[Result]:
        for request in requests:
            yield self._generate_one(request)

    def _generate_one(self, request: Request) -> Result:
        translation = self.translate(request.params, request.top_logprobs)
        native = translation.native_params
        llm = self.llm
        llm.reset()  # a fresh evaluation of every prompt: no KV-cache prefix reuse between cases
        if "seed" in native:
            llm.set_seed(native["seed"])
        kwargs = {k: native[k] for k in GENERATE_KWARGS}
        if native.get("logit_bias"):
            kwargs["logits_processor"] = [bias_processor(native["logit_bias"])]
        if native.get("grammar"):
            kwargs["grammar"] = grammar(native["grammar"])
        stop_ids = set(native.get("stop_token_ids") or [])
        tokens: list[int] = []
        finish = "length"
        started = time.perf_counter()
        for token in llm.generate(request.prompt_ids, **kwargs):
            tokens.append(int(token))
            if token in stop_ids or (not native.get("ignore_eos")
                                     and self.llama_cpp.llama_vocab_is_eog(self.vocab, token)):
                finish = "stop"
                break
            if native.get("stop") and any(s in self._text(tokens) for s in native["stop"]):
                finish = "stop"
                break
            if len(tokens) >= native["max_tokens"]:
                break
        elapsed = time.perf_counter() - started
        first = len(request.prompt_ids) - 1  # the row of the scores buffer that predicts the first new token
        logprobs = log_softmax(np.asarray(llm.scores[first:first + len(tokens)], dtype=np.float64))
        k = request.top_logprobs
        top = top_k_ids(logprobs, k)
        rows = np.arange(len(tokens))
        return Result(case_id=request.case_id, engine=self.name, status="ok", prompt_ids=request.prompt_ids,
                      token_ids=tokens, text=self._text(tokens, native.get("skip_special_tokens", True)),
                      finish_reason=finish,
                      chosen_logprobs=logprobs[rows, tokens].tolist(), top_ids=top.tolist(),
                      top_logprobs=np.take_along_axis(logprobs, top, axis=-1).tolist(),
                      native_params=native, warnings=translation.warnings, timings={"generate_s": elapsed})

    def _text(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.llm.detokenize(tokens, special=not skip_special_tokens).decode("utf-8", errors="replace")

    def trace(self, requests: list[TraceRequest]) -> Iterator[TraceResult]:
        """Teacher forcing: each sequence evaluated in one batch, logits at every position, capture points through
        the evaluation callback."""
        from adapters.tracing.ggml_graph import run_graph_traces

        if self.tracer is None:  # a second context with the same params (one batch holds a whole sequence), cb_eval
            from adapters.tracing.ggml_graph import GraphTracer

            params = type(self.llm.context_params).from_buffer_copy(self.llm.context_params)
            self.tracer = GraphTracer(self.llama_cpp, self.llm.model, params, getattr(self.llm, "_lora_adapter", None))
        cache = self.options.cache_words()
        yield from run_graph_traces(self.name, self.tracer, requests, self.workdir,
                                    {"engine": DESCRIPTION.name, "dtype": "float32", "weights": self._file_type(),
                                     "kv_cache": "" if cache == "f32" else cache})

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
        if getattr(self, "llm", None) is not None:
            self.llm.close()
            self.llm = None


DESCRIPTION = EngineDescription(
    name="llama.cpp", summary="llama.cpp through llama-cpp-python in the worker, on a GGUF of the scenario's model",
    engine=Engine, options=Options,
    requirement=Requirement(module="llama_cpp", distribution="llama-cpp-python", extra="llamacpp"),
    capabilities=Capabilities(traces=True, forced_layers=True, dtypes=("float32",)),
    sampling=lambda options: SamplingCode("adapters.sampling.llamacpp", {
        "mode": "library", "last_n_tokens": options.last_n_tokens, "gguf": options.gguf}),
    prepare=llamacpp_gguf.prepare, weights=lambda model_path, options: llamacpp_gguf.weights(model_path, options.gguf),
    own_bos=lambda options: user_gguf_bos(options.gguf), lora=LORA_RULES,
    logprobs=lambda options: LogprobMeaning("raw_logprobs", "the log-softmax of llama.cpp's logits (llm.scores), "
                                            "computed here before its sampler"))
