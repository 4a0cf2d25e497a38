"""What the CLI prints: tables that never cut a cell, and a progress bar per engine worker.

On a terminal, tables are rich tables that fold long cells within the width. Anywhere else (CI logs, `| cat`, a
file) they are Markdown pipe tables with every cell printed whole on one line, so nothing is truncated or wrapped
mid-word and a log can be pasted into a report as it is.
"""

from __future__ import annotations

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


class EngineProgress:
    """A rich progress bar per engine worker: its state (loading, ready, done) and cases finished."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=err_console, transient=False,
                             disable=not err_console.is_terminal)
        self.tasks: dict[str, int] = {}

    def start(self, names: list[str], total: int) -> None:
        for name in names:
            self.tasks[name] = self.bars.add_task(f"{name}: waiting", total=total)
        self.bars.start()

    def event(self, name: str, event: str) -> None:
        if name not in self.tasks:
            return
        if event == "case":
            self.bars.advance(self.tasks[name])
        else:
            self.bars.update(self.tasks[name], description=f"{name}: {event}")

    def stop(self) -> None:
        self.bars.stop()
