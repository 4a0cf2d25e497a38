"""`parity transplant`: every engine's own sampling code on the same logits. The reference generates each chosen
case, a teacher-forced pass captures its raw logits at every step, and each engine's sampler (HF's logits processors,
vLLM's sampler ops, lmdeploy's FusedLogitsProcessor and sampling op) processes those identical logits with that
engine's params and the same token history. When they disagree, the params are neutralised one at a time in every
engine; the ones that restore agreement are named. inf/NaN in any operation, and a sampling op that raises, are
numerical hazards.

Writes into the run directory: transplant/<engine>/<case>@<variant>.safetensors (processed scores),
transplant/steps.parquet (per case, engine, variant and step: tv, kl, kept tokens, argmaxes) and
transplant/verdicts.json.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness import models
from harness.core.errors import ConfigError
from harness.core.types import TraceRequest
from harness.core.vocabulary import GREEDY_IRRELEVANT, PENALTIES, SHAPING, SamplingParams, meaning
from harness.executors.engine_runs import run_engines
from harness.plan.plans import engine_plan
from harness.run.outcome import RunOutcome
from harness.rundir.store import write_json
from harness.rundir.tables import read_results, write_parquet
from harness.scenario.prompts import load_tokenizer
from harness.scenario.spec import LoadedScenario
from harness.semantics.jobs import SamplingJob, SamplingJobFailed
from harness.transplant.distributions import TransplantVerdict, distributions, first_disagreement, step_metrics

AS_GIVEN = "as given"
DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.39e38}


@dataclass
class TransplantOutcome:
    verdicts: list[TransplantVerdict]
    out_dir: Path
    interrupted: bool


def variants(params_by_engine: dict[str, SamplingParams]) -> dict[str, dict[str, SamplingParams]]:
    """variant name -> engine -> params: as given, then one variant per ablatable param any engine sets."""
    out = {AS_GIVEN: dict(params_by_engine)}
    greedy = all(p.greedy for p in params_by_engine.values())
    used = [n for n in SHAPING if any(getattr(p, n) is not None for p in params_by_engine.values())
            and not (greedy and n in GREEDY_IRRELEVANT)]  # no effect when greedy
    for name in used:
        out[f"without {name}"] = {e: p.neutralised(name) for e, p in params_by_engine.items()}
    differ = [n for n in used if len({getattr(p, n) for p in params_by_engine.values()}) > 1]
    if len(differ) > 1:  # engines may differ in two params at once (repetition vs frequency penalty)
        together = {}
        for engine, params in params_by_engine.items():
            for name in differ:
                params = params.neutralised(name)
            together[engine] = params
        out[f"without {'+'.join(differ)}"] = together
    return out


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", text)


def transplant_run(outcome: RunOutcome, scenario: LoadedScenario, names: list[str], rejected: dict[str, str],
                   progress: Callable[[str, str], None]) -> TransplantOutcome:
    """outcome: the run of the reference alone; scenario: the whole scenario (every engine's spec and params)."""
    run_dir = outcome.run_dir
    spec, ref = scenario.spec, scenario.spec.reference
    case_ids = [c.case_id for c in outcome.scenario.cases]
    results = read_results(run_dir).set_index(["engine", "case_id"])
    requests = []
    for case_id in case_ids:
        row = results.loc[(ref, case_id)]
        if row["status"] == "ok" and len(row["token_ids"]):
            ids = [int(t) for t in (*row["prompt_ids"], *row["token_ids"])]
            requests.append(TraceRequest(case_id=case_id, token_ids=ids, prompt_len=len(row["prompt_ids"]),
                                         points=["logits"]))
    if not requests:
        raise ConfigError(f"the reference '{ref}' produced no tokens to transplant: see {run_dir / 'summary.md'}")
    traced, interrupted = run_engines([engine_plan(scenario, ref, run_dir, requests, op="trace")], 1, progress)
    logits = {cid: r.path for cid, r in traced[ref].results.items() if r.status == "ok"}
    out_dir = run_dir / "transplant"
    cases = {c.case_id: c for c in scenario.cases}
    jobs: dict[tuple[str | None, str], SamplingJob] = {}
    pair_variants = {(name, r.case_id): variants({ref: cases[r.case_id].engine_params[ref],
                                                  name: cases[r.case_id].engine_params[name]})
                     for name in names if name != ref for r in requests}
    for name in names:
        engine = spec.engines[name]
        items = []
        for request in requests:
            if request.case_id not in logits:
                continue
            # each engine is compared with the reference: its variants, and for the reference those of every pair
            wanted: dict[str, SamplingParams] = {}
            for (other, case_id), by_variant in pair_variants.items():
                if case_id == request.case_id and name in (other, ref):
                    wanted.update({v: by_engine[name] for v, by_engine in by_variant.items()})
            for variant, params in wanted.items():
                path = out_dir / name / f"{_safe(request.case_id)}@{_safe(variant)}.safetensors"
                items.append({"case_id": request.case_id, "variant": variant, "params": params.model_dump(),
                              "token_ids": request.token_ids, "prompt_len": request.prompt_len,
                              "logits_path": logits[request.case_id], "out_path": str(path)})
            (out_dir / name).mkdir(parents=True, exist_ok=True)
        if name in rejected:
            continue
        dtype = spec.engine_dtype(name)
        code = scenario.description(name).sampling_code(engine.options)
        model_path = models.resolve(spec.engine_model(name), dtype, str(scenario.path))
        # engines of one interpreter and sampling module share a process (three vLLM engines import vLLM once)
        job = jobs.setdefault((engine.python, code.module if code else name), SamplingJob(
            "transplant", name, code, model_path, dtype, [], engine.python, spec.engine_threads(name)))
        job.items += [{**item, "engine": name, "kwargs": code.kwargs if code else {}, "model_path": str(model_path),
                       "dtype": dtype} for item in items]
        job.engines.append(name)
    for job in jobs.values():  # a failure names every engine the job served
        job.engine = ", ".join(job.engines)
    answers = _run_jobs(list(jobs.values()))
    tokenizer = load_tokenizer(models.resolve(spec.reference_model, spec.engine_dtype(ref), str(scenario.path)))
    verdicts, steps = judge(ref, names, requests, answers, rejected, logits, lambda t: tokenizer.decode([int(t)]))
    if not steps.empty:
        write_parquet(out_dir / "steps.parquet", steps)
    write_json(out_dir / "verdicts.json", [v.model_dump() for v in verdicts])
    return TransplantOutcome(verdicts, out_dir, interrupted)


def _run_jobs(jobs: list[SamplingJob]) -> dict[str, dict[tuple[str, str], dict[str, Any]] | str]:
    """engine -> (case, variant) -> its answer, or a string saying why the engine's code could not run."""

    def one(job: SamplingJob) -> dict[str, dict[tuple[str, str], dict[str, Any]] | str]:
        try:
            answer = job.run()
        except SamplingJobFailed as exc:
            return dict.fromkeys(job.engines, str(exc))
        if "unavailable" in answer:
            return dict.fromkeys(job.engines, answer["unavailable"])
        found: dict[str, dict[tuple[str, str], dict[str, Any]] | str] = {name: {} for name in job.engines}
        for item in answer["items"]:
            found[item["engine"]][(item["case_id"], item["variant"])] = item
        return found

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {name: found for answers in pool.map(one, jobs) for name, found in answers.items()}


def _scores(item: dict[str, Any]) -> np.ndarray:
    from safetensors.numpy import load_file

    return load_file(item["path"])["scores"]


def _compare(ref_item: dict[str, Any], item: dict[str, Any]) -> pd.DataFrame:
    ref_scores, scores = _scores(ref_item), _scores(item)
    return step_metrics(distributions(ref_scores, ref_item["sampling"]), distributions(scores, item["sampling"]),
                        ref_scores, scores)


def judge(ref: str, names: list[str], requests: list[TraceRequest], answers: dict, rejected: dict[str, str],
          logits: dict[str, str], decode: Callable[[int], str]) -> tuple[list[TransplantVerdict], pd.DataFrame]:
    verdicts, frames = [], []
    for request in requests:
        case_id = request.case_id
        ref_answer = answers.get(ref)
        for name in names:
            if name == ref:
                continue
            base = dict(case_id=case_id, engine=name, reference=ref)
            problem = rejected.get(name) or (answers.get(name) if isinstance(answers.get(name), str) else None)
            if problem is None and isinstance(ref_answer, str):
                problem = f"the reference's sampling code could not run: {ref_answer}"
            if problem is not None:
                verdicts.append(TransplantVerdict(cause="rejected" if name in rejected else "unavailable",
                                                  verdict=problem, **base))
                continue
            ref_item, item = ref_answer.get((case_id, AS_GIVEN)), answers[name].get((case_id, AS_GIVEN))
            failed = [(n, i["error"]) for n, i in ((ref, ref_item), (name, item)) if i and "error" in i]
            if failed or not ref_item or not item:
                verdicts.append(TransplantVerdict(cause="error", verdict="; ".join(
                    f"{n}'s sampling code failed: {e}" for n, e in failed) or "no transplant result", **base))
                continue
            metrics = _compare(ref_item, item)
            frames.append(metrics.assign(case_id=case_id, engine=name, variant=AS_GIVEN))
            hazards = {n: i["hazards"] for n, i in ((ref, ref_item), (name, item)) if i["hazards"]}
            if hazards:
                verdicts.append(TransplantVerdict(cause="hazard", verdict=hazard_text(hazards, ref_item, item, ref,
                                                                                      name, logits[case_id],
                                                                                      request), hazards=[
                    {"engine": n, **h} for n, hs in hazards.items() for h in hs], **base))
                continue
            first = first_disagreement(metrics)
            if first is None:
                verdicts.append(TransplantVerdict(cause="agree", max_tv=float(metrics["tv"].max()), verdict=(
                    f"the samplers agree on identical logits at all {len(metrics)} steps (max total variation "
                    f"{metrics['tv'].max():.2g}): any token difference between these engines comes from their "
                    "logits, not their sampling"), **base))
                continue
            after: dict[str, int | None] = {}  # neutralised param(s) -> where the samplers then first disagree
            for variant, other in answers[name].items():
                ref_variant = ref_answer.get(variant)
                if variant[0] != case_id or variant[1] == AS_GIVEN or not ref_variant or "error" in other \
                        or "error" in ref_variant:
                    continue
                ablated = _compare(ref_variant, other)
                frames.append(ablated.assign(case_id=case_id, engine=name, variant=variant[1]))
                after[variant[1].removeprefix("without ")] = first_disagreement(ablated)
            named, later = explaining_params(after, first)
            verdicts.append(TransplantVerdict(cause="sampler", first_step=first, max_tv=float(metrics["tv"].max()),
                                              params=named, verdict=sampler_text(metrics, first, named, later,
                                                                                 ref_item, item, ref, name, decode),
                                              **base))
    return verdicts, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def explaining_params(after: dict[str, int | None], first: int) -> tuple[list[str], int | None]:
    """The params behind the first disagreement: those whose neutralising makes the samplers agree (single params
    before combinations); else those whose neutralising moves the first disagreement later, with the step the
    disagreement that is left starts at (a second cause: another param, or the logits dtype)."""
    agree = [n for n, step in after.items() if step is None]
    if agree:
        return [n for n in agree if "+" not in n] or [p for n in agree for p in n.split("+")], None
    postponed = {n: step for n, step in after.items() if step > first}
    if not postponed:
        return [], None
    single = {n: s for n, s in postponed.items() if "+" not in n} or postponed
    latest = max(single.values())
    return [p for n, s in single.items() if s == latest for p in n.split("+")], latest


def sampler_text(metrics: pd.DataFrame, first: int, named: list[str], later: int | None, ref_item: dict, item: dict,
                 ref: str, name: str, decode: Callable[[int], str]) -> str:
    row = metrics.loc[metrics["step"] == first].iloc[0]
    text = (f"on identical logits the samplers disagree from step {first} (total variation {row['tv']:.3g}; "
            f"{ref} keeps {int(row['kept_ref'])} token(s) and puts {decode(row['argmax_ref'])!r} first, {name} "
            f"keeps {int(row['kept_engine'])} and puts {decode(row['argmax_engine'])!r} first): the divergence is "
            "sampler semantics")
    if not named:
        return text + "; no single param explains it (neutralising any one of them leaves a disagreement)"
    ref_effective, effective = ref_item.get("effective", {}), item.get("effective", {})
    notes = []
    for param in named:
        ref_value, value = ref_effective.get(param), effective.get(param)
        if param == "repetition_penalty" and ref_value == value and \
                ref_effective.get("repetition_scope") != effective.get("repetition_scope"):
            notes.append(f"repetition_penalty {value} means different things: {ref} counts "
                         f"{ref_effective.get('repetition_scope')}, {name} counts {effective.get('repetition_scope')}")
        else:
            notes.append(f"{param}: {ref} applies {_value(ref_value)}, {name} {_value(value)}"
                         + (f" ({meaning(param)})" if param in PENALTIES else ""))
    how = "it" if len(named) == 1 else "them together"
    if later is None:
        return (text + f", in {' and '.join(named)}: neutralising {how} in every engine makes the samplers agree; "
                + "; ".join(notes))
    dtypes = (ref_effective.get("logits_dtype"), effective.get("logits_dtype"))
    rest = (f"the disagreement left at step {later} is not a param: {ref} samples from {dtypes[0]} logits, {name} "
            f"from {dtypes[1]} ones, which can reorder near-tied tokens" if dtypes[0] != dtypes[1] else
            f"another difference remains from step {later}")
    return (text + f", first in {' and '.join(named)}: neutralising {how} in every engine moves the first "
            f"disagreement from step {first} to step {later}; " + "; ".join(notes) + f"; {rest}")


def _value(value: Any) -> str:
    return "none" if value is None else str(value)


def hazard_text(hazards: dict[str, list[dict]], ref_item: dict, item: dict, ref: str, name: str, logits_path: str,
                request: TraceRequest) -> str:
    parts = []
    for engine, found in hazards.items():
        events = []
        for h in sorted(found, key=lambda h: h["first_step"]):
            what = h.get("error") or ", ".join(f"{h[k]} {k}" for k in ("+inf", "nan") if h.get(k)) + \
                f" values in {h.get('dtype')}"
            events.append(f"{h['op']} at step {h['first_step']} ({h['steps']} step(s)): {what}")
        parts.append(f"numerical hazard in {engine}'s sampler, its own code run on this machine's CPU: "
                     + "; then ".join(events))
    clean = [n for n in (ref, name) if n not in hazards]
    if clean:
        dtypes = {n: i.get("effective", {}).get("logits_dtype") for n, i in ((ref, ref_item), (name, item))}
        parts.append(", ".join(f"{n} (sampling in {dtypes[n]})" for n in clean) + " has none on the same logits")
    threshold = _overflow_threshold(hazards, ref_item, item, ref, logits_path, request)
    device = ("on a GPU the same inf/NaN can end differently (a CUDA sampling kernel may return a token instead of "
              "raising): `parity run` there reports what happened, as a crash or as 'hazard: silent wrong token'")
    return ". ".join(parts) + (f". {threshold}" if threshold else "") + f". {device}"


def _overflow_threshold(hazards: dict, ref_item: dict, item: dict, ref: str, logits_path: str,
                        request: TraceRequest) -> str:
    """For a temperature overflow in a low-precision dtype: the smallest temperature these logits tolerate."""
    for engine, found in hazards.items():
        dtype = (ref_item if engine == ref else item).get("effective", {}).get("logits_dtype")
        temperature = (ref_item if engine == ref else item).get("effective", {}).get("temperature")
        if dtype in DTYPE_MAX and any("temperature" in h["op"] and h.get("+inf") for h in found):
            from harness.rundir.traces import Trace

            top = float(np.max(Trace(logits_path).rows("logits", request.prompt_len - 1, len(request.token_ids) - 1)))
            return (f"{dtype} overflows above {DTYPE_MAX[dtype]:g}: with these logits (max {top:.3g}) any "
                    f"temperature below max_logit/{DTYPE_MAX[dtype]:g} = {top / DTYPE_MAX[dtype]:.3g} overflows "
                    f"(this run: {temperature})")
    return ""
