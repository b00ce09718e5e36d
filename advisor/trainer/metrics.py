"""metrics.jsonl (records: profilers.metrics_record), per-step peak memory, and the progress
display of a training run."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

from profilers.metrics_record import MetricsRecord, encode
from profilers.rundir import write_atomically


class MetricsLog:
    """Append-only JSON lines, flushed per line so a crash loses nothing already logged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be logged again)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill: drop it
            if record.get("step", 0) <= step:
                kept.append(line)
        write_atomically(self.path, "".join(f"{line}\n" for line in kept), durable=True)

    def write(self, record: MetricsRecord) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a")  # noqa: SIM115 - kept open for the whole run
        self._file.write(encode(record) + "\n")
        self._file.flush()

    def sync(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class PeakMemory:
    """Peak memory of each optimizer step.

    CUDA: the caching allocator's ``max_memory_allocated`` (tensor memory, what the planner
    predicts). CPU: the process's resident-set high-water mark (``VmHWM``), reset before each
    step through ``/proc/self/clear_refs``; it includes the Python runtime and libraries (0.4-1
    GB above tensor memory on a typical CPU run) and is the honest number available without
    slowing the step down with allocator tracing. Where ``clear_refs`` is unavailable it falls
    back to the lifetime maximum RSS.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "cuda_max_allocated" if device.type == "cuda" else "cpu_peak_rss"
        self._clear_refs = device.type == "cpu" and self._try_clear_refs()
        if device.type == "cpu" and not self._clear_refs:
            self.kind = "cpu_max_rss_lifetime"

    @staticmethod
    def _try_clear_refs() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # 5: reset the peak RSS (Linux >= 4.0)
            return PeakMemory._vm_hwm() is not None
        except OSError:
            return False

    @staticmethod
    def _vm_hwm() -> int | None:
        from profilers.memory_truth import resident_peak_bytes

        return resident_peak_bytes()

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._clear_refs:
            self._try_clear_refs()

    def read(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        if self._clear_refs:
            value = self._vm_hwm()
            if value is not None:
                return value
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _fmt_rate(tokens_per_s: float) -> str:
    if tokens_per_s >= 1e6:
        return f"{tokens_per_s / 1e6:.2f}M tok/s"
    if tokens_per_s >= 1e3:
        return f"{tokens_per_s / 1e3:.1f}k tok/s"
    return f"{tokens_per_s:.0f} tok/s"


def _fmt_duration(seconds: float) -> str:
    """``42s``, ``12m05s``, ``3h07m``, ``11d13h``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Progress:
    """A rich progress bar on a terminal; otherwise a plain line for the first step, every
    ``log_every`` steps (a twentieth of the run), the last step, and at least once a
    ``heartbeat_s`` (a long run's twentieth can be hours apart), each with the time left."""

    heartbeat_s = 60.0

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        sink: Callable[[str], None] | None = None,
    ) -> None:
        self.total, self.enabled = total_steps, enabled
        self.start = start_step
        self.stream = stream or sys.stderr
        # A caller's callback takes the plain lines (no bar) instead of the stream.
        self.sink = sink
        self.interactive = enabled and sink is None and self.stream.isatty()
        self.log_every = max(1, total_steps // 20)
        self.eval_loss: float | None = None
        self.eval_loss_step = -1
        self._bar: Any = None
        self._started = time.perf_counter()
        self._last_line = self._started
        if self.interactive:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._bar.add_task(
                "train", total=total_steps, completed=start_step, status=""
            )
            self._bar.start()

    def _status(self, loss: float, tokens_per_s: float) -> str:
        parts = [f"loss {loss:.4f}" if math.isfinite(loss) else f"loss {loss}"]
        if self.eval_loss is not None:
            parts.append(f"eval {self.eval_loss:.4f}")
        parts.append(_fmt_rate(tokens_per_s))
        return "  ".join(parts)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        status = self._status(loss, tokens_per_s)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)
            return
        now = time.perf_counter()
        due = step % self.log_every == 0 or step in (self.start + 1, self.total)
        if due or now - self._last_line >= self.heartbeat_s:
            elapsed = now - self._started
            left = ""
            if step < self.total:
                remaining = elapsed / max(1, step - self.start) * (self.total - step)
                left = f", {_fmt_duration(remaining)} left"
            self._line(f"step {step}/{self.total}  {status}  {_fmt_duration(elapsed)}{left}")
            self._last_line = now

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            self._line(text)

    def _line(self, text: str) -> None:
        if self.sink is not None:
            self.sink(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
