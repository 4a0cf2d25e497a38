"""`parity run --resume RUN_DIR`: continue a run that was interrupted (Ctrl-C, the harness, a worker or a server
killed) in its own directory.

The scenario is the text run.json recorded when the run started, with the engines and cases it selected; the prompts
must tokenise to the ids it recorded. Successful results in the engines' journals are reused; engine errors and
missing cases are run again, by whatever executes plans (plans carry only the missing requests). The run then ends
as a run that was never interrupted would: the same results, steps, verdicts and summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import ConfigError
from harness.executors.engine_runs import Progress
from harness.plan.requests import all_plans, reusable
from harness.run.execute import Selection, pending_run, run_pending, runnable, tokenized
from harness.rundir.journal import JOURNAL, read_journal, rewrite_journal
from harness.rundir.store import read_meta, run_lock, write_meta
from harness.scenario.spec import LoadedScenario, load

if TYPE_CHECKING:
    from harness.run.outcome import RunOutcome


def resume(run_dir: Path, parallel: int | None, progress: Progress,
           on_start: Callable[[LoadedScenario, Path, int, int], None]) -> RunOutcome:
    """on_start(scenario, run_dir, results reused, damaged journal lines skipped) is called before engines start."""
    prepare_started = time.perf_counter()
    meta = read_meta(run_dir)
    if meta.selection is None:
        raise ConfigError(f"{run_dir}: this run was written by a version without --resume: run the scenario again")
    with run_lock(run_dir):
        try:
            scenario = load(Path(meta.scenario), text=meta.scenario_text)
        except ConfigError as exc:  # the copy in run.json, not the file it names, is what failed to load
            raise ConfigError(f"{run_dir / 'run.json'}: scenario_text: the scenario the run started with does not "
                              f"load ({exc.message}): run the scenario again") from None
        selection = Selection(engines=meta.selection.engines, cases=meta.selection.cases)
        scenario, _ = runnable(scenario, selection)
        prompts = tokenized(scenario)  # the warnings: those the run started with, in its meta
        tokenizer, prompt_ids = prompts.tokenizer, prompts.prompt_ids
        if prompt_ids != meta.prompt_ids:
            raise ConfigError(f"{run_dir}: the prompts no longer tokenise to the ids the run started with (a prompt "
                              "file or the model's tokenizer changed): run the scenario again")
        done, damaged = {}, 0
        for plan in all_plans(scenario, run_dir, prompt_ids, tokenizer)[0]:
            journaled, skipped = read_journal(plan.workdir / JOURNAL)
            kept = reusable(plan, journaled)
            rewrite_journal(plan.workdir, kept)
            done.update({(plan.name, case): result for case, result in kept.items()})
            damaged += skipped
        meta = meta.model_copy(update={"status": "running",
                                       "resumed": [*meta.resumed, time.strftime("%Y-%m-%dT%H:%M:%S%z")]})
        write_meta(run_dir, meta)
        on_start(scenario, run_dir, len(done), damaged)
        return run_pending([pending_run(scenario, run_dir, meta, tokenizer, done, prepare_started)], parallel,
                           progress)[0]
