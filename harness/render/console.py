"""What the CLI prints: tables that never cut a cell, and a progress bar per engine worker.

On a terminal, tables are rich tables that fold long cells within the width. Anywhere else (CI logs, `| cat`, a
file) they are Markdown pipe tables with every cell printed whole on one line, so nothing is truncated or wrapped
mid-word and a log can be pasted into a report as it is.
"""

from __future__ import annotations

import os
import threading
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def print_table(title: str, headers: list[str], rows: list[list[str]], styles: list[list[str]] | None = None,
                out: Console = console) -> None:
    """rows: plain-text cells (never markup); styles: an optional rich style per cell, used on a terminal."""
    if not out.is_terminal:
        out.print(title, markup=False, highlight=False)
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(" ".join(cell.split()).replace("|", "\\|") for cell in row) + " |"
                  for row in rows]
        for line in lines:
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(title=title)
    for header in headers:
        table.add_column(header, overflow="fold")
    for i, row in enumerate(rows):
        cells = [Text(cell) for cell in row]
        for cell, style in zip(cells, (styles or [[]] * len(rows))[i] or [""] * len(row), strict=False):
            if style:
                cell.stylize(style)
        table.add_row(*cells)
    out.print(table)


PROGRESS_ENV = "LLM_PARITY_PROGRESS_S"  # seconds between plain progress lines when stderr is not a terminal


class EngineProgress:
    """Progress per engine worker: its state (loading, ready, done), cases finished, their rate since the engine
    was ready and the time left at that rate. On a terminal, a rich bar per engine; anywhere else (CI logs, a pipe),
    a plain line per unfinished engine every LLM_PARITY_PROGRESS_S seconds (default 10), never a carriage return,
    and nothing at all for a run shorter than that."""

    def __init__(self, interval: float | None = None):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.plain = not err_console.is_terminal
        self.interval = interval if interval is not None else float(os.environ.get(PROGRESS_ENV) or 10)
        self.bars = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                             console=err_console, transient=False, disable=self.plain)
        self.tasks: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.ready_at: dict[str, float] = {}
        self.states: dict[str, str] = {}
        self.total = 0
        self.last_line = time.monotonic()
        self.lock = threading.Lock()

    def start(self, names: list[str], total: int) -> None:
        with self.lock:
            for name in names:
                self.tasks[name] = self.bars.add_task(f"{name}: waiting", total=total, rate="")
                self.counts[name], self.states[name] = 0, "waiting"
            self.total = total
            self.last_line = time.monotonic()
        self.bars.start()

    def event(self, name: str, event: str) -> None:
        if name not in self.tasks:
            return
        with self.lock:
            now = time.monotonic()
            if event == "case":
                self.counts[name] += 1
                self.bars.update(self.tasks[name], advance=1, rate=self._rate(name, now))
            else:
                self.states[name] = event
                if event == "ready":
                    self.ready_at.setdefault(name, now)
                self.bars.update(self.tasks[name], description=f"{name}: {event}")
            if self.plain and now - self.last_line >= self.interval:
                self.last_line = now
                for line in self.lines(now):
                    err_console.print(line, markup=False, highlight=False)

    def _rate(self, name: str, now: float) -> str:
        began = self.ready_at.get(name)
        done = self.counts[name]
        return f"{done / (now - began):.3g} cases/s" if began is not None and done and now > began else ""

    def lines(self, now: float) -> list[str]:
        """One plain line per engine still at work: cases done, rate and time left at that rate."""
        out = []
        for name, done in self.counts.items():
            if self.states[name] == "done" or done >= self.total:
                continue
            rate = self._rate(name, now)
            left = ""
            if rate:
                seconds = (self.total - done) * (now - self.ready_at[name]) / done
                left = f", {rate}, about {_duration(seconds)} left"
            out.append(f"progress {name}: {self.states[name]}, {done}/{self.total} cases{left}")
        return out

    def stop(self) -> None:
        self.bars.stop()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
