"""Device and model facts: measured peaks next to the datasheet's, and the probes that ran."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import reports.fmt as fmt
from reports.common import mapping
from reports.fmt import num
from reports.model import Fact, Section, Table, cell, num_cell
from strategies.budgets import BUSY_HOST_SHARE

DTYPES = ("fp32", "tf32", "bf16", "fp16")


def _peaks_table(device: Mapping[str, Any]) -> Table:
    sheet = mapping(device.get("datasheet"))
    matmul = mapping(device.get("matmul"))
    precisions = mapping(device.get("precisions"))
    rows = []
    for dtype in DTYPES:
        bench = mapping(matmul.get(dtype))
        measured = num(bench.get("rate"))
        peak = num(sheet.get(f"{dtype}_tflops"))
        peak = peak * 1e12 if peak is not None else None
        if measured is None and peak is None:
            continue
        check = mapping(precisions.get(dtype))
        speed = num(check.get("speedup_vs_fp32"))
        note = []
        if bench.get("warmup_only"):
            note.append("one sample: slow on this device")
        if bench.get("error"):
            note.append(str(bench["error"]))
        if check.get("reason"):
            note.append(str(check["reason"]))
        rows.append(
            (
                cell(f"GEMM {dtype}"),
                num_cell(fmt.flops(measured), measured),
                num_cell(fmt.flops(peak) if peak else "unknown", peak),
                num_cell(fmt.percent(measured / peak) if measured and peak else fmt.DASH, None),
                num_cell(
                    f"{fmt.ratio(speed)} fp32's" if speed is not None else fmt.DASH,
                    speed,
                    hint="a training step in this precision (autocast) against fp32",
                ),
                cell("; ".join(note), cls="muted"),
            )
        )
    bandwidth = num(mapping(device.get("memory_bandwidth")).get("rate"))
    sheet_bw = num(sheet.get("memory_bandwidth_gbs"))
    if bandwidth is not None or sheet_bw is not None:
        rows.append(
            (
                cell("memory copy"),
                num_cell(f"{bandwidth / 1e9:.1f} GB/s" if bandwidth else fmt.DASH, bandwidth),
                num_cell(f"{sheet_bw:.0f} GB/s" if sheet_bw else "unknown", sheet_bw),
                num_cell(
                    fmt.percent(bandwidth / (sheet_bw * 1e9))
                    if bandwidth and sheet_bw
                    else fmt.DASH,
                    None,
                ),
                cell(fmt.DASH),
                cell("read + write bytes over time", cls="muted"),
            )
        )
    return Table(
        columns=("", "measured", "datasheet", "of datasheet", "step speed", "note"),
        rows=tuple(rows),
        caption="Datasheet peaks are dense FLOP/s from the profiler's table; a device that is "
        "not in it (every CPU) has none — never a guess.",
    )


def _device_facts(device: Mapping[str, Any]) -> list[Fact]:
    facts = [
        Fact(label="device", value=f"{device.get('name', '?')} ({device.get('kind', '?')})"),
        Fact(
            label="memory",
            value=f"{fmt.size(device.get('total_memory_bytes'))} total, "
            f"{fmt.size(device.get('free_memory_bytes'))} free when profiled",
        ),
    ]
    cpu, gpu = mapping(device.get("cpu")), mapping(device.get("gpu"))
    if gpu:
        facts.append(
            Fact(
                label="GPU",
                value=f"compute capability {gpu.get('compute_capability', '?')}, "
                f"{gpu.get('num_sms', '?')} SMs, {gpu.get('num_visible_gpus', '?')} visible",
            )
        )
        extra = []
        if gpu.get("driver_version"):
            extra.append(f"driver {gpu['driver_version']}")
        if gpu.get("cuda_version"):
            extra.append(f"CUDA {gpu['cuda_version']}")
        if gpu.get("power_limit_w"):
            extra.append(f"power limit {gpu['power_limit_w']:.0f} W")
        if gpu.get("max_sm_clock_mhz"):
            extra.append(f"SM clock {gpu.get('sm_clock_mhz')}/{gpu['max_sm_clock_mhz']} MHz")
        if gpu.get("max_pcie_gen"):
            extra.append(
                f"PCIe gen {gpu.get('pcie_gen')}/{gpu['max_pcie_gen']} ×{gpu.get('pcie_width')}"
            )
        if gpu.get("num_nvlinks"):
            extra.append(f"{gpu['num_nvlinks']} NVLinks (v{gpu.get('nvlink_version')})")
        if extra:
            facts.append(Fact(label="GPU details", value=", ".join(extra)))
    if cpu:
        isa = [
            f
            for f in cpu.get("isa_flags") or ()
            if f in ("avx2", "avx512f", "amx_bf16", "avx512_bf16")
        ]
        facts.append(
            Fact(
                label="host CPU",
                value=f"{cpu.get('model_name', '?')}, {cpu.get('num_usable_cores', '?')} usable "
                f"cores, {cpu.get('torch_cpu_capability', '?')}"
                + (f" ({', '.join(isa)})" if isa else ""),
            )
        )
    load = num(device.get("host_load_1m"))
    cores = num(cpu.get("num_usable_cores"))
    if load is not None:
        busy = cores is not None and load > cores
        facts.append(
            Fact(
                label="host load when profiled",
                value=f"{load:.2f}" + (" — contended: timings are pessimistic" if busy else ""),
                hint="1-minute load average; above the number of cores, other work shared them",
            )
        )
    facts.append(Fact(label="torch", value=str(device.get("torch_version", "?"))))
    return facts


def _host_share_facts(timings: Sequence[Any]) -> list[Fact]:
    """How much of the host others took while the profile timed steps (the largest share over
    its timing children; profiles before the host meter have none)."""
    shares = [
        share for t in timings if (share := num(mapping(t).get("host_others_share"))) is not None
    ]
    if not shares:
        return []
    worst = max(shares)
    busy = " — busy: the profile's step times read slow; re-profile when quiet"
    return [
        Fact(
            label="host taken by others while timing",
            value=f"up to {fmt.percent(worst)}" + (busy if worst >= BUSY_HOST_SHARE else ""),
            hint="the share of the host's CPU time other processes (and a hypervisor's steal) "
            "took while the profile's timing children ran, the largest over them",
        )
    ]


def _model_facts(workload: Mapping[str, Any], model: Mapping[str, Any]) -> list[Fact]:
    args = mapping(workload.get("model_args"))
    spec = str(workload.get("model") or model.get("name") or "?")
    facts = [
        Fact(label="model", value=spec + (f" {dict(args)}" if args else "")),
        Fact(
            label="family",
            value=f"{model.get('family', '?')}, {model.get('objective', '?')} objective",
        ),
        Fact(
            label="parameters",
            value=f"{fmt.count(model.get('num_params'))} "
            f"({fmt.count(model.get('num_trainable_params'))} trainable, "
            f"{fmt.count(model.get('num_embedding_params'))} in embeddings)",
        ),
        Fact(
            label="shape",
            value=f"{model.get('num_layers', '?')} layers × hidden "
            f"{model.get('hidden_size', '?')}, {model.get('num_heads', '?')} heads"
            + (f" ({model['num_kv_heads']} KV)" if model.get("num_kv_heads") else "")
            + f", FFN {model.get('ffn_hidden_size', '?')}, "
            f"vocabulary {model.get('vocab_size', '?')}",
        ),
        Fact(
            label="sequence length",
            value=f"{workload.get('seq_len', '?')} (max {model.get('max_seq_len', '?')})",
        ),
    ]
    flops = mapping(model.get("flops"))
    per_token = mapping(flops.get("flops_per_token"))
    if per_token:
        counted = num(per_token.get("none"))
        formula = num(flops.get("formula_flops_per_token"))
        text = f"{fmt.count(counted)} counted"
        if num(per_token.get("full")):
            text += f", {fmt.count(per_token.get('full'))} with full recompute"
        if formula:
            text += f"; formula 6N + 12·L·H·Q·T: {fmt.count(formula)}"
            if counted:
                text += f" ({fmt.percent(counted / formula - 1, True)})"
        method = str(flops.get("method") or "")
        how = {"fake": "counted by FlopCounterMode under FakeTensorMode"}.get(method, method)
        facts.append(Fact(label="training FLOPs per token", value=text, hint=how))
    return facts


def probes_table(probes: Sequence[Mapping[str, Any]]) -> Table:
    rows = []
    for p in probes:
        status = str(p.get("status") or "")
        value = num(p.get("value"))
        unit = str(p.get("unit") or "")
        shown = (
            fmt.size(value)
            if unit == "bytes"
            else (f"{value:.4g} {unit}" if value is not None else "")
        )
        rows.append(
            (
                cell(str(p.get("probe") or "")),
                cell(str(p.get("name") or "")),
                cell(
                    status,
                    cls=""
                    if status == "ok"
                    else "bad"
                    if status in ("oom", "error", "timeout")
                    else "muted",
                ),
                cell(str(p.get("reason") or ""), cls="reason"),
                num_cell(fmt.seconds(p.get("wall_s")), num(p.get("wall_s"))),
                num_cell(shown, value),
            )
        )
    return Table(
        columns=("probe", "name", "status", "reason", "wall", "value"),
        rows=tuple(rows),
        sortable=True,
        id="probes",
    )


def facts_section(
    profile: Mapping[str, Any] | None, probes: Sequence[Mapping[str, Any]]
) -> Section:
    if not profile:
        return Section(
            id="facts",
            title="Device and model",
            # The workload flags matter: a bare --out profiled gpt-tiny whatever the run
            # trained, and 'advisor run' alone started a new directory (audit 41, D12).
            note="No profile yet: 'advisor profile --out RUN' with this run's workload flags "
            "(--model, --seq-len ... as in Reproduce) measures one.",
        )
    device = mapping(profile.get("device"))
    facts = (
        _device_facts(device)
        + _host_share_facts(profile.get("throughput") or ())
        + _model_facts(mapping(profile.get("workload")), mapping(profile.get("model")))
    )
    statuses: dict[str, int] = {}
    for p in probes:
        status = str(p.get("status") or "?")
        statuses[status] = statuses.get(status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    budget = num(profile.get("budget_s"))
    elapsed = num(profile.get("elapsed_s"))
    facts.append(
        Fact(
            label="profile",
            value=f"{len(probes)} probes ({summary}) in {fmt.seconds(elapsed)}"
            + (f" of a {fmt.seconds(budget)} budget" if budget else ""),
        )
    )
    skipped = sum(
        1 for p in probes if p.get("status") == "skipped" and "budget" in str(p.get("reason"))
    )
    bullets = []
    if skipped:
        bullets.append(
            f"{skipped} probes were skipped because the time budget was spent: a larger "
            "--budget-s measures more precisions and sizes."
        )
    return Section(
        id="facts",
        title="Device and model",
        facts=tuple(facts),
        tables=(_peaks_table(device),),
        bullets=tuple(bullets),
        details_title=f"All probes ({summary})",
        extra_tables=(probes_table(probes),) if probes else (),
    )
