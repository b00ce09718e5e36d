"""Input-pipeline probe: how fast the real data loader delivers batches at several ``num_workers``.

Compared with the model's consumption rate (tokens/s of the fastest measured step) it tells
whether a config would be input-bound, and which ``num_workers`` suffices. Worker start-up is
excluded: the clock starts after the first batch arrives, as in a long training run.
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
) -> InputSample:
    """Batches/s of ``workload``'s loader (after the first batch), within ``budget_s``."""
    batches = iter(workload.data_batches(spec, num_workers, num_batches + 1))
    next(batches)  # worker start-up and the first fetch: not steady state
    start = time.perf_counter()
    count = 0
    for _ in batches:
        count += 1
        if time.perf_counter() - start > budget_s:
            break
    elapsed = time.perf_counter() - start
    return InputSample(
        num_workers=num_workers,
        micro_batch_size=spec.micro_batch_size,
        seq_len=spec.seq_len,
        batches_per_s=count / elapsed if elapsed > 0 else 0.0,
    )


def probe_input(
    workload: DataWorkload, spec: StepSpec, worker_counts: Sequence[int], *, budget_s: float = 10.0
) -> list[InputSample]:
    """One :class:`InputSample` per worker count, sharing ``budget_s``."""
    out = []
    per = budget_s / max(1, len(worker_counts))
    for workers in worker_counts:
        try:
            out.append(measure_loader(workload, spec, workers, budget_s=per))
        except Exception as exc:  # a broken loader is a finding, not a crash of the profile
            out.append(
                InputSample(
                    num_workers=workers,
                    micro_batch_size=spec.micro_batch_size,
                    seq_len=spec.seq_len,
                    batches_per_s=0.0,
                    status="error",
                    reason=f"{type(exc).__name__}: {' '.join(str(exc).split())}",
                )
            )
    return out
