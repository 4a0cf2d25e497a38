"""explain's first passes started while the run still goes: the reference's traced pass and the noise floor.

When the cases to explain are known before the verdicts (--case, or a scenario of one case), nothing but the
reference's answer stands between its run and its traced pass: the pass starts in the reference's worker, its model
still loaded, as soon as the reference has answered every case, while slower engines still load and generate
(Gemma 3 at 1,500 positions on 2 cores: HF answers 8 s before vLLM ends). The floor follows it in that worker. The
other engines' passes start after the run, as before, and wait for the reference's trace through the results both
calls share (EnginePlan.after, harness.executors.engine_runs.Recorded).
"""

from __future__ import annotations

import threading
from pathlib import Path

from harness.compare.beam_rules import beam_cases
from harness.core.types import TraceRequest
from harness.executors import choice
from harness.executors.engine_runs import EngineOutcome, Progress, Recorded, run_engines
from harness.executors.start_next import usable_cores
from harness.plan.plans import EnginePlan
from harness.run.trace_passes import TracePasses, explained_engines, noise_floor_dtype, plan_passes, trace_request
from harness.rundir.journal import JOURNAL, read_journal
from harness.scenario.spec import LoadedScenario


def known_cases(scenario: LoadedScenario, requested: list[str] | None) -> list[str] | None:
    """The cases explain will trace, where they are known before the run's verdicts: the requested ones, or the only
    case of a one-case scenario; None when the verdicts choose them, when one is decoded by beam search (explained
    from the beams, not traced), or when the run's drift verdicts take the reference's loaded model after the run
    (its passes would then load it a second time)."""
    cases = requested or ([c.case_id for c in scenario.cases] if len(scenario.cases) == 1 else None)
    spec = scenario.spec
    drifting = {name for name in spec.engines if spec.drift_baseline(name) in spec.engines}
    drift_passes = drifting | {spec.drift_baseline(name) for name in drifting}  # (harness.run.drift_passes)
    if not cases or set(cases) & set(beam_cases(scenario)) or spec.reference in drift_passes:
        return None
    return cases


