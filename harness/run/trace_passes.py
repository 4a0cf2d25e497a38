"""The traced passes of `parity explain`, planned so that the traces cost what the answer needs.

The reference traces each case in full (every point, every position) into a scratch folder, in memory where the
machine has room (/dev/shm), deleted when the explain ends. Every other traced engine, and the reference in higher
precision (the noise floor), waits for the reference's trace of a case (EnginePlan.after) and compares its own pass
with it as it is captured (TraceRequest.against, adapters.tracing.comparing_writer): it writes per-position metrics
and the logits rows only, into the scratch folder too. The run directory then gets the answer's tables and a pruned
trace per engine (harness.explain.kept_rows). A Gemma 3 pass of 1,500 positions is 1.45 GB of rows in float32, 2.9
GB in float64; compared, it is a few megabytes.

--keep-traces keeps everything (each trace whole in the run directory, as the engines capture it). On an executor
whose workers may not see this machine's files (Ray), the traces are written whole and compared here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from adapters import registry
from harness.core.types import TraceRequest
from harness.executors import choice
from harness.executors.start_next import usable_cores
from harness.plan.plans import EnginePlan, LoadKey, engine_plan
from harness.rundir.traces import trace_file_name
from harness.scenario.spec import LoadedScenario

FLOOR_DTYPE = {"float32": "float64", "bfloat16": "float32", "float16": "float32"}
RAM_FOLDER = Path("/dev/shm")
RAM_NEEDED = 4 << 30  # free bytes a RAM folder must have to hold the scratch traces (else they go to the run dir)

FORCED = "@forced"  # plan-name suffix of an untraced engine's teacher-forced scoring pass
FREE = "@free"  # plan-name suffix of a layer-forced engine's free pass (its own layers' outputs): its logits only


@dataclass
class TracePasses:
    plans: list[EnginePlan]
    floor_name: str | None
    scratch: Path | None  # where the passes write, removed afterwards; None: the engines' traces folders
    compared: bool  # the engines compared with the reference's trace as they captured (else here, afterwards)
    forced: list[str] = field(default_factory=list)  # the engines whose layers start from the reference's input
    free_floor_name: str | None = None  # the floor of the engines that run their layers free, where some do

    def reference_trace(self, reference: str, case_id: str) -> Path | None:
        """Where the reference's full trace of a case is, in the scratch folder (None: in its traces folder)."""
        return self.scratch / reference / trace_file_name(case_id) if self.scratch else None

    def remove_scratch(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def explained_engines(scenario: LoadedScenario) -> tuple[list[str], list[str]]:
    """The engines explain traces (per-layer capture) and those it scores instead (teacher-forced top-k logprobs)."""
    traceable = [n for n in scenario.spec.engines if scenario.description(n).capabilities.traces]
    scorable = [n for n in scenario.spec.engines if n not in traceable
                and scenario.description(n).capabilities.scores]
    return traceable, scorable


def forced_engines(scenario: LoadedScenario, traceable: list[str]) -> list[str]:
    """The traced engines whose layers a pass can start from the reference's input (adapters.tracing.forcing): the
    engine can, and its architecture map for the engine's model has per-layer taps. None unless the reference can
    (its trace holds the inputs the others are fed)."""
    from adapters.tracing.arch_maps import BUILTIN, arch_map
    from adapters.tracing.forcing import LayerInputs

    def can(name: str) -> bool:
        description = scenario.description(name)
        if not description.capabilities.forced_layers:
            return False
        if description.name not in BUILTIN:  # mapped by the engine itself (llama.cpp's graph maps)
            return True
        model_type = json.loads((scenario.engine(name).model_folder / "config.json").read_text()).get("model_type", "")
        return not LayerInputs.possible(arch_map(description.name, model_type))

    able = [name for name in traceable if can(name)]
    return able if scenario.spec.reference in able else []


def noise_floor_dtype(reference_engine: str, dtype: str) -> str | None:
    """The higher precision the reference runs in for the noise floor; None when that engine cannot run it."""
    higher = FLOOR_DTYPE[dtype]
    return higher if higher in registry.describe(reference_engine).capabilities.dtypes else None


def trace_request(case_id: str, prompt_ids: list[int], token_ids: list[int]) -> TraceRequest:
    """A case's traced pass: the prompt and the reference's generated tokens, fed to every engine at once."""
    return TraceRequest(case_id=case_id, token_ids=[int(t) for t in (*prompt_ids, *token_ids)],
                        prompt_len=len(prompt_ids))


def loads_reused(scenario: LoadedScenario, traceable: list[str], scorable: list[str]) -> list[LoadKey]:
    """The configurations explain's passes take from the scenario's run, once per pass that may take it: the
    reference's traced pass; every other traced engine's pass, its free pass where that one is layer-forced, and its
    second, partial one (harness.explain.kept_rows); every scoring pass. The noise floor may then load in the
    reference's worker, which its pass leaves unloaded."""
    ref = scenario.spec.reference
    forced = forced_engines(scenario, traceable) if choice.current().name == "local" else []
    return [scenario.engine(name).load_key for name in (*traceable, *scorable)
            for _ in range(1 if name == ref or name not in traceable else 3 if name in forced else 2)]


def scratch_folder(run_dir: Path) -> Path:
    """A new folder for the passes' transient files: in memory (/dev/shm) when it has room, else in the run
    directory (deleted all the same)."""
    try:
        stats = os.statvfs(RAM_FOLDER)
        room = stats.f_bavail * stats.f_frsize >= RAM_NEEDED and os.access(RAM_FOLDER, os.W_OK)
    except OSError:
        room = False
    parent = RAM_FOLDER if room else run_dir / "explain"
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="llm-parity-traces-", dir=parent))


