"""Effective params of a server whose own sampling code is not installed here (llama.cpp, SGLang, any other
OpenAI-compatible server): what the harness sends is known, everything else the server decides. Every field the
request leaves to the server, and every token-changing generation_config.json field, is listed as unknown, never
left out."""

from __future__ import annotations

from pathlib import Path

from adapters.http.client import translate as request_body
from adapters.http.dialects import DIALECTS
from adapters.sampling.common import REQUEST, sent_fields, settings_table
from harness.core.types import Effective
from harness.core.vocabulary import CONSTRAINTS, DETOKENISATION, OPENAI_FIELDS, SHAPING, SamplingParams

SOURCES = ("adapters.http.client", "adapters.http.dialects")  # modules the answers also depend on (cache key)
NO_TRANSPLANT = "no sampler code to run here: the server's sampler is not installed (parity transplant needs it)"
SERVER_DECIDES = "the server decides"


def effective(model_path: Path, params: SamplingParams, dtype: str, dialect: str = "generic",
              defaults: str = "canonical") -> Effective:
    spoken = DIALECTS[dialect]
    sent = request_body(params, spoken, 5, "completions", defaults).native_params
    values, sources = {}, {}
    for name in SHAPING:
        field = OPENAI_FIELDS.get(name) or spoken.extra_fields.get(name)
        if field in sent:
            values[name], sources[name] = sent[field], REQUEST
        else:
            default = spoken.defaults.get(name)
            values[name] = default if isinstance(default, (int, float)) else None
            sources[name] = f"{SERVER_DECIDES}" + (f" (documented default: {default})" if default is not None else "")
    temperature = sent.get("temperature")
    decoding = "greedy" if temperature == 0 else "sampling" if temperature is not None else SERVER_DECIDES
    notes = [f"the {dialect} server's sampling code is not installed here: the values are what the harness sends; "
             f"each field it does not send is {SERVER_DECIDES}"]
    notes += [f"{name}: {source}" for name, source in sources.items() if source != REQUEST]
    return Effective(
        decoding=decoding, temperature=values["temperature"] if decoding != "greedy" else None,
        top_k=values["top_k"], top_p=values["top_p"], min_p=values["min_p"],
        repetition_penalty=values["repetition_penalty"], repetition_scope=SERVER_DECIDES,
        frequency_penalty=values["frequency_penalty"], presence_penalty=values["presence_penalty"],
        max_new_tokens=sent.get("max_tokens"), seed=sent.get("seed"), logits_dtype=SERVER_DECIDES,
        **sent_fields(params, tuple(n for n in (*CONSTRAINTS, *DETOKENISATION, "stop_token_ids",
                                                 "include_stop_str_in_output") if spoken.handling(n) == "honours"),
                      skip_default=None, stop_included=None),
        processors=[SERVER_DECIDES], sources=sources, notes=notes,
        extra=settings_table(model_path, lambda key, value: ("unknown", f"{SERVER_DECIDES}: its own code may or "
                                                                        "may not read the model's file")))
