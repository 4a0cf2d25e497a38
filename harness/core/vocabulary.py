"""The canonical sampling and decoding vocabulary, defined once.

Each param is one field of SamplingParams, and its field carries a ParamInfo: its group, the value that means "no
effect", whether greedy decoding ignores it, and the OpenAI request field that carries it. Every list elsewhere (the
adapters' translations, the effective-params table, transplant ablations, dialect tables, the docs) is derived from
these fields through the helpers at the bottom of this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.core.constraint_values import regex_problem, schema_problem


class Group(StrEnum):
    DECODING = "decoding"  # greedy or sampling, and the temperature of the softmax
    TRUNCATION = "truncation"  # which tokens may be sampled at all
    PENALTY = "penalty"  # logit changes that depend on the tokens seen so far
    LENGTH = "length"  # when generation ends
    RANDOMNESS = "randomness"  # which random stream a sample draws from
    BEAM = "beam"  # beam search: how many partial sequences are kept, how they are scored and when the search ends
    CONSTRAINT = "constraint"  # tokens banned or biased by rule, whatever the distribution: n-grams, words, a bias
    DETOKENISATION = "detokenisation"  # how generated ids become the text a client reads (no token changes)


@dataclass(frozen=True)
class ParamInfo:
    group: Group
    neutral: Any = None  # the value with no effect; None when there is none (max_new_tokens)
    greedy_irrelevant: bool = False  # greedy decoding (an argmax) ignores it
    openai_field: str | None = None  # the field of the OpenAI completions API that carries it, if any
    meaning: str = ""


class Constraint(BaseModel):
    """Constrained output: exactly one of a JSON schema, a regular expression (matched whole) or a list of choices."""

    model_config = ConfigDict(extra="forbid")

    json_schema: dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _exactly_one_valid(self) -> Constraint:
        given = [k for k in ("json_schema", "regex", "choice") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of json_schema, regex, choice (found {given or 'none'})")
        problem = regex_problem(self.regex) if self.regex is not None else \
            schema_problem(self.json_schema) if self.json_schema is not None else None
        if problem:
            raise ValueError(problem)
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("json_schema", "regex", "choice") if getattr(self, k) is not None)

    def described(self) -> str:
        value = getattr(self, self.kind)
        text = json.dumps(value, separators=(",", ":")) if self.kind != "regex" else repr(value)
        return f"{self.kind} {text if len(text) <= 60 else text[:57] + '...'}"


class SamplingParams(BaseModel):
    """The canonical sampling vocabulary. None means 'not set'; adapters translate the set fields.

    do_sample defaults to (temperature > 0): leaving both unset means greedy decoding.
    """

    model_config = ConfigDict(extra="forbid")

    temperature: Annotated[float | None, Field(ge=0), ParamInfo(
        Group.DECODING, 1.0, greedy_irrelevant=True, openai_field="temperature",
        meaning="divides the logits before the softmax; 0 means greedy")] = None
    top_k: Annotated[int | None, Field(ge=0), ParamInfo(
        Group.TRUNCATION, 0, greedy_irrelevant=True, meaning="keep the k most likely tokens; 0 disables it")] = None
    top_p: Annotated[float | None, Field(gt=0, le=1), ParamInfo(
        Group.TRUNCATION, 1.0, greedy_irrelevant=True, openai_field="top_p",
        meaning="keep the smallest set of most likely tokens whose probability reaches p")] = None
    min_p: Annotated[float | None, Field(ge=0, le=1), ParamInfo(
        Group.TRUNCATION, 0.0, greedy_irrelevant=True,
        meaning="drop tokens less likely than min_p x the top token's probability")] = None
    repetition_penalty: Annotated[float | None, Field(gt=0), ParamInfo(
        Group.PENALTY, 1.0, meaning="repetition_penalty (HF/vLLM) divides a positive logit by the penalty and "
                                    "multiplies a negative one, once per distinct token already in the prompt or "
                                    "output")] = None
    frequency_penalty: Annotated[float | None, Field(ge=-2, le=2), ParamInfo(
        Group.PENALTY, 0.0, openai_field="frequency_penalty",
        meaning="frequency_penalty (OpenAI/vLLM) subtracts penalty x count from the logit of each token generated "
                "so far (prompt excluded)")] = None
    presence_penalty: Annotated[float | None, Field(ge=-2, le=2), ParamInfo(
        Group.PENALTY, 0.0, openai_field="presence_penalty",
        meaning="presence_penalty (OpenAI/vLLM) subtracts a flat penalty once from the logit of every token "
                "generated so far (prompt excluded)")] = None
    max_new_tokens: Annotated[int, Field(ge=1), ParamInfo(
        Group.LENGTH, openai_field="max_tokens", meaning="the most tokens generated")] = 32
    min_new_tokens: Annotated[int | None, Field(ge=0), ParamInfo(
        Group.LENGTH, 0, meaning="EOS is forbidden before this many tokens")] = None
    seed: Annotated[int | None, ParamInfo(
        Group.RANDOMNESS, greedy_irrelevant=True, openai_field="seed", meaning="the random stream of sampling")] = None
    stop: Annotated[list[str] | None, ParamInfo(
        Group.LENGTH, openai_field="stop", meaning="strings that end the generation")] = None
    ignore_eos: Annotated[bool, ParamInfo(Group.LENGTH, False, meaning="generate past EOS")] = False
    stop_token_ids: Annotated[list[int] | None, ParamInfo(
        Group.LENGTH, meaning="token ids that end the generation besides the model's EOS (HF: its eos_token_id "
                              "list)")] = None
    include_stop_str_in_output: Annotated[bool | None, ParamInfo(
        Group.LENGTH, meaning="whether a matched stop string (vLLM: or a stop token's text) stays at the end of "
                              "the text")] = None
    no_repeat_ngram_size: Annotated[int | None, Field(ge=0), ParamInfo(
        Group.CONSTRAINT, 0, meaning="bans every token that would repeat an n-gram of this size already in the "
                                     "prompt or output")] = None
    logit_bias: Annotated[dict[int, float] | None, ParamInfo(
        Group.CONSTRAINT, openai_field="logit_bias",
        meaning="adds a fixed bias to the logits of given token ids (-100 bans, 100 forces)")] = None
    bad_words: Annotated[list[str] | None, ParamInfo(
        Group.CONSTRAINT, meaning="words that are never generated (their token sequences are banned)")] = None
    constraint: Annotated[Constraint | None, ParamInfo(
        Group.CONSTRAINT, meaning="constrained output: a JSON schema, a regex or a choice list the text must satisfy "
                                  "(a scenario's constraint: block sets it on every engine but the reference)")] = None
    skip_special_tokens: Annotated[bool | None, ParamInfo(
        Group.DETOKENISATION, meaning="drop special tokens (EOS, chat markers) from the text")] = None
    spaces_between_special_tokens: Annotated[bool | None, ParamInfo(
        Group.DETOKENISATION, meaning="put a space between adjacent special tokens in the text")] = None
    do_sample: Annotated[bool | None, ParamInfo(
        Group.DECODING, meaning="sample (true) or take the argmax (false); unset: temperature > 0")] = None
    # Beam search. Unset beam params (other than num_return_sequences) mean the engine's own default, which
    # `parity params` shows: there is no value every engine reads as "no effect".
    num_beams: Annotated[int | None, Field(ge=2), ParamInfo(
        Group.BEAM, meaning="beam search keeping this many partial sequences (the beam width); unset: no beam "
                            "search")] = None
    length_penalty: Annotated[float | None, ParamInfo(
        Group.BEAM, meaning="a finished beam's score is its cumulative logprob / length ** length_penalty; which "
                            "length is the engine's rule")] = None
    early_stopping: Annotated[bool | Literal["never"] | None, ParamInfo(
        Group.BEAM, meaning="when the search may end before max_new_tokens (HF: true, false: a heuristic, "
                            "never)")] = None
    num_return_sequences: Annotated[int | None, Field(ge=1), ParamInfo(
        Group.BEAM, meaning="how many of the best beams are returned and compared; unset: num_beams")] = None

    @model_validator(mode="after")
    def _sampling_needs_temperature(self) -> SamplingParams:
        if self.do_sample and self.temperature == 0:
            raise ValueError("do_sample: true with temperature: 0 is contradictory; drop one of them")
        return self

    @model_validator(mode="after")
    def _beam_params_need_beams(self) -> SamplingParams:
        if self.num_beams is None and not self.greedy and (self.num_return_sequences or 1) > 1:
            raise ValueError(f"num_return_sequences {self.num_return_sequences} under sampling is not compared "
                             "sequence by sequence: n samples are n draws from a distribution, not n answers to "
                             "match; compare the distributions with a scenario `sampling:` block (samples: N, "
                             "steps: S: a G-test per step), or drop num_return_sequences")
        others = [n for n in BEAM_OPTIONS if getattr(self, n) is not None]
        if others and self.num_beams is None:
            raise ValueError(f"{', '.join(others)}: for beam search only: set num_beams too, or drop it")
        if self.num_beams is not None and not self.greedy:
            raise ValueError("num_beams with sampling (beam sampling) is not compared: beam search here is "
                             "deterministic; set temperature: 0 or drop num_beams")
        if (self.num_return_sequences or 0) > (self.num_beams or 0):
            raise ValueError(f"num_return_sequences {self.num_return_sequences} exceeds num_beams "
                             f"{self.num_beams}: a search returns at most its beams")
        return self

    @property
    def beams_returned(self) -> int:
        """How many beams a beam-search case returns and compares (0: not beam search)."""
        return self.num_return_sequences or self.num_beams or 0

    @property
    def greedy(self) -> bool:
        if self.do_sample is not None:
            return not self.do_sample
        return not self.temperature

    def set_fields(self) -> dict[str, Any]:
        """The params a scenario actually set (defaults of max_new_tokens and ignore_eos included)."""
        return self.model_dump(exclude_none=True)

    def neutralised(self, name: str) -> SamplingParams:
        """These params with one of them unset (its neutral meaning); temperature keeps sampling on."""
        update: dict[str, Any] = {name: None}
        if name == "temperature" and not self.greedy:
            update["do_sample"] = True
        return SamplingParams.model_validate({**self.model_dump(), **update})


def _info(name: str) -> ParamInfo:
    return next(m for m in SamplingParams.model_fields[name].metadata if isinstance(m, ParamInfo))


PARAMS: dict[str, ParamInfo] = {name: _info(name) for name in SamplingParams.model_fields}


def names(*groups: Group, greedy_irrelevant: bool | None = None) -> tuple[str, ...]:
    """Canonical param names in declaration order, optionally of some groups only or by greedy relevance."""
    return tuple(n for n, i in PARAMS.items() if (not groups or i.group in groups)
                 and (greedy_irrelevant is None or i.greedy_irrelevant == greedy_irrelevant))


PENALTIES = names(Group.PENALTY)
BEAM = names(Group.BEAM)
BEAM_OPTIONS = tuple(n for n in BEAM if n != "num_beams")  # the beam params besides the width
CONSTRAINTS = names(Group.CONSTRAINT)
DETOKENISATION = names(Group.DETOKENISATION)
TRUNCATION = names(Group.TRUNCATION)
GREEDY_IRRELEVANT = names(greedy_irrelevant=True)
NEUTRAL: dict[str, Any] = {n: i.neutral for n, i in PARAMS.items() if i.neutral is not None}
OPENAI_FIELDS: dict[str, str] = {n: i.openai_field for n, i in PARAMS.items() if i.openai_field}
# The params that shape the distribution a token is drawn from (what a sampler transplant can neutralise one by one)
SHAPING = tuple(n for n in names(Group.PENALTY, Group.DECODING, Group.TRUNCATION) if n != "do_sample")


def meaning(name: str) -> str:
    return PARAMS[name].meaning


# Invariance knobs: each runs the same cases under a baseline and a variant configuration of one engine
# (harness.plan.invariance_checks). The request knobs need nothing but requests, so every engine can turn them.
KNOBS = ("repeat", "batch", "order", "concurrency", "prefix_cache", "chunked_prefill", "speculative",
         "batch_invariant", "seed", "stream", "tensor_parallel",
         "compile")
REQUEST_KNOBS = ("repeat", "order", "seed")