def reference_threads(scenario: LoadedScenario, parallel: int) -> int:
    """Threads the reference's passes may use: the command's whole budget (`parallel` engines of the scenario's
    threads each, at most the cores this process may use), never fewer than the reference's own. Every traced engine
    waits for the reference's pass (scoring passes, which do not, run beside it); the noise floor's float64 pass, twice
    the reference's work, outlasts the passes beside it. Gemma 3 at 1,500 positions on 2 cores: the reference's pass
    6.0 to 4.1 s, the floor's ends 2.3 s sooner (oversubscribed beside vLLM's pass, then alone)."""
    budget = min(int(usable_cores()), parallel * scenario.spec.threads)
    return max(1, scenario.spec.engine_threads(scenario.spec.reference), budget)


def plan_passes(scenario: LoadedScenario, run_dir: Path, requests: list[TraceRequest], traceable: list[str],
                scorable: list[str], floor_dtype: str | None, keep_traces: bool, parallel: int,
                free_threads: int | None = None, free_passes: bool = True) -> TracePasses:
    """The plans of explain's passes: the traceable engines', the scorable ones' (teacher-forced top-k logprobs),
    and the noise floor's (the reference in floor_dtype); `parallel` engines run at once. free_threads: the threads
    the reference's pass may take now (its pass starts while the run's other engines still go:
    harness.explain.early_passes). free_passes: a forced engine's free logits pass too (the readings at the
    divergent step; the run's near-tie checks need none)."""
    ref = scenario.spec.reference
    compared = choice.current().name == "local"
    threads = reference_threads(scenario, parallel) if compared else None
    scratch = scratch_folder(run_dir) if compared and not keep_traces else None
    floor_name = f"{ref}@{floor_dtype}" if floor_dtype else None
    forced = forced_engines(scenario, traceable) if compared else []
    free_floor = f"{floor_name}-free" if floor_name and forced and set(traceable) - set(forced) else None
    passes = TracePasses([], floor_name, scratch, compared, forced, free_floor)

    def reference_trace(case_id: str) -> str:
        return str(passes.reference_trace(ref, case_id) or run_dir / "engines" / ref / "traces" /
                   trace_file_name(case_id))

    def against(name: str, keep: list[str] | None, layers_forced: bool = False) -> list[TraceRequest]:
        if not compared:
            return requests
        return [r.model_copy(update={"against": reference_trace(r.case_id),
                                     "inputs_from": reference_trace(r.case_id) if layers_forced else None,
                                     "keep": None if keep_traces else keep,
                                     "trace_dir": str(scratch / name) if scratch else None}) for r in requests]

    ref_threads = max(scenario.spec.engine_threads(ref), min(threads, free_threads)) if threads and free_threads \
        else threads
    ref_requests = [r.model_copy(update={"trace_dir": str(scratch / ref) if scratch else None,
                                         "threads": ref_threads}) for r in requests]
    passes.plans.append(engine_plan(scenario, ref, run_dir, ref_requests, op="trace"))
    for name in traceable:
        if name == ref:
            continue
        plan = engine_plan(scenario, name, run_dir, against(name, ["logits"], name in forced), op="trace")
        passes.plans.append(replace(plan, after=ref) if compared else plan)
        if name in forced and free_passes:  # the logits of its own layers' outputs, for the readings at the
            # divergent step
            free = [r.model_copy(update={"points": ["logits"]}) for r in against(name + FREE, ["logits"])]
            plan = engine_plan(scenario, name, run_dir, free, op="trace", plan_name=name + FREE)
            passes.plans.append(replace(plan, after=name, after_done=True))  # in the worker its forced pass leaves
    passes.plans += [engine_plan(scenario, n, run_dir, requests, op="score", plan_name=n + FORCED) for n in scorable]
    for name, layers_forced in ((floor_name, bool(forced)), (free_floor, False)):
        if not (floor_dtype and name):
            continue
        floor_requests = [r.model_copy(update={"threads": threads}) for r in against(name, [], layers_forced)]
        # the run's own weights (rounded to its dtype in memory), computed in the higher precision
        plan = engine_plan(scenario, ref, run_dir, floor_requests, op="trace", plan_name=name,
                           compute_dtype=floor_dtype)
        # after the reference's pass, in its worker: a worker that has imported the engine loads the floor's model in
        # a fraction of a new process's start (SmolLM2: 0.7 s against 5 s; explain / run 1.2x against 1.38x at 128
        # positions), and no second process holds a model in float64 (Gemma 3: 3.8 GB). A worker of its own, started
        # at once behind the reference's pass, was no faster at 1,500 positions on 2 cores (57.5 s against 55.1 s).
        passes.plans.append(replace(plan, after=ref, after_done=True) if compared else plan)
    return passes
