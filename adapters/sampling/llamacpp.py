"""llama.cpp's own sampling code without a model: the sampler chain llama-cpp-python builds for a request
(Llama._init_sampler, the code its generate() and its server run) made of llama.cpp's C samplers, read back from
llama.cpp itself (llama_sampler_chain_get / llama_sampler_name, inactive samplers marked '?'), and that chain applied
sampler by sampler to given logits (the sampler transplant), with the penalties' window of generated tokens fed
through llama_sampler_accept exactly as llama_sampler_sample feeds it.

mode "library": the kwargs the llama.cpp engine passes (adapters.engines.llamacpp.translate);
mode "server": the request body the harness sends llama_cpp.server, completed by the server's own request model
(llama_cpp.server.types.CreateCompletionRequest), whose defaults fill every field the body leaves out
(repeat_penalty 1.1, top_k 40, top_p 0.95, min_p 0.05, temperature 0.8).
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from adapters.sampling.common import REQUEST, sent_fields, settings_table
from harness.core.types import Effective
from harness.core.vocabulary import GREEDY_IRRELEVANT, NEUTRAL, SamplingParams

DISTRIBUTIONS = ("llama-cpp-python",)
SOURCES = ("adapters.engines.llamacpp", "adapters.http.client", "adapters.http.dialects")  # (cache key)
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # struct llama_token_data
SERVER_DEFAULT = "server default (llama_cpp.server's request model)"
# canonical param -> the _init_sampler keyword that carries it
KEYWORDS = {"temperature": "temp", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
            "repetition_penalty": "repeat_penalty", "frequency_penalty": "frequency_penalty",
            "presence_penalty": "presence_penalty"}
SERVER_FIELDS = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "repeat_penalty": "repeat_penalty", "frequency_penalty": "frequency_penalty",
                 "presence_penalty": "presence_penalty"}


def sampler_kwargs(params: SamplingParams, mode: str, last_n_tokens: int,
                   defaults: str = "canonical") -> tuple[dict[str, Any], dict[str, str]]:
    """(the keyword arguments llama-cpp-python's _init_sampler receives, where each came from)."""
    if mode == "library":
        from adapters.engines.llamacpp import GENERATE_KWARGS, translate

        native = translate(params, last_n_tokens).native_params
        return {k: native[k] for k in GENERATE_KWARGS}, {k: REQUEST for k in GENERATE_KWARGS}
    from llama_cpp.server.types import CreateCompletionRequest

    from adapters.http.client import translate as request_body
    from adapters.http.dialects import DIALECTS

    body = request_body(params, DIALECTS["llama-cpp-python"], 5, "completions", defaults).native_params
    request = CreateCompletionRequest(prompt="", **{k: v for k, v in body.items() if k != "logprobs"})
    kwargs = {keyword: getattr(request, field) for keyword, field in SERVER_FIELDS.items()}
    kwargs["typical_p"] = 1.0  # the server's request has no typical_p: create_completion's default
    sources = {k: REQUEST if field in body else SERVER_DEFAULT for k, field in SERVER_FIELDS.items()}
    return kwargs, sources


def sampler_chain(kwargs: dict[str, Any], vocab: int, last_n_tokens: int) -> Any:
    """The chain llama-cpp-python builds (its own Llama._init_sampler, on a stand-in for the model object: the
    method reads only the vocabulary size, the penalties' window and the seed)."""
    from llama_cpp import Llama

    return Llama._init_sampler(SimpleNamespace(_n_vocab=vocab, last_n_tokens_size=last_n_tokens, _seed=0), **kwargs)


def chain_names(chain: Any) -> list[str]:
    """llama.cpp's names of the chain's samplers, in order ('?top-k': present but inactive with these params)."""
    import llama_cpp

    return [llama_cpp.llama_sampler_name(llama_cpp.llama_sampler_chain_get(chain.sampler, i)).decode()
            for i in range(llama_cpp.llama_sampler_chain_n(chain.sampler))]


def _vocab(model_path: Path) -> int:
    return int(json.loads((Path(model_path) / "config.json").read_text())["vocab_size"])


# the constraint and detokenisation params each mode takes (library: around llama-cpp-python's generate() loop, as
# the llamacpp adapter applies them; server: llama-cpp-python's server's request fields)
TAKEN = {"library": ("stop_token_ids", "logit_bias", "skip_special_tokens", "constraint"), "server": ("logit_bias",)}


def effective(model_path: Path, params: SamplingParams, dtype: str, mode: str = "library", last_n_tokens: int = 64,
              defaults: str = "canonical", gguf: str | None = None) -> Effective:
    kwargs, sources = sampler_kwargs(params, mode, last_n_tokens, defaults)
    names = chain_names(sampler_chain(kwargs, _vocab(model_path), last_n_tokens))
    greedy = kwargs["temp"] == 0.0  # llama-cpp-python: 0 is greedy (a negative temperature samples untruncated)
    notes = [f"sampler chain (llama-cpp-python's Llama._init_sampler, names from llama.cpp): {' > '.join(names)}",
             f"penalties count the last {last_n_tokens} generated tokens, never the prompt (tokens reach the penalty "
             "sampler only through llama_sampler_accept after each draw)"]
    if not greedy:
        notes.append("temperature is applied after top-k, top-p and min-p (those see the untempered distribution)")
    notes += [f"{name}={kwargs[KEYWORDS[name]]} from the {SERVER_DEFAULT}" for name in KEYWORDS
              if sources[KEYWORDS[name]] == SERVER_DEFAULT and kwargs[KEYWORDS[name]] != NEUTRAL.get(name)
              and not (greedy and name in GREEDY_IRRELEVANT)]
    return Effective(
        decoding="greedy" if greedy else "sampling",
        temperature=None if greedy else kwargs["temp"], top_k=None if greedy else kwargs["top_k"],
        top_p=None if greedy else kwargs["top_p"], min_p=None if greedy else kwargs["min_p"],
        repetition_penalty=kwargs["repeat_penalty"],
        repetition_scope=f"the last {last_n_tokens} generated tokens",
        frequency_penalty=kwargs["frequency_penalty"], presence_penalty=kwargs["presence_penalty"],
        max_new_tokens=params.max_new_tokens, seed=params.seed, logits_dtype="float32", processors=names,
        **sent_fields(params, TAKEN[mode] if not (params.constraint and params.constraint.kind == "regex")
                      else tuple(n for n in TAKEN[mode] if n != "constraint"), stop_included=True),
        sources={name: sources[KEYWORDS[name]] for name in KEYWORDS} | {"max_new_tokens": REQUEST},
        notes=notes,
        extra=settings_table(model_path, lambda key, value: _applies(model_path, gguf, key, value)))


def _applies(model_path: Path, gguf: str | None, key: str, value: Any) -> tuple[str, str]:
    """llama.cpp never reads generation_config.json; it stops on the end-of-generation tokens of the GGUF's own
    tokenizer metadata, which may or may not be the file's eos_token_id (asked of llama.cpp, vocabulary only)."""
    if key != "eos_token_id":
        return "no", "llama.cpp reads the GGUF, never generation_config.json"
    from adapters.engines.gguf_cache import variant_path

    path = Path(gguf) if gguf and gguf.endswith(".gguf") else variant_path(model_path, gguf) if gguf else None
    if path is None or not path.exists():
        return "unknown", "llama.cpp stops on the end-of-generation tokens of its GGUF, which is not known here"
    import llama_cpp

    model = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    wanted = value if isinstance(value, list) else [value]
    stops = [t for t in wanted if llama_cpp.llama_vocab_is_eog(vocab, t)]
    model.close()
    if stops == wanted:
        return "yes", f"{wanted} are end-of-generation tokens of {path.name} (llama.cpp stops on them)"
    return "no", f"only {stops} of {wanted} are end-of-generation tokens of {path.name}"


def transplant(model_path: Path, params: SamplingParams, logits: Any, token_ids: list[int], prompt_len: int,
               record: Any, mode: str = "library", last_n_tokens: int = 64, defaults: str = "canonical",
               gguf: str | None = None) -> None:
    """llama.cpp's chain on the given logits, one sampler at a time; the final selector (greedy or dist) is not run:
    what it selects from is recorded as the step's processed scores."""
    import llama_cpp
    import torch

    kwargs, _ = sampler_kwargs(params, mode, last_n_tokens, defaults)
    chain = sampler_chain(kwargs, logits.shape[-1], last_n_tokens)
    names = chain_names(chain)
    vocab = logits.shape[-1]
    data = (llama_cpp.llama_token_data * vocab)()
    view = np.frombuffer(data, dtype=TOKEN_DATA)
    for step in range(logits.shape[0]):
        if step > 0:  # what llama_sampler_sample does after each draw: the chain (its penalties) sees the token
            llama_cpp.llama_sampler_accept(chain.sampler, token_ids[prompt_len + step - 1])
        view["id"] = np.arange(vocab)
        view["logit"] = logits[step].to(torch.float32).numpy()
        view["p"] = 0.0
        array = llama_cpp.llama_token_data_array(data=ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)),
                                                 size=vocab, selected=-1, sorted=False)
        scores = logits[step].to(torch.float32)
        record.op(step, "logits (float32)", scores)
        for i, name in enumerate(names[:-1]):
            llama_cpp.llama_sampler_apply(llama_cpp.llama_sampler_chain_get(chain.sampler, i), ctypes.byref(array))
            scores = _scores(array, vocab)
            record.op(step, name.lstrip("?"), scores)
        record.step(step, scores, sampling=kwargs["temp"] != 0.0)


def _scores(array: Any, vocab: int) -> Any:
    """The full-vocabulary scores after a sampler: the kept candidates' logits (read where the array points now, in
    case a sampler moved it), -inf for the tokens it removed."""
    import llama_cpp
    import torch

    kept = np.frombuffer((llama_cpp.llama_token_data * array.size).from_address(
        ctypes.addressof(array.data.contents)), dtype=TOKEN_DATA)
    scores = np.full(vocab, -np.inf, dtype=np.float32)
    scores[kept["id"]] = kept["logit"]
    return torch.from_numpy(scores)
