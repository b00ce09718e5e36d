"""The communication phase: collective bandwidth and latency at each local world size.

:func:`profilers.comm.probe_communication` launches its own ranks and bounds its own time; this
phase only decides whether it runs and turns its runs into rows.
"""

from __future__ import annotations

import time

from profilers import probe_rows
from profilers.comm_records import CommProfile
from profilers.probe_run import ProbeRun

# One gloo launch of 2 ranks costs ~2.5-3 s before its first collective on 2 cores (see
# profilers.comm): with less than this there is no time left to measure anything.
MIN_COMM_SHARE_S = 5


def communication_phase(run: ProbeRun) -> CommProfile | None:
    """Collectives at every local world size (or those asked for); None when not run."""
    from profilers.comm import available_world_sizes, probe_communication

    share = run.clock.share("communication")
    device_type = "cuda" if run.on_gpu else "cpu"
    sizes = run.options.comm_world_sizes or available_world_sizes(device_type)
    if not run.options.comm or not sizes or share < MIN_COMM_SHARE_S:
        usual = (
            "disabled"
            if not run.options.comm
            else "no world size > 1 available"
            if not sizes
            else "time budget spent"
        )
        reason = run.clock.drop_reasons.get("communication", usual)
        run.rows.append(probe_rows.skipped("communication", None, reason))
        return None
    run.clock.say(f"communication: collectives at world size {', '.join(map(str, sizes))}")
    t0 = time.perf_counter()
    try:
        comm = probe_communication(
            world_sizes=sizes,
            device_type=device_type,
            budget_s=share,
            progress=lambda line: run.clock.say(f"communication: {line}"),
        )
    except Exception as exc:
        run.rows.append(
            probe_rows.raised("communication", None, exc, wall_s=time.perf_counter() - t0)
        )
        return None
    for comm_run in comm.runs:
        run.rows.append(
            probe_rows.row(
                "communication",
                None,
                comm_run.status,
                reason=comm_run.reason,
                wall_s=comm_run.wall_s,
                name=f"{comm_run.backend} world={comm_run.world_size}",
                value=comm_run.max_bytes_measured,
                unit="bytes",
            )
        )
    return comm
