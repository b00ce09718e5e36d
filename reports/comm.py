"""Communication: bus bandwidth against message size, per collective and world size.

Bus bandwidth as nccl-tests define it (algbw × 2(n−1)/n for all_reduce, × (n−1)/n for
all_gather and reduce_scatter, × 1 for broadcast): comparable across collectives, world sizes
and with the links' peak. The profile stores it per sample; this module only groups and draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import reports.fmt as fmt
from reports.charts import Chart, Series, nonempty
from reports.common import mapping
from reports.fmt import num
from reports.model import Section, Table, cell, num_cell


def comm_series(samples: Sequence[Mapping[str, Any]]) -> tuple[Series, ...]:
    groups: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for s in samples:
        s = mapping(s)
        size, busbw = num(s.get("bytes")), num(s.get("busbw_GBps"))
        if s.get("status", "ok") != "ok" or not size or busbw is None:
            continue
        key = (
            str(s.get("backend", "")),
            str(s.get("collective", "")),
            int(num(s.get("world_size")) or 0),
        )
        groups.setdefault(key, []).append((size, busbw))
    out = []
    for (backend, collective, world), points in sorted(groups.items()):
        points.sort()
        out.append(
            Series(
                label=f"{collective} ×{world} ({backend})",
                role=f"comm-{collective}",
                points=tuple((p[0], round(p[1], 5)) for p in points),
                hover=tuple(f"{fmt.size(p[0])}: {p[1]:.3g} GB/s" for p in points),
            )
        )
    return tuple(out)


def _fits_table(fits: Sequence[Mapping[str, Any]]) -> Table | None:
    rows = []
    for f in fits:
        f = mapping(f)
        alpha = num(f.get("alpha_s"))
        bandwidth = num(f.get("bandwidth_GBps"))
        rows.append(
            (
                cell(str(f.get("collective", ""))),
                num_cell(str(f.get("world_size", "")), num(f.get("world_size"))),
                cell(str(f.get("backend", ""))),
                num_cell(
                    fmt.seconds(alpha) if alpha is None or alpha >= 0 else "below resolution",
                    alpha,
                    hint="a negative fitted latency: smaller than the large messages resolve"
                    if alpha is not None and alpha < 0
                    else "",
                ),
                num_cell(f"{bandwidth:.2f} GB/s" if bandwidth else fmt.DASH, bandwidth),
                num_cell(
                    f"{fmt.size(f.get('min_bytes'))} – {fmt.size(f.get('max_bytes'))}",
                    num(f.get("max_bytes")),
                ),
                num_cell(
                    fmt.percent(f.get("max_relative_residual")), num(f.get("max_relative_residual"))
                ),
                cell(str(f.get("implementation") or ""), cls="muted"),
            )
        )
    if not rows:
        return None
    return Table(
        columns=(
            "collective",
            "ranks",
            "backend",
            "latency α",
            "bandwidth 1/β",
            "sizes",
            "max residual",
            "note",
        ),
        rows=tuple(rows),
        caption="α-β (Hockney) fit per collective: time = α + β·bytes. The bandwidth is the "
        "algorithm bandwidth at large messages; the cost model prices DDP and FSDP traffic "
        "with it.",
    )


def comm_section(profile: Mapping[str, Any] | None, probes: Sequence[Mapping[str, Any]]) -> Section:
    title = "Communication"
    if not profile:
        return Section(id="communication", title=title, note="No profile yet.")
    series = comm_series(profile.get("communication") or ())
    runs = [mapping(r) for r in profile.get("communication_runs") or ()]
    failed = [
        f"{r.get('backend')} ×{r.get('world_size')}: {r.get('status')} — {r.get('reason')}"
        for r in runs
        if r.get("status") != "ok"
    ]
    if not series:
        probe = next((p for p in probes if p.get("probe") == "communication"), None)
        if probe is not None and probe.get("status") != "ok":
            reason = probe.get("reason") or "no reason given"
            why = f"the communication probe was {probe.get('status')}: {reason}"
        else:
            why = "the profile holds no collective measurements"
        hint = (
            " (a larger --budget-s leaves it time)"
            if probe and "budget" in str(probe.get("reason"))
            else ""
        )
        return Section(
            id="communication",
            title=title,
            note=f"No communication data: {why}{hint}. Single-device plans need none.",
            bullets=tuple(failed),
        )
    chart = Chart(
        id="comm-busbw",
        title="Bus bandwidth vs message size",
        kind="line",
        x_label="message size (bytes, nccl-tests convention)",
        y_label="bus bandwidth (GB/s)",
        series=series,
        x_log=True,
        x_bytes=True,
        y_min=0,
        caption="Bus bandwidth = algorithm bandwidth × 2(n−1)/n (all_reduce), × (n−1)/n "
        "(all_gather, reduce_scatter), × 1 (broadcast), as nccl-tests report it; each point is "
        "the median of timed samples, max over ranks.",
    )
    fits = _fits_table(mapping(profile.get("fits")).get("communication") or ())
    return Section(
        id="communication",
        title=title,
        charts=nonempty([chart]),
        tables=(fits,) if fits else (),
        bullets=tuple(failed),
    )
