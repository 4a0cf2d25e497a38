"""What each known OpenAI-compatible server does with the canonical sampling params.

For every server: which params it honours (and under which request field), which it accepts but ignores, which
it cannot receive at all, its defaults when a param is unset, whether it takes token-id prompts, and how (if at
all) it returns token ids. Sources: ENGINE_NOTES.md (measured on vLLM 0.32 and read from lmdeploy 0.18 code) and
each server's documented request schema. docs/engines-and-servers.md renders this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters.contract import SamplingCode
from adapters.http.agent_support import NAMED, NONE, PARSER, REQUEST, STARTUP, AgentSupport
from harness.core.vocabulary import BEAM, OPENAI_FIELDS, names


@dataclass(frozen=True)
class Dialect:
    name: str
    description: str
    extra_fields: dict[str, str]  # canonical param -> non-OpenAI request field the server accepts
    ignores: frozenset[str] = frozenset()  # accepted in the request, no effect
    defaults: dict[str, Any] = field(default_factory=dict)  # server behaviour when the param is unset
    token_id_prompts: bool = False  # /v1/completions accepts `prompt: [ids]`
    token_id_fields: dict[str, Any] = field(default_factory=dict)  # request fields that make it return token ids
    notes: str = ""
    neutral: dict[str, Any] = field(default_factory=dict)  # the server's own spelling of a param's neutral value
    # params whose built-in default (the server's own, not the model's file) is not neutral: the neutral value is
    # sent whenever the scenario leaves them unset, in greedy mode too (a penalty changes an argmax)
    nonneutral: frozenset[str] = frozenset()
    default_endpoint: str = "completions"  # the endpoint token-level comparison uses unless the scenario says
    # endpoints that answer without per-token logprobs, with why: a scenario using one is refused at validation
    no_logprobs: dict[str, str] = field(default_factory=dict)
    generate_fields: frozenset[str] = frozenset()  # request fields of the server's native /generate, if it has one
    # the server's own sampling code, when it is installed here (effective params, transplant): module and kwargs
    sampling: SamplingCode | None = None
    # beam search: canonical param -> request field, and the fields every beam request carries; none: it has none
    beam_fields: dict[str, str] = field(default_factory=dict)
    beam_request: dict[str, Any] = field(default_factory=dict)
    beam_notes: dict[str, str] = field(default_factory=dict)  # beam param -> what the server does instead
    # what token text '' stands for in its answers: "" nothing known (dropped, warned); "eos" the server writes special
    # tokens as empty text, so '' is taken as the model's EOS (warned)
    empty_token: str = ""
    # the OpenAPI component of its completions request, checked against the live server's /openapi.json at start:
    # every field the dialect sends must exist there, and its defaults must be the ones written here
    request_schema: str = ""
    # requests a client keeps in flight unless the scenario sets concurrency: as many as the server runs at once
    in_flight: int = 16
    in_flight_note: str = "a guess for an unknown server: set concurrency to what it runs at once"
    stream_usage: bool = False  # it takes stream_options: {include_usage: true} (token counts in a streamed answer)
    agent: AgentSupport = AgentSupport()  # what it does with tools, template switches and reasoning

    def sampling_code(self, defaults: str) -> SamplingCode | None:
        """The sampling code of a server of this kind that the harness did not start (its own default
        generation-config handling applies), for requests made with the given defaults mode."""
        if self.sampling is None:
            return None
        return SamplingCode(self.sampling.module, {**self.sampling.kwargs, "defaults": defaults})

    def handling(self, param: str) -> str:
        if param in BEAM:
            return "honours" if param in self.beam_fields else "rejects"
        if param in self.ignores:
            return "ignores"
        if param in OPENAI_FIELDS or param in self.extra_fields:
            return "honours"
        return "rejects"


DIALECTS: dict[str, Dialect] = {
    "vllm": Dialect(
        "vllm", "vLLM OpenAI server (python -m vllm.entrypoints.openai.api_server)",
        extra_fields={"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                      "ignore_eos": "ignore_eos", "min_new_tokens": "min_tokens",
                      **{name: name for name in ("stop_token_ids", "include_stop_str_in_output", "bad_words",
                                                 "skip_special_tokens", "spaces_between_special_tokens")},
                      "constraint": "structured_outputs"},
        defaults={"temperature": "1.0, or the model's generation_config.json (--generation-config auto)",
                  "top_k": "off", "top_p": 1.0, "max_new_tokens": 16},
        token_id_prompts=True,
        token_id_fields={"return_tokens_as_token_ids": True, "return_token_ids": True},
        sampling=SamplingCode("adapters.sampling.vllm", {"mode": "server", "generation_config": "auto"}),
        in_flight=128, in_flight_note="its scheduler's max_num_seqs on CPU (vLLM 0.32's default for the server)",
        stream_usage=True, agent=AgentSupport(calls=PARSER, reasoning=PARSER, template_kwargs=REQUEST),
        beam_fields={"num_beams": "n", "length_penalty": "length_penalty", "max_new_tokens": "max_tokens",
                     "ignore_eos": "ignore_eos"},
        # the EOS that finished a beam stays in its token ids, as offline
        beam_request={"use_beam_search": True, "temperature": 0.0, "include_stop_str_in_output": True},
        beam_notes={"num_beams": "with use_beam_search: true", "length_penalty": "unset: 1.0; divides by prompt + "
                    "generated tokens", "early_stopping": "no early stopping: it runs to max_tokens",
                    "num_return_sequences": "it returns n beams (n is the beam width)"}),
    "lmdeploy": Dialect(
        "lmdeploy", "lmdeploy api_server (0.18)",
        extra_fields={"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                      "ignore_eos": "ignore_eos",
                      **{name: name for name in ("stop_token_ids", "include_stop_str_in_output",
                                                 "skip_special_tokens", "spaces_between_special_tokens")}},
        ignores=frozenset({"frequency_penalty", "presence_penalty", "logit_bias"}),
        defaults={"temperature": 0.8, "top_k": 50, "top_p": 1.0, "do_sample": "always true on the server",
                  "repetition_penalty": "1.0, over generated tokens only (never the prompt)"},
        notes="temperature 0 becomes top_k=1; token-level comparison uses its native /generate (token ids in and "
              "out, top logprobs with ids); /v1/completions returns no logprobs (0.18), /v1/chat/completions "
              "byte-level token pieces",
        default_endpoint="generate",
        no_logprobs={"completions": "lmdeploy's api_server (0.18) answers /v1/completions with logprobs: null"},
        generate_fields=frozenset({"max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                   "ignore_eos", "stop", "return_logprob", "top_logprobs_num",
                                   "skip_special_tokens", "stop_token_ids", "include_stop_str_in_output",
                                   "spaces_between_special_tokens"}),
        sampling=SamplingCode("adapters.sampling.lmdeploy", {"mode": "server", "generation_config": "auto"}),
        in_flight=128, in_flight_note="its engine's max_batch_size (lmdeploy 0.18's default outside the largest GPUs)",
        agent=AgentSupport(calls=PARSER, reasoning=PARSER, template_kwargs=REQUEST)),
    "llamacpp": Dialect(
        "llamacpp", "llama.cpp's native llama-server (OpenAI-compatible endpoints)",
        extra_fields={"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty"},
        defaults={"top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.0},
        nonneutral=frozenset({"top_k", "top_p", "min_p"}),
        token_id_prompts=True,
        notes="the native C++ server; llama-cpp-python's Python server is the llama-cpp-python dialect",
        sampling=SamplingCode("adapters.sampling.dialect", {"dialect": "llamacpp"}),
        in_flight=4, in_flight_note="llama-server's default slots (-np 4)", stream_usage=True),
    "llama-cpp-python": Dialect(
        "llama-cpp-python", "llama-cpp-python's OpenAI-compatible server (python -m llama_cpp.server)",
        extra_fields={"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty",
                      "min_new_tokens": "min_tokens"},
        defaults={"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1,
                  "max_new_tokens": 16},
        nonneutral=frozenset({"top_k", "top_p", "min_p", "repetition_penalty"}),
        notes="text prompts only (token-id prompts are rejected); top logprobs come as token text, special tokens "
              "as '' (taken as the EOS, with a warning); stops on EOS without returning it",
        empty_token="eos", request_schema="CreateCompletionRequest",
        sampling=SamplingCode("adapters.sampling.llamacpp", {"mode": "server"}),
        in_flight=1, in_flight_note="it answers one request at a time (one model behind a lock)",
        agent=AgentSupport(calls=NAMED, reasoning=NONE, template_kwargs=STARTUP)),
    "sglang": Dialect(
        "sglang", "SGLang OpenAI-compatible server",
        extra_fields={"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                      "ignore_eos": "ignore_eos", "min_new_tokens": "min_tokens",
                      **{name: name for name in ("stop_token_ids", "skip_special_tokens",
                                                 "spaces_between_special_tokens")}},
        defaults={"temperature": 1.0, "top_k": "off", "top_p": 1.0},
        token_id_prompts=True, sampling=SamplingCode("adapters.sampling.dialect", {"dialect": "sglang"})),
    "generic": Dialect(
        "generic", "any other OpenAI-compatible server: only the OpenAI fields are sent",
        extra_fields={}, defaults={"temperature": 1.0, "top_p": 1.0},
        sampling=SamplingCode("adapters.sampling.dialect", {"dialect": "generic"})),
}

CANONICAL_PARAMS = tuple(n for n in names() if n != "do_sample")  # do_sample is how temperature is sent


def markdown_table() -> str:
    """The dialect table as Markdown (for docs/engines-and-servers.md)."""
    header = "| param | " + " | ".join(DIALECTS) + " |\n|---|" + "---|" * len(DIALECTS) + "\n"
    rows = []
    for param in CANONICAL_PARAMS:
        cells = []
        for d in DIALECTS.values():
            how = d.handling(param)
            sent = OPENAI_FIELDS.get(param) or d.extra_fields.get(param)
            if param in BEAM:
                sent = d.beam_fields.get(param)
                cell = "no beam search" if not d.beam_fields else f"honours (`{sent}`)" if sent \
                    else "rejects: not sent (warning)"
            else:
                cell = {"honours": f"honours (`{sent}`)", "ignores": "accepts, ignores (warning)",
                        "rejects": "rejects: not sent (warning)"}[how]
            if param in d.defaults:
                cell += f"; unset: {d.defaults[param]}"
            if param in d.beam_notes:
                cell += f"; {d.beam_notes[param]}"
            cells.append(cell)
        rows.append(f"| {param} | " + " | ".join(cells) + " |")
    extras = [("endpoint for token-level comparison", lambda d: d.default_endpoint),
              ("token-id prompts", lambda d: "yes" if d.token_id_prompts else "on /generate" if d.generate_fields
               else "no"),
              ("returns token ids", lambda d: ", ".join(d.token_id_fields) or ("on /generate; elsewhere mapped back "
               "with the tokenizer" if d.generate_fields else "no: mapped back with the tokenizer")),
              ("requests in flight (unset concurrency)", lambda d: f"{d.in_flight}: {d.in_flight_note}"),
              ("notes", lambda d: d.notes)]
    rows += [f"| {label} | " + " | ".join(fn(d) for d in DIALECTS.values()) + " |" for label, fn in extras]
    return header + "\n".join(rows) + "\n"
