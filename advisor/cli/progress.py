"""A progress display for budgeted work: what runs now, and how much of the budget is spent."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ProgressFn = Callable[[str, float], None]


@contextmanager
def budget_progress(title: str, *, enabled: bool = True) -> Iterator[ProgressFn | None]:
    """Yield a ``(message, fraction)`` callback: a rich bar on a terminal, plain lines otherwise."""
    if not enabled:
        yield None
        return
    if not sys.stderr.isatty():
        started = time.perf_counter()

        def plain(message: str, fraction: float) -> None:
            print(
                f"[{title} {time.perf_counter() - started:5.0f}s] {message}",
                file=sys.stderr,
                flush=True,
            )

        yield plain
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"[bold]{title}"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=Console(file=sys.stderr),
        transient=False,
    ) as bar:
        task = bar.add_task("", total=1.0)

        def rich_update(message: str, fraction: float) -> None:
            bar.update(task, completed=fraction, description=message)

        yield rich_update
        bar.update(task, completed=1.0)
