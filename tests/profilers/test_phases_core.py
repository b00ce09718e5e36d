"""The profile's core, group by group, on a scripted clock: which groups are traced and timed,
in which order, and what a group the budget cannot complete records.

Tracing and timing are replaced by stand-ins that advance a fake clock by a chosen cost, so the
budget arithmetic is tested exactly and no child process runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import cast

import pytest

import profilers.phases_core as core_module
import profilers.phases_time as time_module
from profilers.budget import SHARES
from profilers.device import DeviceInfo
from profilers.flops import FlopCount
from profilers.memory_blocks import DepthScaling
from profilers.memory_measured import training_state_bytes
from profilers.memory_records import MemoryBreakdown, MemoryTrace
from profilers.phases_core import (
    CoreResult,
    core_phase,
    lead_precision,
    least_timing_s,
    ordered_groups,
    refine_phase,
)
from profilers.probe_run import MIN_CHILD_SHARE_S, ProbeRun, ProfileOptions
from profilers.throughput import StepTiming
from profilers.workload import StepSpec
from tests.profilers.toy_workload import ToyWorkload

GiB = 2**30


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclasses.dataclass
class Script:
    """What each stand-in costs: seconds per trace (by checkpointing), and timing children
    that use the time they are given (or a fixed time, e.g. a crash)."""

    trace_s: dict[str, float]
    timing_s: Callable[[float], float] = lambda per_group: per_group
    events: list[str] = dataclasses.field(default_factory=list)


def fake_trace(clock: FakeClock, script: Script) -> Callable[..., MemoryTrace]:
    def trace(
        run: ProbeRun, spec: StepSpec, target: str, costs: core_module._Costs | None = None
    ) -> MemoryTrace:
        t0 = clock.t
        clock.t += script.trace_s[spec.activation_checkpointing]
        if costs is not None:
            costs.add(spec.activation_checkpointing, clock.t - t0)
        script.events.append(f"trace {spec.precision}/{spec.activation_checkpointing}")
        b = spec.micro_batch_size
        peak = GiB + b * 10_000_000 + (spec.grad_accum_steps - 1) * 1_000_000
        run.rows.append(
            core_module.probe_rows.measured(
                "memory", spec, value=peak, unit="bytes", wall_s=clock.t - t0
            )
        )
        return MemoryTrace(
            spec=spec,
            target_device_type=target,
            peak_bytes=peak,
            forward_backward_peak_bytes=peak,
            optimizer_step_peak_bytes=GiB,
            forward_backward_breakdown=MemoryBreakdown(activations=peak),
            optimizer_step_breakdown=MemoryBreakdown(parameters=GiB),
            parameter_bytes=GiB // 4,
            gradient_bytes=GiB // 4,
            optimizer_state_bytes=GiB // 2,
            resident_bytes=GiB,
            trace_seconds=script.trace_s[spec.activation_checkpointing],
        )

    return trace


def fake_time_group(clock: FakeClock, script: Script) -> Callable[..., list[StepTiming]]:
    def time_group(
        run: ProbeRun, small: StepSpec, b_max: int, per_group: float
    ) -> list[StepTiming]:
        clock.t += script.timing_s(per_group)
        script.events.append(f"time {small.precision}/{small.activation_checkpointing}")
        sizes = (small.micro_batch_size, 2 * small.micro_batch_size)
        return [
            StepTiming(
                spec=dataclasses.replace(small, micro_batch_size=b),
                device="cpu",
                num_warmup=1,
                forward_backward_s=(0.1 * b,),
                optimizer_s=(0.01,),
            )
            for b in sizes
        ]

    return time_group


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


def profile_core(
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    script: Script,
    *,
    budget_s: float,
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16"),
    capacity: int = 64 * GiB,
) -> tuple[ProbeRun, CoreResult]:
    monkeypatch.setattr(core_module, "_trace", fake_trace(clock, script))
    monkeypatch.setattr(time_module, "_time_group", fake_time_group(clock, script))
    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=16, budget_s=budget_s), None)
    device = cast(DeviceInfo, SimpleNamespace(precisions={}))  # only its precision speeds are read
    return run, core_phase(run, precisions, "cpu", capacity, device)


def test_groups_go_fp32_first_and_no_checkpointing_before_full() -> None:
    assert ordered_groups(("bf16", "fp16", "fp32"), ("full", "none")) == [
        ("fp32", "none"),
        ("fp32", "full"),
        ("bf16", "none"),
        ("bf16", "full"),
        ("fp16", "none"),
        ("fp16", "full"),
    ]


def _gemm_device(**tflops: float) -> DeviceInfo:
    rates = {p: SimpleNamespace(rate=t * 1e12) for p, t in tflops.items()}
    return cast(
        DeviceInfo,
        SimpleNamespace(measured_flops=lambda p: rates[p].rate if p in rates else None),
    )


def test_a_gpu_that_runs_16_bit_far_faster_times_it_first() -> None:
    # The first device run: an H200 measured bf16 686, fp16 590 and fp32 51 TFLOP/s.
    h200 = _gemm_device(fp32=51, bf16=686, fp16=590)
    assert lead_precision(h200, ("fp32", "bf16", "fp16"), on_gpu=True) == "bf16"
    assert lead_precision(h200, ("fp32", "fp16"), on_gpu=True) == "fp16"
    assert ordered_groups(("fp32", "bf16", "fp16"), ("none", "full"), lead="bf16") == [
        ("bf16", "none"),
        ("bf16", "full"),
        ("fp32", "none"),
        ("fp32", "full"),
        ("fp16", "none"),
        ("fp16", "full"),
    ]


def test_fp32_leads_on_a_cpu_and_where_16_bit_is_not_much_faster() -> None:
    amx = _gemm_device(fp32=0.1, bf16=0.7)  # this host's CPU: bf16 GEMMs 7x, steps not
    assert lead_precision(amx, ("fp32", "bf16"), on_gpu=False) == "fp32"
    slow = _gemm_device(fp32=20, bf16=30)
    assert lead_precision(slow, ("fp32", "bf16"), on_gpu=True) == "fp32"
    unmeasured = _gemm_device()
    assert lead_precision(unmeasured, ("fp32", "bf16"), on_gpu=True) == "fp32"
    assert lead_precision(unmeasured, ("bf16",), on_gpu=True) == "bf16"


def test_cheap_traces_all_run_before_the_first_timing(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(trace_s={"none": 0.1, "full": 0.15})
    _, core = profile_core(clock, monkeypatch, script, budget_s=200)
    first_timing = script.events.index("time fp32/none")
    assert script.events[:first_timing] == [
        f"trace {g[0]}/{g[1]}"
        for g in ordered_groups(("fp32", "bf16", "fp16"), ("none", "full"))
        for _ in range(2)
    ]
    assert len(core.groups) == 6 and not core.skipped


def test_expensive_traces_are_spent_only_on_groups_that_are_also_timed(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 124M model on two cores: a trace takes ~10 s (checkpointed ~15 s), and the budget of
    # 120 s leaves the core ~50 s: fp32 without checkpointing is traced and timed first.
    script = Script(trace_s={"none": 10.0, "full": 15.0})
    run, core = profile_core(clock, monkeypatch, script, budget_s=120)
    assert script.events[:3] == ["trace fp32/none", "trace fp32/none", "time fp32/none"]
    assert ("fp32", "none") in core.groups and core.skipped
    # Traces went only to groups that were timed or whose time derives from a timed one
    # (fp32/full from fp32/none); the other skipped groups' are left to the refinement.
    assert core.untraced()
    for p, c in core.untraced():
        assert f"trace {p}/{c}" not in script.events
    for p, c in core.traced - core.timed:
        assert c == "full" and (p, "none") in core.timed
    # The skipped groups are the tail of the priority order, each with a row that says which
    # budget would cover them.
    order = ordered_groups(("fp32", "bf16", "fp16"), ("none", "full"))
    assert order[len(order) - len(core.skipped) :] == core.skipped
    skipped_rows = [r for r in run.rows if r.probe == "throughput" and r.status == "skipped"]
    assert {(r.precision, r.activation_checkpointing) for r in skipped_rows} >= set(core.skipped)
    for row in skipped_rows:
        assert "--budget-s" in row.reason and "--precision" in row.reason
        # A checkpointed group of a precision timed without checkpointing: the recompute phase
        # may still time it beside that step (profilers.phases_recompute).
        timeable = (row.precision, "none") in core.timed and row.activation_checkpointing != "none"
        assert ("its recompute may still be timed" in row.reason) == timeable
    suggested = int(skipped_rows[-1].reason.split("--budget-s ")[1].split()[0])
    assert suggested > 120


def test_a_model_predicted_not_to_fit_is_traced_but_never_timed(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 70B model on a 24 GiB host: a real step would only swap or be killed. Here every
    # traced step needs > 1 GiB and the device has 1 GiB.
    script = Script(trace_s={"none": 0.1, "full": 0.15})
    run, core = profile_core(clock, monkeypatch, script, budget_s=200, capacity=GiB)
    assert not [e for e in script.events if e.startswith("time")]
    order = ordered_groups(("fp32", "bf16", "fp16"), ("none", "full"))
    assert core.unfit == order and not core.groups and not core.timed
    assert core.traced == set(order)  # the traces stay, for a what-if (--target)
    rows = [r for r in run.rows if r.probe == "throughput"]
    assert len(rows) == len(order)
    for row in rows:
        assert row.status == "skipped" and "predicted not to fit the device" in row.reason
        assert "--target" in row.reason
    # The refinement still traces their accumulation variants and the hinge.
    refined = refine_phase(run, core, "cpu")
    assert {(t.spec.precision, t.spec.activation_checkpointing) for t in refined} == set(order)


def test_when_the_training_state_alone_cannot_fit_no_group_waits_on_a_timing_budget(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 70B model: every step estimated at hours and the parameters, gradients and optimizer
    # state (1 GiB here) beyond the device (0.5 GiB). No group can fit whatever its precision
    # or checkpointing, so none is "skipped for the budget" with a --budget-s of days: each is
    # unfit, traced while the core's share lasts, and the refinement traces the rest.
    monkeypatch.setattr(core_module, "least_timing_s", lambda *args: 1_000_000.0)
    script = Script(trace_s={"none": 8.0, "full": 10.0})
    # 180 s: the refinement's share then holds one untraced group's two traces (one alone
    # fits nothing, so a share of less than two is left to the single refinements).
    run, core = profile_core(clock, monkeypatch, script, budget_s=180, capacity=GiB // 2)
    order = ordered_groups(("fp32", "bf16", "fp16"), ("none", "full"))
    assert not [e for e in script.events if e.startswith("time")]
    assert core.unfit == order and not core.skipped and not core.groups
    assert 1 < len(core.traced) < len(order)  # the share ran out before the last groups
    rows = [r for r in run.rows if r.probe == "throughput"]
    assert len(rows) == len(order)
    for row in rows[1:]:
        assert "parameters, gradients and optimizer state alone need 1.0 GiB" in row.reason
        assert "--target" in row.reason and "--budget-s" not in row.reason
    assert set(core.untraced()) == set(order) - core.traced
    refined = refine_phase(run, core, "cpu")
    first = {(t.spec.precision, t.spec.activation_checkpointing) for t in refined}
    assert first & set(core.untraced())  # the refinement traces the untraced groups first
    core_sizes = set(run.options.trace_micro_batch_sizes[-2:])
    for group in first & set(core.untraced()):  # both core sizes of each
        specs = [
            t.spec for t in refined if (t.spec.precision, t.spec.activation_checkpointing) == group
        ]
        assert {s.micro_batch_size for s in specs} >= core_sizes


def test_a_baseline_step_far_beyond_the_budget_is_skipped_not_run_unbounded(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The baseline may overrun the core's share, never the whole budget by more than 10%: a
    # step estimated at hours is skipped with the budget that would cover it.
    monkeypatch.setattr(core_module, "least_timing_s", lambda *args: 10_000.0)
    script = Script(trace_s={"none": 1.0, "full": 1.5})
    run, core = profile_core(clock, monkeypatch, script, budget_s=120, precisions=("fp32",))
    assert "time fp32/none" not in script.events
    assert core.skipped[0] == ("fp32", "none") and not core.timed
    (row, *_) = [r for r in run.rows if r.probe == "throughput" and r.status == "skipped"]
    suggested = int(row.reason.split("--budget-s ")[1].split()[0])
    assert suggested > 10_000


def test_a_checkpointed_group_is_traced_without_a_timing_when_its_time_can_be_derived(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After fp32/none, time is left for fp32/full's traces but not for another timing child:
    # its step time comes from fp32/none's fit (scaled by counted FLOPs), so it is traced.
    script = Script(trace_s={"none": 4.0, "full": 4.0})
    script.timing_s = lambda per_group: per_group + 20.0  # a slow child overruns its share
    _, core = profile_core(clock, monkeypatch, script, budget_s=100, precisions=("fp32",))
    assert script.events.count("trace fp32/full") == 2
    assert ("fp32", "full") in core.traced


def test_the_refinement_traces_skipped_groups_then_the_hinge_then_accumulation(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(trace_s={"none": 10.0, "full": 15.0})
    run, core = profile_core(clock, monkeypatch, script, budget_s=120)
    untraced = core.untraced()
    assert untraced
    # Give the refinement all the time it wants: its plan order is what is tested.
    monkeypatch.setattr(run.clock, "share", lambda phase: 1e6)
    traces = refine_phase(run, core, "cpu")
    labels = [
        (
            t.spec.precision,
            t.spec.activation_checkpointing,
            t.spec.micro_batch_size,
            t.spec.grad_accum_steps,
        )
        for t in traces
    ]
    sizes = run.options.trace_micro_batch_sizes
    n_core = 2 * len(untraced)
    assert labels[:n_core] == [(p, c, b, 1) for p, c in untraced for b in sizes[-2:]]
    every = [*core.groups, *core.skipped]
    # The hinge first: without it the fit under-predicts small micro-batches (unsafe); without
    # an accumulation trace it is shifted by the gradients' bytes (an upper bound).
    n_hinge = len(sizes[:-2]) * len(every)
    hinge = labels[n_core : n_core + n_hinge]
    assert hinge == [(p, c, b, 1) for b in sizes[:-2] for p, c in every]
    assert labels[n_core + n_hinge :] == [(p, c, sizes[-2], 2) for p, c in every]


def test_the_first_group_is_always_traced_and_timed_even_on_a_spent_budget(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(trace_s={"none": 50.0, "full": 70.0})
    _, core = profile_core(clock, monkeypatch, script, budget_s=10)
    assert script.events[:3] == ["trace fp32/none", "trace fp32/none", "time fp32/none"]
    assert core.groups == [("fp32", "none")]
    assert len(core.skipped) == 5
    assert MIN_CHILD_SHARE_S > 0


class Device:
    """A device record stand-in: a measured fp32 GEMM rate and per-precision speed-ups."""

    def __init__(self, rate: float, speedups: dict[str, float]) -> None:
        self.rate = rate
        self.precisions = {p: SimpleNamespace(speedup_vs_fp32=v) for p, v in speedups.items()}

    def measured_flops(self, dtype: str) -> float | None:
        return self.rate if dtype == "fp32" else None


def flop_count(per_token: float) -> FlopCount:
    return FlopCount(
        seq_len=16,
        micro_batch_size=1,
        tokens=16,
        flops_per_token={"none": per_token, "full": per_token * 4 / 3},
        flops_by_op={},
        formula_flops_per_token=None,
        method="fake",
    )


def test_a_timing_childs_least_cost_grows_with_the_model_and_a_slow_precision() -> None:
    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=128, budget_s=120), None)
    device = cast(DeviceInfo, Device(rate=50e9, speedups={"bf16": 1 / 30}))
    small = least_timing_s(run, device, flop_count(20e6), "fp32", "none", 2)
    large = least_timing_s(run, device, flop_count(760e6), "fp32", "none", 2)
    slow = least_timing_s(run, device, flop_count(760e6), "bf16", "none", 2)
    assert small == pytest.approx(max(MIN_CHILD_SHARE_S, small))
    assert small < large < slow
    # gpt-small's 760 MFLOP/token at b=2 and 4, 128 tokens each, warm-up + timed step each.
    step_s = 760e6 * 128 / (50e9 * core_module.STEP_GEMM_FRACTION)
    assert large == pytest.approx(core_module.CHILD_START_S + 2 * (2 * step_s + 4 * step_s))
    assert least_timing_s(run, device, None, "fp32", "none", 2) == MIN_CHILD_SHARE_S


def test_the_first_group_gets_its_least_cost_and_a_group_that_cannot_get_its_own_is_skipped(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 124M model on two cores: a timing child needs ~40 s at least, more than an even split.
    script = Script(trace_s={"none": 2.0, "full": 2.5})
    given: list[float] = []
    script.timing_s = lambda per_group: given.append(per_group) or per_group
    monkeypatch.setattr(core_module, "_trace", fake_trace(clock, script))
    monkeypatch.setattr(time_module, "_time_group", fake_time_group(clock, script))
    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=128, budget_s=120), None)
    device = cast(DeviceInfo, Device(rate=50e9, speedups={"bf16": 1 / 30, "fp16": 1 / 30}))
    flops = flop_count(760e6)
    core = core_phase(run, ("fp32", "bf16", "fp16"), "cpu", 64 * GiB, device, flops)
    least = least_timing_s(run, device, flops, "fp32", "none", 2)
    assert given[0] >= least
    # The slow precisions' least cost (30x) fits nowhere in this budget: skipped, not started.
    assert {p for p, _ in core.skipped} >= {"bf16", "fp16"}
    assert not any(e.startswith("time bf16") or e.startswith("time fp16") for e in script.events)


@pytest.mark.parametrize("trace_s", [0.5, 3.0, 12.0])
def test_the_core_and_the_refinement_keep_to_their_shares(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch, trace_s: float
) -> None:
    # gpt-small-like costs (a timing child needs ~40 s at least) with cheap, scaled and whole
    # traces: whatever the traces cost, the two phases end within 10% of their shares (a trace
    # or a child is never started without room for it, except the first group's).
    script = Script(trace_s={"none": trace_s, "full": 1.3 * trace_s})
    monkeypatch.setattr(core_module, "_trace", fake_trace(clock, script))
    monkeypatch.setattr(time_module, "_time_group", fake_time_group(clock, script))
    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=128, budget_s=120), None)
    device = cast(DeviceInfo, Device(rate=50e9, speedups={"bf16": 1 / 30, "fp16": 1 / 30}))
    shares: dict[str, float] = {}
    share = run.clock.share

    def recorded(phase: str) -> float:
        shares[phase] = share(phase)
        if phase == "memory_refine":  # what the pricing traces may borrow
            shares["compile"] = run.clock.peek("compile")
        return shares[phase]

    monkeypatch.setattr(run.clock, "share", recorded)
    start = clock.t
    core = core_phase(run, ("fp32", "bf16", "fp16"), "cpu", 64 * GiB, device, flop_count(760e6))
    core_s = clock.t - start
    assert core_s <= 1.1 * (shares["memory"] + shares["throughput"]) + trace_s
    start = clock.t
    before = len(script.events)
    refine_phase(run, core, "cpu")
    # Past its share only for the traces that make a timed precision's full group priceable,
    # and those only within compile's share.
    pricing = [
        e
        for e in script.events[before:]
        if e.endswith("/full") and (e.split()[1].split("/")[0], "none") in core.timed
    ]
    assert clock.t - start <= shares["memory_refine"] + len(pricing) * 1.3 * trace_s + 1.3 * trace_s
    assert clock.t <= start + shares["memory_refine"] + shares["compile"] + 1.3 * trace_s
    assert ("fp32", "none") in core.timed


def test_a_whole_model_trace_of_a_deep_model_is_not_started_without_room_for_it(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blocks:K cannot be traced from shallow copies: on an 80-block model its trace is of the
    whole model, 80 / 5 = 16x a scaled one by the estimate. Before, the refinement only
    checked its deadline had not passed and a 70B model's blocks:40 trace ran for minutes."""
    import profilers.memory_blocks as memory_blocks

    deep = DepthScaling(layers=80, prefix=0, period=1, depths=(2, 3))
    monkeypatch.setattr(memory_blocks, "depth_scaling", lambda workload: deep)
    assert core_module.whole_trace_factor(deep) == pytest.approx(16.0)
    assert core_module.whole_trace_factor(None) == 1.0
    shallow = DepthScaling(layers=4, prefix=0, period=1, depths=(2, 3))
    assert core_module.whole_trace_factor(shallow) == 1.0  # never below a scaled trace
    # Copies of a prefix and periods are deeper: Llama 4 Maverick's 48 blocks from 8 and 12.
    maverick = DepthScaling(layers=48, prefix=0, period=4, depths=(8, 12))
    assert core_module.whole_trace_factor(maverick) == pytest.approx(48 / 20)
    script = Script(trace_s={"none": 3.0, "full": 4.0, "blocks:40": 60.0})
    monkeypatch.setattr(core_module, "_trace", fake_trace(clock, script))
    monkeypatch.setattr(time_module, "_time_group", fake_time_group(clock, script))
    options = ProfileOptions(seq_len=16, budget_s=120, checkpointing=("none", "full", "blocks:40"))
    run = ProbeRun(ToyWorkload(), options, None)
    device = cast(DeviceInfo, SimpleNamespace(precisions={}))
    core = core_phase(run, ("fp32",), "cpu", 64 * GiB, device)
    # none's cost x full's measured ratio to it (4 / 3), x the whole-model factor
    expected = 4.0 * 16
    assert core.costs.trace("blocks:40") == pytest.approx(expected)
    start = clock.t
    refine_phase(run, core, "cpu")
    assert "trace fp32/blocks:40" not in script.events
    assert clock.t - start < 60.0
    rows = [r for r in run.rows if r.status == "skipped" and "blocks:40" in r.name]
    assert rows and any("of the whole model, not of shallow copies" in r.reason for r in rows)


