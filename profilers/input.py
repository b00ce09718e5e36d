"""Input-pipeline probe: how fast the real data loader delivers batches at several ``num_workers``.

Compared with the model's consumption rate (tokens/s of the fastest measured step) it tells
whether a config would be input-bound, and which ``num_workers`` suffices. Worker start-up is
excluded from the rate: its clock starts after the first batch arrives, as in a long training
run. It is not excluded from the budget: the settings share one deadline, so a slow worker
start-up shortens the settings after it (and a setting reached past the deadline is skipped)
instead of running the profile over its ``--budget-s``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from profilers.profile_record import InputSample
from profilers.workload import DataWorkload, StepSpec


def measure_loader(
    workload: DataWorkload,
    spec: StepSpec,
    num_workers: int,
    *,
    num_batches: int = 40,
    budget_s: float = 5.0,
    deadline: float | None = None,
) -> InputSample:
    """Batches/s of ``workload``'s loader (after the first batch), within ``budget_s`` and
    before ``deadline`` (a ``time.perf_counter()`` value; a first batch that arrives after it
    gives a skipped sample)."""
    batches = iter(workload.data_batches(spec, num_workers, num_batches + 1))
    next(batches)  # worker start-up and the first fetch: not steady state
    start = time.perf_counter()
    stop = start + budget_s if deadline is None else min(start + budget_s, deadline)
    if start >= stop:
        return _sample(spec, num_workers, status="skipped", reason=START_UP_TOOK_IT)
    count = 0
    for _ in batches:
        count += 1
        if time.perf_counter() > stop:
            break
    elapsed = time.perf_counter() - start
    return _sample(spec, num_workers, batches_per_s=count / elapsed if elapsed > 0 else 0.0)


# A setting reached (or whose first batch arrived) after the input phase's deadline.
START_UP_TOOK_IT = "time budget spent (worker start-up and the settings before it took it)"


def _sample(
    spec: StepSpec,
    num_workers: int,
    *,
    batches_per_s: float = 0.0,
    status: str = "ok",
    reason: str = "",
) -> InputSample:
    return InputSample(
        num_workers=num_workers,
        micro_batch_size=spec.micro_batch_size,
        seq_len=spec.seq_len,
        batches_per_s=batches_per_s,
        status=status,
        reason=reason,
    )


def probe_input(
    workload: DataWorkload, spec: StepSpec, worker_counts: Sequence[int], *, budget_s: float = 10.0
) -> list[InputSample]:
    """One :class:`InputSample` per worker count, within ``budget_s`` in all, start-ups included:
    each setting gets an equal part of what is left when it starts."""
    out = []
    deadline = time.perf_counter() + budget_s
    for index, workers in enumerate(worker_counts):
        left = deadline - time.perf_counter()
        if left <= 0:
            out.append(_sample(spec, workers, status="skipped", reason=START_UP_TOOK_IT))
            continue
        per = left / (len(worker_counts) - index)
        try:
            out.append(measure_loader(workload, spec, workers, budget_s=per, deadline=deadline))
        except Exception as exc:  # a broken loader is a finding, not a crash of the profile
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            out.append(_sample(spec, workers, status="error", reason=reason))
    return out