class EarlyPasses:
    """Watches a run (its start and its engines' progress events) and starts the reference's traced pass and the
    noise floor's in a thread of their own once the reference has answered. explain_run then takes the plans made
    (passes), runs the others beside them, and joins them (join)."""

    def __init__(self, cases: list[str], parallel: int, keep_traces: bool):
        self.cases, self.parallel, self.keep_traces = cases, parallel, keep_traces
        self.scenario: LoadedScenario | None = None
        self.run_dir: Path | None = None
        self.running: set[str] = set()  # the run's engines that have started and not finished
        self.recorded = Recorded()  # shared with the passes explain_run runs (they wait for the reference's trace)
        self.stop = threading.Event()
        self.passes: TracePasses | None = None  # once started
        self.requests: list[TraceRequest] = []  # the traced cases, from the reference's journal
        self.names: list[str] = []  # the plans started here
        self.beside: list[str] = []  # the run's engines still going when they started
        self.thread: threading.Thread | None = None
        self.ended = threading.Event()  # set when the thread's passes have ended
        self.outcomes: dict[str, EngineOutcome] = {}
        self.interrupted = False
        self.error: BaseException | None = None
        self.not_started = ""  # why the passes could not start during the run (a fault of the harness), for a note
        self.lock = threading.Lock()  # the run's events
        self.shown = threading.Lock()  # the passes' events, kept until explain's display is attached
        self.buffered: list[tuple[str, str]] = []
        self.progress: Progress | None = None

    def started(self, scenario: LoadedScenario, run_dir: Path) -> None:
        """The run's scenario (narrowed to what runs) and directory."""
        self.scenario, self.run_dir = scenario, run_dir

    def event(self, label: str, event: str) -> None:
        """A progress event of the run (from its engines' threads): the reference's end starts the passes."""
        with self.lock:
            if event == "loading":
                self.running.add(label)
            elif event == "done":
                self.running.discard(label)
                if self.scenario is not None and label == self.scenario.spec.reference and self.passes is None:
                    try:
                        self._start()
                    except Exception as exc:  # noqa: BLE001 - in an engine's thread of the run: not started, every
                        self.close()  # pass runs after the run instead, and explain notes why
                        self.passes, self.not_started = None, f"{type(exc).__name__}: {exc}"

    def _start(self) -> None:
        scenario, ref = self.scenario, self.scenario.spec.reference
        traceable, scorable = explained_engines(scenario)
        if ref not in traceable or len(self.running) >= self.parallel:
            return  # (the command's engines at once are running already)
        pool = choice.current().workers  # None on a Ray cluster: no worker outlives its engine there
        if pool is None or not pool.holds(scenario.engine(ref).load_key):
            return  # its model is not kept loaded: it was stopped (Ctrl-C), or memory is short
        answers, _ = read_journal(self.run_dir / "engines" / ref / JOURNAL)
        requests = [trace_request(c, answers[c].prompt_ids, answers[c].token_ids) for c in self.cases
                    if c in answers and answers[c].status == "ok"]
        if len(requests) != len(self.cases):  # explain_run says which case the reference failed
            return
        self.requests, self.beside = requests, sorted(self.running)
        # an invariance configuration runs under its engine's name and a suffix (harness.plan.invariance_checks)
        busy = sum(scenario.spec.engine_threads(label.split("~", 1)[0]) for label in self.running)
        high = noise_floor_dtype(scenario.spec.engines[ref].engine, scenario.spec.engine_dtype(ref))
        self.passes = plan_passes(scenario, self.run_dir, requests, traceable, scorable, high, self.keep_traces,
                                  self.parallel, free_threads=max(1, int(usable_cores()) - busy))
        early = [p for p in self.passes.plans if p.name in (ref, self.passes.floor_name)]
        self.names = [p.name for p in early]
        thread = threading.Thread(target=self._run, args=(early,), name="explain's first passes", daemon=True)
        thread.start()
        self.thread = thread

    def _run(self, plans: list[EnginePlan]) -> None:
        try:
            self.outcomes, self.interrupted = run_engines(plans, 1, self._progress, self.recorded, self.stop)
        except BaseException as exc:  # raised again in the thread that joins
            self.error = exc
        finally:
            self.ended.set()

    def _progress(self, name: str, event: str) -> None:
        with self.shown:
            if self.progress is None:
                self.buffered.append((name, event))
                return
        self.progress(name, event)

    def attach(self, progress: Progress) -> None:
        """explain's progress display: the events so far, then each as it comes."""
        with self.shown:  # replayed before any later event can be shown
            self.progress = progress
            for name, event in self.buffered:
                progress(name, event)
            self.buffered = []

    def matches(self, requests: list[TraceRequest]) -> bool:
        """Whether the passes started here trace exactly these requests (explain_run's, from the judged run)."""
        return self.passes is not None and [(r.case_id, r.token_ids) for r in requests] == [
            (r.case_id, r.token_ids) for r in self.requests]

    def join(self, abort: bool = False) -> tuple[dict[str, EngineOutcome], bool]:
        """The passes' outcomes once they have ended (abort: stop them first) and whether they were interrupted."""
        if self.thread is None:
            return {}, False
        if abort:
            self.stop.set()
        try:
            self.ended.wait()
        except KeyboardInterrupt:  # Ctrl-C while waiting: the passes stop, what they finished is kept (an event,
            self.stop.set()  # not Thread.join: a join Ctrl-C interrupted may return at once the next time)
            self.ended.wait()
        if self.error is not None:
            raise self.error
        return self.outcomes, self.interrupted

    def close(self, abort: bool = True) -> None:
        """Stop the passes if still running (abort: the command ends early, interrupted or failing; else let them
        end) and remove their scratch folder; explain_run, when it took them, has joined them already."""
        if self.thread is not None:
            if abort:
                self.stop.set()
            self.ended.wait()
        if self.passes is not None:
            self.passes.remove_scratch()