def test_a_full_group_priceable_by_its_traces_alone_gets_them_past_the_refinements_share(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI on a loaded host: the baseline's timing overran the core, the refinement's
    share (~5 s) was below fp32/full's two traces (~7 s), and the profile had no full memory
    fit, though fp32/none was timed (full's step time derives from it) and the budget had room.
    Those traces come first and may borrow compile's share (not the whole budget: that once
    starved the communication probe); the rest keeps to the refinement's share."""
    monkeypatch.setattr(core_module, "least_timing_s", lambda *args: 15.0)
    script = Script(trace_s={"none": 2.5, "full": 3.5})
    script.timing_s = lambda per_group: per_group + 10.0  # a slow child overruns its share
    run, core = profile_core(clock, monkeypatch, script, budget_s=60, precisions=("fp32",))
    assert core.timed == {("fp32", "none")} and ("fp32", "full") in core.untraced()
    share = run.clock.share
    shares: dict[str, float] = {}

    def recorded(phase: str) -> float:
        shares[phase] = share(phase)
        return shares[phase]

    monkeypatch.setattr(run.clock, "share", recorded)
    before, start = len(script.events), clock.t
    remaining = run.clock.remaining()
    traces = refine_phase(run, core, "cpu")
    borrowable = shares["memory_refine"] + run.clock.peek("compile")
    assert shares["memory_refine"] < 2 * 3.5 <= borrowable < remaining
    assert script.events[before : before + 2] == ["trace fp32/full"] * 2
    core_sizes = run.options.trace_micro_batch_sizes[-2:]
    assert [(t.spec.activation_checkpointing, t.spec.micro_batch_size) for t in traces[:2]] == [
        ("full", b) for b in core_sizes
    ]
    # Nothing else ran past the share: every later item was skipped for the budget.
    assert len(script.events) == before + 2
    assert clock.t <= start + borrowable
    skipped = [r for r in run.rows if r.probe == "memory" and r.status == "skipped"]
    assert skipped and all(r.reason.startswith("time budget spent") for r in skipped)


def test_the_pricing_traces_leave_the_communication_probe_the_least_it_needs(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI on a loaded host: the pricing traces, allowed the whole budget's remainder,
    took it, and the communication probe's share fell below the least a launch needs
    (MIN_COMM_SHARE_S), so a world-size-2 profile measured no collective. They borrow no
    further than compile's share: one that would end past it is skipped, and what is left
    still gives the communication phase its minimum."""
    from profilers.phases_comm import MIN_COMM_SHARE_S

    monkeypatch.setattr(core_module, "least_timing_s", lambda *args: 15.0)
    script = Script(trace_s={"none": 2.5, "full": 15.0})
    script.timing_s = lambda per_group: per_group + 10.0
    run, core = profile_core(clock, monkeypatch, script, budget_s=75, precisions=("fp32",))
    assert ("fp32", "full") in core.untraced()
    start, remaining = clock.t, run.clock.remaining()
    share = run.clock.share("memory_refine")
    borrowable = share + run.clock.peek("compile")
    run.clock.started.discard("memory_refine")  # refine_phase asks for its share itself
    # Both would fit the whole remainder, not the loan.
    assert 15.0 < borrowable < 2 * 15.0 < remaining
    before = len(script.events)
    refine_phase(run, core, "cpu")
    assert script.events[before:] == ["trace fp32/full"]  # the second would end past the loan
    assert clock.t <= start + borrowable
    for phase in ("compile", "memory_check"):
        run.clock.share(phase)  # each spending nothing
    assert run.clock.share("communication") >= MIN_COMM_SHARE_S


def test_an_untraced_checkpointed_setting_is_estimated_from_the_measured_ratio() -> None:
    """The 1.6x constant plans only until a checkpointed trace was measured: then the largest
    measured ratio to none's (at least 1), never a blocks:K of the whole model against scaled
    copies (its whole-model factor is applied on top)."""
    costs = core_module._Costs(whole_factor=4.0)
    assert costs.trace("ops-half") == 0.0  # nothing measured at all
    costs.add("none", 3.0)
    costs.add("none", 3.5)
    assert costs.trace("ops-half") == pytest.approx(3.5 * core_module.CHECKPOINTED_TRACE_FACTOR)
    costs.add("blocks:2", 40.0)  # a whole-model trace: says nothing of a scaled one's ratio
    assert costs.checkpointed_factor() == core_module.CHECKPOINTED_TRACE_FACTOR
    costs.add("full", 3.3)  # faster than none: noise, a recompute is never free
    assert costs.trace("ops-half") == pytest.approx(3.5)
    costs.add("ops", 4.2)
    assert costs.trace("ops-half") == pytest.approx(4.2)
    assert costs.trace("blocks:3") == pytest.approx(4.2 * 4.0)
    assert costs.trace("full") == pytest.approx(3.3)  # its own, once it has one


def test_an_untraced_group_is_refined_with_both_core_sizes_or_neither(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One core size fits nothing: seen on hf-gpt2-32k, the refinement traced ops-half at
    micro-batch 4 (4.7 s) and had no time for 8, so ops-half stayed unpredictable. A group's
    pair starts only when both end in time; the single traces after it still run."""
    script = Script(trace_s={"none": 3.0, "ops-half": 3.0})
    monkeypatch.setattr(core_module, "_trace", fake_trace(clock, script))
    options = ProfileOptions(seq_len=16, budget_s=120, checkpointing=("none", "ops-half"))
    run = ProbeRun(ToyWorkload(), options, None)
    monkeypatch.setattr(run.clock, "share", lambda phase: 7.0)
    monkeypatch.setattr(run.clock, "peek", lambda phase: 0.0)
    core = CoreResult(groups=[("fp32", "none")], skipped=[("fp32", "ops-half")])
    core.traced.add(("fp32", "none"))
    core.costs.add("none", 3.0)
    # ops-half estimated 3.0 x 1.6 = 4.8 s a trace: one fits the 7 s, the pair does not.
    traces = refine_phase(run, core, "cpu")
    assert "trace fp32/ops-half" not in script.events
    # ... while the single refinements after it still run: none's hinge first
    assert traces and {t.spec.activation_checkpointing for t in traces} == {"none"}
    assert traces[0].spec.micro_batch_size == run.options.trace_micro_batch_sizes[0]
    assert traces[0].spec.grad_accum_steps == 1
    left = [r for r in run.rows if r.status == "skipped" and "ops-half" in r.name]
    sizes = run.options.trace_micro_batch_sizes
    assert {r.micro_batch_size for r in left if r.grad_accum_steps == 1} >= set(sizes[-2:])
    # Every row left out names one budget covering them all: their expected seconds (none's
    # 3.0 s, ops-half's 3.0 x 1.6) over the refinement's weight of the whole, rounded up.
    skipped = [r for r in run.rows if r.status == "skipped" and r.probe == "memory"]
    need = sum(4.8 if "ops-half" in r.name else 3.0 for r in skipped)
    share = SHARES["memory_refine"] / sum(SHARES.values())
    suggested = int(-(-(120 + need / share) // 30) * 30)
    tail = f"; --budget-s {suggested} would cover the {len(skipped)} refinement traces left out"
    assert skipped and all(r.reason.endswith(tail) for r in skipped)
    assert all(r.reason.startswith("time budget spent") for r in skipped)


def test_no_timing_child_for_a_model_whose_fp32_weights_alone_exceed_the_device(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its traces failed or were cut (no memory fit), so only the parameter count speaks: a
    51.6B Jamba's timing child took its whole share on a 24 GiB host, and could only fail."""
    script = Script(trace_s={"none": 3.0, "full": 4.0})

    def no_trace(
        run: ProbeRun, spec: StepSpec, target: str, costs: core_module._Costs | None = None
    ) -> None:
        clock.t += 1.0
        if costs is not None:
            costs.add(spec.activation_checkpointing, 1.0)

    monkeypatch.setattr(core_module, "_trace", no_trace)
    monkeypatch.setattr(time_module, "_time_group", fake_time_group(clock, script))
    options = ProfileOptions(seq_len=16, budget_s=120, checkpointing=("none", "full"))
    device = cast(DeviceInfo, SimpleNamespace(precisions={}))
    run = ProbeRun(ToyWorkload(), options, None)
    run.state_bytes = training_state_bytes(8 * 2**30)
    core = core_phase(run, ("fp32",), "cpu", 16 * GiB, device)
    assert not script.events and not core.groups  # nothing timed
    assert core.unfit == [("fp32", "full"), ("fp32", "none")]  # a what-if: full first
    row = next(r for r in run.rows if r.probe == "throughput")
    assert row.status == "skipped"
    assert row.reason.startswith(
        "predicted not to fit the device: its fp32 parameters, gradients and AdamW state alone "
        "need 128.0 GiB"  # 16 B per parameter
    )
    # Its fp32 weights fit (4 GiB), its training state does not (16 GiB, over 90% of 16 GiB):
    # until 2026-12-05 only the weights were counted, and a Zamba2 (2.48B) on a 24 GiB host
    # was asked for a budget to time a step that cannot run there.
    run = ProbeRun(ToyWorkload(), options, None)
    run.state_bytes = training_state_bytes(2**30)
    core = core_phase(run, ("fp32",), "cpu", 16 * GiB, device)
    assert not script.events and core.unfit == [("fp32", "full"), ("fp32", "none")]
    # ... unless most of it is frozen: its weights and 2**28 trainable ones' state, 7 GiB
    run = ProbeRun(ToyWorkload(), options, None)
    run.state_bytes = training_state_bytes(2**30, 2**28)
    core = core_phase(run, ("fp32",), "cpu", 16 * GiB, device)
    assert script.events and core.groups
    # a model that may fit is still timed without a fit
    script.events.clear()
    run = ProbeRun(ToyWorkload(), options, None)
    run.state_bytes = training_state_bytes(2**20)
    core = core_phase(run, ("fp32",), "cpu", 16 * GiB, device)
    assert script.events and core.groups


def test_a_what_if_profile_orders_the_precisions_as_its_plans_rank_them() -> None:
    """...and full before none: nothing is timed, and at that scale full prices a plan
    whatever the target's memory."""
    assert ordered_groups(("fp32", "bf16", "fp16"), ("none", "full", "ops"), what_if=True) == [
        ("bf16", "full"),
        ("bf16", "none"),
        ("fp16", "full"),
        ("fp16", "none"),
        ("fp32", "full"),
        ("fp32", "none"),
        ("bf16", "ops"),
        ("fp16", "ops"),
        ("fp32", "ops"),
    ]


def what_if_core(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch, script: Script, state_bytes: int
) -> tuple[ProbeRun, CoreResult]:
    """The core on a 16 GiB device for a model with ``state_bytes`` of training state (none
    and full; 120 s): a what-if profile when the state exceeds the device."""
    monkeypatch.setattr(core_module, "_trace", fake_trace(clock, script))
    monkeypatch.setattr(time_module, "_time_group", fake_time_group(clock, script))
    options = ProfileOptions(seq_len=16, budget_s=120, checkpointing=("none", "full"))
    run = ProbeRun(ToyWorkload(), options, None)
    run.state_bytes = state_bytes
    device = cast(DeviceInfo, SimpleNamespace(precisions={}))
    return run, core_phase(run, ("fp32", "bf16", "fp16"), "cpu", 16 * GiB, device)


def test_a_model_whose_training_state_exceeds_the_device_traces_16_bit_first(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen3.5-9B's default profile on a 24 GiB host (2026-12-06): ~18 s traces, a
    core share for one group, spent on fp32/none; a plan for 8 H100s then priced fp32 only
    and found that nothing fits. Its state known beyond the device, bf16 goes first."""
    script = Script(trace_s={"none": 20.0, "full": 25.0})
    _, core = what_if_core(clock, monkeypatch, script, training_state_bytes(8 * 2**30))
    assert not [e for e in script.events if e.startswith("time")]
    traced = [e for e in script.events if e.startswith("trace")]
    assert traced and all("bf16" in e for e in traced[:2]), traced
    assert core.lead == "bf16" and core.unfit[0] == ("bf16", "full")
    assert ("bf16", "full") in core.traced and ("fp32", "full") not in core.traced
    # A model that may fit keeps fp32, the baseline, first.
    script.events.clear()
    _, core = what_if_core(clock, monkeypatch, script, training_state_bytes(2**20))
    assert core.lead == "fp32" and "fp32" in next(e for e in script.events if e.startswith("trace"))


def test_only_the_lead_precisions_groups_borrow_the_shares_that_cannot_run(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A what-if profile (120 s; the core's own share 52.8 s, what it may borrow from the
    refinement, compile and the real-step checks 33.8 s): bf16/none, estimated at full's
    32 s after bf16/full's (20.8 s of the own share left), is traced on borrowed time;
    fp16/full (32 s), which would fit in it too, is not: the other groups keep to the core's
    own share (the per-rank traces keep theirs)."""
    script = Script(trace_s={"none": 8.0, "full": 16.0})
    run, core = what_if_core(clock, monkeypatch, script, training_state_bytes(8 * 2**30))
    assert core.traced == {("bf16", "none"), ("bf16", "full")}
    assert core.unfit[:3] == [("bf16", "full"), ("bf16", "none"), ("fp16", "full")]
    assert clock.t - 1000.0 == pytest.approx(48.0)  # two traces of 16 s, two of 8 s
    assert run.clock.peek("memory_refine") > 0  # borrowed, not started: it runs later


@pytest.mark.parametrize(("more_s", "expected"), [(15.0, 25.0), (0.0, 30.0)])
def test_a_trace_stopped_at_the_deadline_costs_at_least_what_it_still_needed(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch, more_s: float, expected: float
) -> None:
    """Stopped after 10 s: before its backward (estimated 15 s more), or in its forward, where
    at least the backward of what it ran (2x) is left. Both are lower bounds, marked so."""
    import profilers.memory as memory_module
    from profilers.fake_kernels import TraceOverBudget

    def stopped(*args: object, **kwargs: object) -> None:
        clock.t += 10.0
        raise TraceOverBudget("the fake-tensor trace ran past the test's deadline", more_s=more_s)

    monkeypatch.setattr(memory_module, "trace_step_memory", stopped)
    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=16, budget_s=120), None)
    costs = core_module._Costs()
    assert core_module._trace(run, run.spec("fp32", "none", 4), "cpu", costs) is None
    assert costs.trace("none") == expected and costs.partial == {"none"}
    assert run.rows[-1].status == "skipped"
