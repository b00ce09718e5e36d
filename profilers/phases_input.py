"""The input phase: how fast the workload's own data loader delivers batches per num_workers.

Runs last, in a child (a loader starts worker processes), at the largest micro-batch the
throughput phase timed (4 when none was); a workload without a data loader is a skipped row.
"""

from __future__ import annotations

import time
from typing import Any

from profilers import probe_rows
from profilers.probe_run import ProbeRun
from profilers.profile_record import InputSample
from profilers.workload import DataWorkload, StepSpec

# Under this share there is no time to start the child at all: recorded as skipped.
MIN_INPUT_SHARE_S = 2
# What the loader gets to deliver batches even when the child's start-up ate its share: the
# last phase may overrun a little rather than measure nothing.
MIN_INPUT_BUDGET_S = 1.0
# The loader's clock starts after its first batch (profilers.input): worker start-up and the
# first fetch, once per num_workers setting, come on top of its budget, as does the child's own
# start-up; the margin lets them finish before a healthy probe is killed.
INPUT_TIMEOUT_MARGIN_S = 30


def input_phase(run: ProbeRun, micro_batch: int) -> list[InputSample]:
    """Loader throughput at each of ``options.input_workers``, a row per setting."""
    share = run.clock.share("input")
    if not isinstance(run.workload, DataWorkload):
        run.rows.append(probe_rows.skipped("input", None, "no data loader"))
        return []
    if not run.options.input_workers:
        run.rows.append(probe_rows.skipped("input", None, "no num_workers setting asked for"))
        return []
    if share < MIN_INPUT_SHARE_S:
        reason = run.clock.drop_reasons.get("input", "time budget spent")
        run.rows.append(probe_rows.skipped("input", None, reason))
        return []
    spec = run.spec("fp32", "none", micro_batch)
    run.clock.say(f"input: data loader at num_workers {run.options.input_workers}")
    outcome = run.isolated(
        _input_child,
        run.workload,
        spec,
        run.options.input_workers,
        time.time() + share,  # wall clock: the child's start-up (imports) comes out of the share
        timeout_s=share + INPUT_TIMEOUT_MARGIN_S,
    )
    if not outcome.ok:
        run.rows.append(probe_rows.failed("input", spec, outcome))
        return []
    samples = [InputSample.from_dict(d) for d in outcome.value]
    for s in samples:
        run.rows.append(
            probe_rows.row(
                "input",
                spec,
                s.status,
                reason=s.reason,
                name=f"num_workers={s.num_workers}",
                value=s.tokens_per_s,
                unit="tokens/s",
            )
        )
    return samples


# -- child-process entry point (top level: pickled by reference) ------------------------------


def _input_child(
    workload: DataWorkload, spec: StepSpec, workers: tuple[int, ...], deadline: float
) -> list[dict[str, Any]]:
    from profilers.input import probe_input

    budget_s = max(MIN_INPUT_BUDGET_S, deadline - time.time())
    return [s.to_dict() for s in probe_input(workload, spec, workers, budget_s=budget_s)]
