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
from harness.explain.trace_passes import TracePasses, explained_engines, noise_floor_dtype, plan_passes, trace_request
from harness.plan.plans import EnginePlan
from harness.rundir.journal import JOURNAL, read_journal
from harness.scenario.spec import LoadedScenario


def known_cases(scenario: LoadedScenario, requested: list[str] | None) -> list[str] | None:
    """The cases explain will trace, where they are known before the run's verdicts: the requested ones, or the only
    case of a one-case scenario; None when the verdicts choose them, or when one is decoded by beam search (explained
    from the beams, not traced)."""
    cases = requested or ([c.case_id for c in scenario.cases] if len(scenario.cases) == 1 else None)
    if not cases or set(cases) & set(beam_cases(scenario)):
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
        self.outcomes: dict[str, EngineOutcome] = {}
        self.interrupted = False
        self.error: BaseException | None = None
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
                    except Exception:  # noqa: BLE001 - not started: explain_run plans every pass after the run
                        self.close()  # and says what went wrong
                        self.passes = None

    def _start(self) -> None:
        scenario, ref = self.scenario, self.scenario.spec.reference
        traceable, scorable = explained_engines(scenario)
        if ref not in traceable or choice.current().name != "local":
            return
        answers, _ = read_journal(self.run_dir / "engines" / ref / JOURNAL)
        requests = [trace_request(c, answers[c].prompt_ids, answers[c].token_ids) for c in self.cases
                    if c in answers and answers[c].status == "ok"]
        if len(requests) != len(self.cases):  # explain_run says which case the reference failed
            return
        self.requests, self.beside = requests, sorted(self.running)
        busy = sum(scenario.spec.engine_threads(name) for name in self.running)
        high = noise_floor_dtype(scenario.spec.engines[ref].engine, scenario.spec.engine_dtype(ref))
        self.passes = plan_passes(scenario, self.run_dir, requests, traceable, scorable, high, self.keep_traces,
                                  self.parallel, free_threads=max(1, int(usable_cores()) - busy))
        early = [p for p in self.passes.plans if p.name in (ref, self.passes.floor_name)]
        self.names = [p.name for p in early]
        self.thread = threading.Thread(target=self._run, args=(early,), name="explain's first passes", daemon=True)
        self.thread.start()

    def _run(self, plans: list[EnginePlan]) -> None:
        try:
            self.outcomes, self.interrupted = run_engines(plans, 1, self._progress, self.recorded, self.stop)
        except BaseException as exc:  # raised again in the thread that joins
            self.error = exc

    def _progress(self, name: str, event: str) -> None:
        with self.shown:
            if self.progress is None:
                self.buffered.append((name, event))
                return
        self.progress(name, event)

    def attach(self, progress: Progress) -> None:
        """explain's progress display: the events so far, then each as it comes."""
        with self.shown:
            self.progress = progress
            events, self.buffered = self.buffered, []
        for name, event in events:
            progress(name, event)

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
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.outcomes, self.interrupted

    def close(self) -> None:
        """Stop the passes if still running (the command ends early: interrupted, or an error) and remove their
        scratch folder; explain_run, when it took them, has joined them already."""
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
        if self.passes is not None:
            self.passes.remove_scratch()
