"""A difference that depends on the sequence's length. Explain's teacher-forced pass runs the whole sequence at once,
so a model whose rope factors follow the current length (LongRoPE switches from its short to its long factors past
the original context; dynamic NTK rescales as the sequence grows) is traced with the factors of the full length,
while each token was generated with those of the length the engine had then (vllm#27414: factors switched
mid-generation). Where such a model's run diverged and the full pass finds no component out of the noise floor, each
diverged case is traced again up to its divergent step (the prompt and the tokens generated before it: the sequence
the engines had when they chose differently), and a component that leaves the floor there is reported as a
difference that depends on the sequence length.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.core.types import TraceRequest
from harness.explain.localise import Localisation
from harness.models.families import rope_parameters

LENGTH_DEPENDENT = ("longrope", "dynamic")  # rope types whose factors depend on the sequence's length
REREAD = ("near_tie", "beyond_noise", "none", "sampler", "ending")  # full-pass readings with nothing out of the floor


def length_dependent_rope(model_path: Path) -> str | None:
    """The rope type of a model folder if its factors depend on the sequence's length (else None)."""
    kind = rope_parameters(json.loads((Path(model_path) / "config.json").read_text()))["rope_type"]
    return kind if kind in LENGTH_DEPENDENT else None


def prefix_requests(requests: list[TraceRequest], localisations: list[Localisation]) -> dict[str, TraceRequest]:
    """Localisation key (case, engine) -> the pass up to its divergent step, for the diverged cases the full pass
    left unsettled (one request per case and length, shared by the engines)."""
    by_case = {r.case_id: r for r in requests}
    found: dict[str, TraceRequest] = {}
    for loc in localisations:
        if loc.first_step is None or loc.cause not in REREAD or loc.case_id not in by_case:
            continue
        request = by_case[loc.case_id]
        end = request.prompt_len + loc.first_step
        found[f"{loc.case_id}\n{loc.engine}"] = TraceRequest(case_id=f"{loc.case_id}@{end}",
                                                             token_ids=request.token_ids[:end],
                                                             prompt_len=request.prompt_len)
    return found


def reread(full: Localisation, prefix: Localisation, tokens: int, total: int, rope: str) -> Localisation:
    """The case's localisation once its prefix was traced: a component that leaves the floor only there is a
    difference that depends on the sequence length; otherwise the full pass's reading stands, the prefix said."""
    if prefix.cause != "component":
        return full.model_copy(update={"verdict": f"{full.verdict}; traced up to the divergent step ({tokens} of "
                                                  f"{total} tokens) the engines agree as well ({prefix.cause})"})
    said = prefix.verdict.removesuffix(" The generated tokens agree.")  # said of a pass with no tokens to compare
    verdict = (f"the difference depends on the sequence's length: traced over the {tokens} tokens the engines had "
               f"when they chose step {full.first_step}'s token, {said[0].lower()}{said[1:]} "
               f"Traced over all {total} tokens every point stays within the floor ({full.cause}): the model's {rope} "
               "rope chooses its factors by the sequence's length, and the engines choose them differently at this "
               "length.")
    return full.model_copy(update={"cause": "length", "verdict": verdict, "out_of_floor": prefix.out_of_floor,
                                   "first_difference": prefix.first_difference, "curve": prefix.curve})
