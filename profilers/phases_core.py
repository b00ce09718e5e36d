"""The search's core measurements, group by group: memory at two sizes, then timed steps.

A *group* is one precision x checkpointing. The search can price a candidate only when its group
has both a memory fit (two traced micro-batch sizes) and a step-time fit (two timed sizes; a
checkpointed group can borrow its precision's uncheckpointed fit, scaled by counted FLOPs), so
:func:`core_phase` completes each group before starting the next, in order of value: fp32 first
(the baseline), no checkpointing before full (full first for a what-if profile: see
:func:`ordered_groups`), then the other precisions. Cheap parts first: a
small model's traces (a second each) all run before any timing; a large model's (tens of
seconds each) run just before their group's timing, so none is spent on a group that will not
be timed. When the budget cannot complete a group, it and every later one are skipped, each with
a row naming the ``--budget-s`` that would cover them. (Tracing every group first, whatever it
cost, left a 124M model on two cores with 18 traces and no step-time fit at all.)

The refinements come later, in :func:`refine_phase`, while the budget lasts: the traces of the
skipped groups, the accumulation variants, and the sizes below the core's two. The core traces
the two *largest* sizes, where the memory line is exact; below them the hinged fit's floor
(``fit.fit_hinged``) needs the smallest size, which the refinement adds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from profilers import probe_rows
from profilers.budget import SHARES, covering_budget_s
from profilers.checkpointing import OPS, is_per_op, is_selective, parse_checkpointing
from profilers.device import DeviceInfo
from profilers.flops import FlopCount
from profilers.memory_blocks import DepthScaling
from profilers.memory_model import MemoryModel, fit_memory
from profilers.memory_records import REAL_STEP_ROW, MemoryTrace
from profilers.probe_run import CHILD_START_S, MIN_CHILD_SHARE_S, ProbeRun
from profilers.throughput import StepTiming
from profilers.workload import StepSpec

# A checkpointed trace runs each block's forward twice (the recompute): measured 1.3-1.6x an
# uncheckpointed trace's time on gpt-small and gpt-tiny here. Used to plan a checkpointed group
# before any was traced; afterwards the measured ratio (_Costs.checkpointed_factor), and a
# group's own traces' times once it has them.
CHECKPOINTED_TRACE_FACTOR = 1.6


def whole_trace_factor(scaling: DepthScaling | None) -> float:
    """How much longer a whole-model trace of a model traced from shallow copies takes than a
    scaled trace (``blocks:K`` cannot be scaled: profilers.memory_blocks): ``L / (k1 + k2)``
    with k1, k2 the copies' depths (a prefix and periods included: DeepSeek-V3's 5 and 6 blocks,
    Llama 4 Maverick's 8 and 12), 1 when the model is not scaled. Measured on llama-tiny here
    (2026-12-06, bf16, 2 x 64 tokens, benchmarks/trace_speed.py): a whole blocks:L/2 trace took
    0.97x, 2.15x and 4.80x a scaled full one at 8, 16 and 32 blocks (1.29x, 2.56x, 5.22x in a
    first run, before the first iteration was primed), under the ratio at each (1.6x, 3.2x,
    6.4x). Until that day the tracer walked every module it had met at each op
    (:class:`profilers.memory_tracing.GlobalPeakOnly`), a whole trace grew with the square of
    the depth (hand timings on llama-tiny, not kept; an 80-block 70B model's ran past 2.5
    minutes unbounded, against 3.5 s for a scaled trace), and the estimate was the square of
    the ratio."""
    if scaling is None:
        return 1.0
    return max(1.0, scaling.layers / sum(scaling.depths))


# Trace every group before timing any when their traces take at most this part of the core's
# time left after the first group's traces (see core_phase).
CHEAP_TRACES_FRACTION = 0.5
# The first group's timing (fp32, no checkpointing: the baseline every other prediction is
# compared with) gets at least this part of the core's time left, more than an even split, and
# at least its estimated least cost.
FIRST_GROUP_MIN_PART = 3
# The baseline's timing runs even past the core's share, while its least cost is within this
# multiple of the whole budget's remainder (issue 13: the budget holds within +10%), or is the
# least child at all; beyond that (a huge model on a small host: a step of hours) it is
# skipped with the budget that covers it.
BASELINE_OVERRUN = 1.1
# Planning only, never a prediction: a training step runs at about this fraction of the
# device's measured fp32 GEMM rate (the device probe). gpt-small fp32 on this 2-vCPU host:
# 0.70 of the 1024^3 GEMM's rate at micro-batch 2, 0.87 at 8; a small model runs far below
# it, but its steps are short and the child's start-up dominates.
STEP_GEMM_FRACTION = 0.6


def least_timing_s(
    run: ProbeRun, device: DeviceInfo, flops: FlopCount | None, p: str, c: str, b1: int
) -> float:
    """A timing child's least cost, estimated before it runs: start-up, then the minimum plan
    of :func:`profilers.phases_time._timing_child` (a warm-up and a timed step at ``b1``, the
    same at 2·``b1``), each step its counted FLOPs at :data:`STEP_GEMM_FRACTION` of the
    device's measured GEMM rate, times the device probe's slowdown of the precision."""
    from profilers.phases_time import _slowdown

    per_token = flops.flops_per_token.get(c) if flops is not None else None
    rate = device.measured_flops("fp32") if per_token else None
    if not per_token or not rate:
        return MIN_CHILD_SHARE_S

    def step(b: int) -> float:
        return per_token * b * run.options.seq_len / (rate * STEP_GEMM_FRACTION)

    slow = _slowdown(device, p)
    return max(MIN_CHILD_SHARE_S, CHILD_START_S + 2 * slow * (step(b1) + step(2 * b1)))


@dataclass
class CoreResult:
    """What the core measured: traces and timings of the groups it completed, in order."""

    traces: list[MemoryTrace] = field(default_factory=list)
    timings: list[StepTiming] = field(default_factory=list)
    groups: list[tuple[str, str]] = field(default_factory=list)  # completed (or attempted)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # not timed: the budget
    traced: set[tuple[str, str]] = field(default_factory=set)  # groups with core traces
    timed: set[tuple[str, str]] = field(default_factory=set)  # groups with two timed sizes
    # Traced, never timed: a step at micro-batch 1 is predicted not to fit the device.
    unfit: list[tuple[str, str]] = field(default_factory=list)
    costs: _Costs = field(default_factory=lambda: _Costs())  # what a trace took, for refine
    lead: str = "fp32"  # the precision timed first (lead_precision): the memory checks' too

    def untraced(self) -> list[tuple[str, str]]:
        """Skipped or unfit groups whose core sizes were not traced."""
        return [g for g in (*self.unfit, *self.skipped) if g not in self.traced]


# On a GPU, a 16-bit precision whose measured GEMM rate is at least this many times fp32's is
# timed before fp32 (lead_precision).
LEAD_GEMM_RATIO = 2.0


def lead_precision(device: DeviceInfo, precisions: Sequence[str], on_gpu: bool) -> str:
    """The precision the core times first: fp32 (the naive loop every plan is compared with),
    except on a GPU where bf16 (else fp16) runs GEMMs at least :data:`LEAD_GEMM_RATIO` times
    fp32's measured rate: there the fastest plans are 16-bit, and a budget that times one
    group must time that one. Seen on the first device run (an H200, 2026-12-04: bf16 686 and
    fp32 51 TFLOP/s measured): a 75 s profile of gpt-small timed fp32/none alone, and the plan
    was fp32. On a CPU the order stays fp32 first (every CPU benchmark here was measured so;
    an autocast step's CPU speed does not follow its GEMM rate)."""
    fp32 = device.measured_flops("fp32") if on_gpu else None
    if fp32:
        for p in ("bf16", "fp16"):
            rate = device.measured_flops(p)
            if p in precisions and rate and rate >= LEAD_GEMM_RATIO * fp32:
                return p
    return "fp32" if "fp32" in precisions or not precisions else precisions[0]


def ordered_groups(
    precisions: Sequence[str],
    checkpointing: Sequence[str],
    lead: str = "fp32",
    *,
    what_if: bool = False,
) -> list[tuple[str, str]]:
    """``lead`` first (:func:`lead_precision`: fp32, the search's baseline, unless a GPU runs
    16-bit much faster), fp32 next, then the others in the order given (bf16 before
    fp16 by default: no loss scaling, and the mixed precision of choice where both run).
    ``what_if`` (a model whose training state alone exceeds this device: its profile serves
    a what-if only, and nothing is timed) orders the precisions as the what-if's plans rank
    them instead (:data:`profilers.phases_distributed.WHAT_IF_PRECISION_ORDER`: bf16, fp16,
    fp32), ``lead`` ignored: until 2026-12-06 such a profile of Qwen3.5-9B (traces of ~18 s
    even from copies of 8 and 12 of its 32 layers, two periods of its mixed layers) spent its
    core share on fp32/none and a plan for 8 H100s found only fp32 candidates, none of which
    fit. No checkpointing before full, whose time the cost model can derive from it; for a
    what-if, full before none: nothing is timed to derive from, and at the scale where the
    training state alone exceeds this device a full group is what prices a plan whatever the
    target's memory (none adds the faster plans where it fits, and with full the blocks:K
    between). Until 2026-12-06 none came first there too: on a slow 2-vCPU host Qwen3.5-9B's
    default profile (traces of ~26 s, ~42 s with full checkpointing) traced bf16/none only, and
    its what-if for 8 H100s said nothing fits (83.4 GiB a rank without checkpointing). The
    selective settings come after every whole-model group: the per-op ones (ops, ops-half)
    first, in the order given, then blocks:K. Nothing else prices a per-op setting, while
    every blocks:K is priced from none and full without its own measurement (the line in K):
    the 7th regret session's default profile traced blocks:2 and left the ops-half asked for
    untraced, so every ops-half candidate was unpredictable."""
    if what_if:
        from profilers.phases_distributed import WHAT_IF_PRECISION_ORDER

        rank = {p: i for i, p in enumerate(WHAT_IF_PRECISION_ORDER)}
        order = sorted(precisions, key=lambda p: rank.get(p, len(rank)))
    else:
        order = sorted(precisions, key=lambda p: (p != lead, p != "fp32"))
    whole = [c for c in checkpointing if not is_selective(c)]
    selective = sorted(
        (c for c in checkpointing if is_selective(c)), key=lambda c: not is_per_op(c)
    )
    first = "full" if what_if else "none"
    return [(p, c) for p in order for c in sorted(whole, key=lambda c: c != first)] + [
        (p, c) for p in order for c in selective
    ]


def core_phase(
    run: ProbeRun,
    precisions: Sequence[str],
    target: str,
    capacity: int,
    device: DeviceInfo,
    flops: FlopCount | None = None,
) -> CoreResult:
    """Trace and time each group in turn within the memory and throughput shares together.

    Cheap parts first: when, after the first group's traces, every other group's traces would
    take at most :data:`CHEAP_TRACES_FRACTION` of the time left, all are traced before any
    timing (a small model: traces take a second, a timing child several). Otherwise (a large
    model: one trace can take longer than a timing) each group is traced just before it is
    timed, so no trace is spent on a group that will not also be timed.
    """
    from profilers.memory_blocks import depth_scaling
    from profilers.phases_time import _slowdown, _time_group, timed_sizes

    # The training state alone beyond this device: nothing will be timed, the traces serve a
    # what-if, in the order its plans rank the precisions.
    what_if = run.state_bytes is not None and run.state_bytes > (
        run.options.memory_budget * capacity
    )
    borrowed = 0.0
    if what_if:
        # The lead precision's groups (bf16's none and full: without the latter no
        # checkpointed candidate of the what-if can be priced, and at that scale nothing
        # fits without checkpointing) may borrow the shares of the phases that cannot run
        # here (compile and the real-step checks: nothing is timed, nothing fits) and of the
        # refinement (the hinge and the accumulation variants matter less than a group's
        # fit); the other groups keep to the core's own share, so the per-rank traces, which
        # price FSDP, keep theirs. Until 2026-12-06 Qwen3.5-9B's default profile (traces of
        # ~18 s, ~29 s with full checkpointing) traced fp32/none alone, and its what-if for
        # 8 H100s found that nothing fits.
        core = ("memory", "throughput")
        lend = tuple(
            p for p in ("memory_refine", "compile", "memory_check") if run.clock.peek(p) > 0
        )
        total = run.clock.joint_share(*core, borrow=lend)
        own = sum(SHARES[p] for p in core)
        share = total * own / (own + sum(SHARES[p] for p in lend))
        borrowed = total - share
    else:
        share = run.clock.share("memory") + run.clock.share("throughput")
    deadline = time.perf_counter() + share
    lead = lead_precision(device, precisions, run.on_gpu)
    groups = ordered_groups(precisions, run.options.checkpointing, lead, what_if=what_if)
    if what_if:
        lead = groups[0][0]
    sizes = tuple(run.options.trace_micro_batch_sizes[-2:])
    costs = _Costs(whole_factor=whole_trace_factor(depth_scaling(run.workload)))
    out = CoreResult(costs=costs, lead=lead)
    traced: dict[tuple[str, str], list[MemoryTrace]] = {}

    def trace_group(i: int, group: tuple[str, str]) -> None:
        traced[group] = _trace_group(run, *group, sizes, target, len(groups), i, costs)
        out.traces.extend(traced[group])
        out.traced.add(group)

    def timing_cost(p: str, c: str) -> float:
        b1, _ = timed_sizes(run, None, capacity, _slowdown(device, p))
        return least_timing_s(run, device, flops, p, c, b1)

    timed = out.timed
    state_unfit: str | None = None  # why no group can fit: the training state alone
    if what_if:
        state_unfit = _unfit_whatever(
            "fp32 parameters, gradients and AdamW state",
            run.state_bytes or 0,
            run.options.memory_budget * capacity,
        )
    for i, (p, c) in enumerate(groups):
        left = deadline - time.perf_counter()
        to_come = groups[i + 1 :]
        if state_unfit is not None:
            # No group fits (precision and checkpointing leave the fp32 parameters,
            # gradients and optimizer state as they are): trace it for a what-if while the
            # share lasts (the lead precision's whole groups: with what they borrow), time
            # nothing.
            if p == lead and not is_selective(c):
                left += borrowed
            if (p, c) not in traced and left >= costs.trace(c) * len(sizes):
                trace_group(i, (p, c))
            out.unfit.append((p, c))
            run.rows.append(
                probe_rows.skipped("throughput", run.spec(p, c, 1), state_unfit, name=f"{p}/{c}")
            )
            continue
        # A checkpointed group whose precision was timed without checkpointing is predictable
        # from its traces alone (the cost model derives its time by the counted FLOPs ratio).
        # Not ops: its recompute holds no matmul, so its FLOPs ratio says nothing of its time.
        derivable = c not in ("none", OPS) and (p, "none") in timed
        trace_cost = 0.0 if (p, c) in traced else costs.trace(c) * len(sizes)
        if out.skipped or (i > 0 and left < trace_cost + (0.0 if derivable else timing_cost(p, c))):
            out.skipped.append((p, c))  # and every later one: the order is the priority
            continue
        if (p, c) not in traced:
            trace_group(i, (p, c))
            if i == 0:
                rest = sum(costs.trace(gc) * len(sizes) for _, gc in to_come)
                room = deadline - time.perf_counter() - timing_cost(p, c)
                if rest <= CHEAP_TRACES_FRACTION * room:
                    for j, group in enumerate(to_come, start=1):
                        trace_group(j, group)
        model = _fit_or_none(traced[(p, c)])
        b1, b_max = timed_sizes(run, model, capacity, _slowdown(device, p))
        small = run.spec(p, c, b1)
        usable = run.options.memory_budget * capacity
        if model is not None and model.predict(1) > usable:
            # A real step would only swap or be killed (a 70B model on a 24 GiB host): no
            # child at all. Its traces stay, for a what-if on a larger device (--target).
            out.unfit.append((p, c))
            state = model.parameter_bytes + model.gradient_bytes + model.optimizer_state_bytes
            if state > usable:
                state_unfit = _unfit_whatever(
                    "parameters, gradients and optimizer state", state, usable
                )
            run.rows.append(
                probe_rows.skipped(
                    "throughput",
                    run.spec(p, c, 1),
                    f"predicted not to fit the device: {model.predict(1) / 2**30:.1f} GiB at "
                    f"micro-batch 1 against {usable / 2**30:.1f} GiB usable; plan it for a "
                    "larger device with 'advisor recommend --target'",
                    name=f"{p}/{c}",
                )
            )
            continue
        counted = run.state_bytes
        if model is None and counted is not None and counted > usable:
            # No fit to say more (its traces failed or were cut), but its training state alone
            # exceeds the device: a timing child could only be killed (a 51.6B Jamba's took
            # its whole 22.5 s share on a 24 GiB host). Until 2026-12-05 only the fp32 weights
            # were counted: a Zamba2 (2.48B: 9.2 GiB of them, 37 GiB of state) was asked for
            # --budget-s 17010 to time a step that cannot run here.
            out.unfit.append((p, c))
            state_unfit = _unfit_whatever(
                "fp32 parameters, gradients and AdamW state", counted, usable
            )
            run.rows.append(
                probe_rows.skipped("throughput", run.spec(p, c, 1), state_unfit, name=f"{p}/{c}")
            )
            continue
        left = deadline - time.perf_counter()
        # What the groups still to come need for their own traces is kept back, so one
        # group's timing does not starve the next one's traces; the rest is split evenly
        # (at least half an even split of what is left, whatever the reservation).
        reserved = sum(costs.trace(gc) * len(sizes) for gp, gc in to_come if (gp, gc) not in traced)
        even = left / (len(to_come) + 1)
        per_group = max(even - reserved / (len(to_come) + 1), even / 2)
        least = timing_cost(p, c)
        if i == 0 and least <= max(run.clock.remaining() * BASELINE_OVERRUN, MIN_CHILD_SHARE_S):
            # The baseline: without it the search has nothing to compare against, so it may
            # take the budget's whole remainder and a little more (or the least child at all,
            # on a spent budget), never an unbounded time.
            per_group = max(per_group, left / FIRST_GROUP_MIN_PART, least)
        if per_group < least:
            out.skipped.append((p, c))  # traced, not timed; every later group is skipped too
            continue
        out.groups.append((p, c))
        run.clock.say(f"throughput: timing {p}/{c} from b={b1}")
        timings = _time_group(run, small, b_max, per_group)
        out.timings += timings
        if len({t.spec.micro_batch_size for t in timings}) >= 2:
            timed.add((p, c))
    if out.skipped:
        _record_skipped(run, out, sizes, costs, timing_cost)
    return out


def _unfit_whatever(what: str, need: float, usable: float) -> str:
    """Why no group can fit this device: ``what`` alone needs ``need`` bytes, and neither the
    precision nor the checkpointing changes it."""
    return (
        f"predicted not to fit the device: its {what} alone need {need / 2**30:.1f} GiB against "
        f"{usable / 2**30:.1f} GiB usable, whatever the precision or checkpointing; plan it for "
        "a larger device with 'advisor recommend --target'"
    )


def refine_phase(run: ProbeRun, core: CoreResult, target: str) -> list[MemoryTrace]:
    """While the ``memory_refine`` share lasts: the core sizes of the groups the core skipped
    and did not trace (memory fits cost no step: the report and a what-if plan for another
    device use them), then the sizes below the core's two (the hinge of the memory fit), then
    each group's accumulation variant.

    First of all, and past the share into the next phase's (compile: on CPU at the default
    budgets it has no room for a cold compile anyway): a skipped ``full`` group whose precision
    was timed without checkpointing, then the per-op ones (``ops``, ``ops-half``) of such a
    precision. The recompute phase times their recompute beside that plain step (or the cost
    model scales it by the counted FLOPs), so these two traces alone make a whole group
    priceable; a ``blocks:K`` is priced on the line through none and full without them. Seen in
    CI: a loaded host spent the core on the baseline's timing, the refinement's share was 5 s
    against 7 s for fp32/full's traces, and the profile had no full memory fit; in the 7th
    regret session the ops-half asked for was never traced. Borrowing the whole budget's
    remainder instead starved the communication probe on another loaded run (its share fell
    below the least a launch needs), so they borrow no further than compile's share. A group's
    core sizes start only together: one size fits nothing."""
    share = run.clock.share("memory_refine")
    deadline = time.perf_counter() + share
    borrowed = deadline + run.clock.peek("compile")
    sizes = run.options.trace_micro_batch_sizes
    core_sizes, hinge = sizes[-2:], sizes[:-2]
    untraced = core.untraced()
    pricing = [
        g for g in untraced if (g[1] == "full" or is_per_op(g[1])) and (g[0], "none") in core.timed
    ]
    pricing.sort(key=lambda g: g[1] != "full")  # stable: the per-op ones in the core's order
    untraced = pricing + [g for g in untraced if g not in pricing]
    plan = [run.spec(p, c, b) for p, c in untraced for b in core_sizes]
    first = len(pricing) * len(core_sizes)  # the plan's items that may borrow compile's share
    every = [*core.groups, *core.unfit, *core.skipped]  # priority: the skipped are its tail
    # The hinge before the accumulation variants: without its smallest size a group's fit is
    # the line through the core's two, which lies below the peak at smaller micro-batches (the
    # peak there is the end of backward, every gradient live, flat in b: gpt-small at 128
    # tokens read 7.2% low at micro-batch 1 and 2); without an accumulation trace the fit is
    # shifted by every gradient's bytes, an upper bound.
    plan += [run.spec(p, c, b) for b in hinge for p, c in every]
    plan += [run.spec(p, c, core_sizes[0], 2) for p, c in every]
    traces = []
    costs = core.costs
    pairs = len(untraced) * len(core_sizes)  # the plan's items that are a group's core sizes
    left_out: set[tuple[str, str]] = set()  # groups whose core sizes were not all started
    skipped: list[tuple[int, float]] = []  # (row index, the trace's expected seconds)
    for i, spec in enumerate(plan):
        # Started only when it would end in time at what such a trace took (or is estimated to
        # take: a blocks:K trace of a model traced from shallow copies is a whole-model one);
        # a group's core sizes only all together, at the first: one size fits nothing (seen:
        # ops-half's first trace ran, its second did not, 4.7 s spent for no memory fit).
        expected = costs.trace(spec.activation_checkpointing)
        group = (spec.precision, spec.activation_checkpointing)
        whole = expected * (len(core_sizes) - i % len(core_sizes)) if i < pairs else expected
        late = time.perf_counter() + whole > (borrowed if i < first else deadline)
        if late or (i < pairs and group in left_out):
            left_out.add(group)
            skipped.append((len(run.rows), expected))
            run.rows.append(
                probe_rows.skipped(
                    "memory", spec, "time budget spent" + costs.whole_note(spec, expected)
                )
            )
            continue
        run.clock.say(f"memory: tracing {probe_rows.label(spec)} (refinement {i + 1}/{len(plan)})")
        trace = _trace(run, spec, target, costs)
        if trace is not None:
            traces.append(trace)
    if skipped:
        # Every row left out names the budget whose refinement share covers them all.
        suggested = covering_budget_s(
            run.options.budget_s, ("memory_refine",), sum(s for _, s in skipped), run.clock.dropped
        )
        probe_rows.name_covering_budget(
            run.rows, (i for i, _ in skipped), suggested, f"{len(skipped)} refinement traces"
        )
    return traces


@dataclass
class _Costs:
    """Seconds one trace took, per checkpointing, as measured so far (None: not yet).
    ``whole_factor``: a whole-model trace against a scaled one (:func:`whole_trace_factor`),
    for the settings no shallow copy reproduces (``blocks:K``) until one was measured."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    whole_factor: float = 1.0
    # The settings whose time is only a lower bound: a trace of theirs stopped before its end.
    partial: set[str] = field(default_factory=set)

    def _factor(self, checkpointing: str) -> float:
        blocks = parse_checkpointing(checkpointing).kind == "blocks"
        return self.whole_factor if blocks else 1.0

    def whole_note(self, spec: StepSpec, expected: float) -> str:
        """Why a skipped blocks:K trace costs what it does, when it is a whole-model one."""
        if self._factor(spec.activation_checkpointing) == 1.0:
            return ""
        return (
            f" (a {spec.activation_checkpointing} trace is of the whole model, not of shallow "
            f"copies: ~{expected:.0f} s estimated)"
        )

    def add(self, checkpointing: str, seconds: float) -> None:
        self.seconds.setdefault(checkpointing, []).append(seconds)

    def checkpointed_factor(self) -> float:
        """A checkpointed trace's time over none's: the largest measured so far among the
        checkpointed settings traced like none (from the same shallow copies), at least 1 (it
        runs each block's forward twice); :data:`CHECKPOINTED_TRACE_FACTOR` until one was.
        hf-gpt2-32k here (7th regret session): full 0.95x and ops 1.02x none's 3.7 s, while
        the constant estimated each ops-half trace at 5.9 s and the refinement skipped them."""
        plain = self.seconds.get("none")
        seen = [
            max(values) / max(plain)
            for c, values in self.seconds.items()
            if plain and c != "none" and values and self._factor(c) == 1.0
        ]
        return max(1.0, *seen) if seen else CHECKPOINTED_TRACE_FACTOR

    def trace(self, checkpointing: str) -> float:
        own = self.seconds.get(checkpointing)
        if own:
            return max(own)
        whole = self._factor(checkpointing)
        plain = self.seconds.get("none")
        if plain:
            factor = self.checkpointed_factor() if checkpointing != "none" else 1.0
            return max(plain) * factor * whole
        seen = [s for values in self.seconds.values() for s in values]
        return max(seen) * whole if seen else 0.0


def _trace_group(
    run: ProbeRun,
    precision: str,
    checkpointing: str,
    sizes: Sequence[int],
    target: str,
    num_groups: int,
    index: int,
    costs: _Costs,
) -> list[MemoryTrace]:
    traces = []
    cut: list[int] = []  # rows of the traces stopped or not started for the deadline
    for b in sizes:
        spec = run.spec(precision, checkpointing, b)
        run.clock.say(f"memory: tracing {probe_rows.label(spec)} (group {index + 1}/{num_groups})")
        rows = len(run.rows)
        trace = _trace(run, spec, target, costs)
        if trace is not None:
            traces.append(trace)
        elif len(run.rows) > rows and run.rows[-1].reason.startswith(probe_rows.TIME_SPENT):
            cut.append(len(run.rows) - 1)
    if cut:
        # At what such a trace takes (for one stopped, at least what it still needed): the
        # budget whose core share runs them.
        suggested = covering_budget_s(
            run.options.budget_s,
            ("memory", "throughput"),
            costs.trace(checkpointing) * len(cut),
            run.clock.dropped,
        )
        what = f"{len(cut)} traces of {precision}/{checkpointing}"
        at_least = checkpointing in costs.partial
        probe_rows.name_covering_budget(run.rows, cut, suggested, what, at_least=at_least)
    return traces


def _trace(
    run: ProbeRun, spec: StepSpec, target: str, costs: _Costs | None = None
) -> MemoryTrace | None:
    """One step's memory: a fake trace, or a real step's once no fake trace can run the model
    (it reads tensor values on the host: :mod:`profilers.memory_measured`).

    With ``costs``, the time it took is added to them (for a trace stopped at the deadline, a
    lower bound, marked so: its time and the backward it did not start or, stopped in its
    forward, that part's backward), and a fake trace is not
    started when such a trace took longer than is left before the deadline of the profile's
    fake traces (:func:`profilers.fake_kernels.fake_deadline`): it could only be stopped there.
    Until 2026-12-05 it was: a Zamba2 (2.48B, traced whole, seq 4096) had its first trace's
    backward refused at that deadline, then spent 52 s on the group's second size's forward,
    refused too."""
    from profilers.fake_kernels import BACKWARD_OVER_FORWARD, TraceOverBudget
    from profilers.memory import trace_step_memory
    from profilers.memory_measured import needs_real_values

    checkpointing = spec.activation_checkpointing
    t0 = time.perf_counter()
    if run.untraceable is None:
        if costs is not None and too_late_to_trace(
            run, spec, costs.trace(checkpointing), at_least=checkpointing in costs.partial
        ):
            return None
        try:
            trace = trace_step_memory(run.workload, spec, target_device_type=target)
        except Exception as exc:
            if not needs_real_values(exc):
                wall_s = time.perf_counter() - t0
                run.rows.append(probe_rows.raised("memory", spec, exc, wall_s=wall_s))
                if costs is not None and isinstance(exc, TraceOverBudget):
                    # At least the backward it did not start or, stopped in its forward, the
                    # backward of the part it ran: a lower bound of a whole trace.
                    more = exc.more_s or BACKWARD_OVER_FORWARD * wall_s
                    costs.add(checkpointing, wall_s + more)
                    costs.partial.add(checkpointing)
                elif costs is not None:
                    costs.add(checkpointing, wall_s)
                return None
            # A property of the model, not of this config: every later step is measured.
            run.untraceable = probe_rows.one_line(exc)
        else:
            run.measured("memory", spec, since=t0, value=trace.peak_bytes, unit="bytes")
            if costs is not None:
                costs.add(checkpointing, time.perf_counter() - t0)
            return trace
    measured = _real_step_trace(run, spec, target, t0)
    if costs is not None:
        costs.add(checkpointing, time.perf_counter() - t0)
    return measured


def too_late_to_trace(
    run: ProbeRun,
    spec: StepSpec,
    expected_s: float,
    *,
    at_least: bool = False,
    traces: int = 1,
) -> bool:
    """Whether a fake trace of ``spec`` expected to take ``expected_s`` (0: unknown; ``at_least``:
    a lower bound) would end past the deadline of the profile's fake traces, where it could
    only be stopped; if so, its row says so. ``traces`` > 1: it is the first of that many
    (each ``expected_s``) that are of use only together (a fit needs two sizes), all of which
    must end in time. A model measured on real steps (``run.untraceable``) has no such
    deadline."""
    from profilers.fake_kernels import deadline_left

    left = deadline_left()
    need = expected_s * traces
    if run.untraceable is not None or left is None or expected_s <= 0 or need <= left[0]:
        return False
    seconds, what = left
    took = (
        f"a trace takes {'at least ' if at_least else ''}~{expected_s:.0f} s here"
        if traces == 1
        else f"its {traces} traces (one fit) take {'at least ' if at_least else ''}"
        f"~{need:.0f} s here"
    )
    run.rows.append(
        probe_rows.skipped(
            "memory",
            spec,
            f"{probe_rows.TIME_SPENT}: {took} and "
            f"{max(seconds, 0):.0f} s are left before {what}; not started, as it could only be "
            f"stopped there; {probe_rows.LARGER_BUDGET}",
        )
    )
    return True


def _real_step_trace(run: ProbeRun, spec: StepSpec, target: str, t0: float) -> MemoryTrace | None:
    """A step's memory measured on a real step in a child (the model is not fake-traceable)."""
    from profilers.memory_measured import measure_step_trace

    why = f"{REAL_STEP_ROW}no fake trace can run this model ({run.untraceable})"
    if run.options.device == "cpu" and target == "cuda":
        why += "; measured on the CPU for a CUDA target, without CUDA's 512-byte rounding"
    usable, need = run.usable_bytes, run.state_bytes
    if usable is not None and need is not None and need > usable:
        run.rows.append(
            probe_rows.skipped(
                "memory",
                spec,
                f"{why}, and a real step cannot fit: its parameters, gradients and AdamW state "
                f"alone need ~{need / 2**30:.1f} GiB against {usable / 2**30:.1f} GiB usable",
            )
        )
        return None
    run.clock.say(f"memory: real step {probe_rows.label(spec)} (the model is not fake-traceable)")
    outcome = run.isolated(
        measure_step_trace,
        run.workload,
        spec,
        run.options.device,
        target,
        timeout_s=run.clock.remaining(),
    )
    wall_s = time.perf_counter() - t0
    if not outcome.ok:
        run.rows.append(
            probe_rows.row(
                "memory", spec, outcome.status, reason=f"{why}: {outcome.reason}", wall_s=wall_s
            )
        )
        return None
    trace = MemoryTrace.from_dict(outcome.value)
    run.rows.append(
        probe_rows.measured(
            "memory", spec, value=trace.peak_bytes, unit="bytes", wall_s=wall_s, reason=why
        )
    )
    return trace


def _fit_or_none(traces: Sequence[MemoryTrace]) -> MemoryModel | None:
    try:
        return fit_memory(traces)
    except ValueError:
        return None


def _record_skipped(
    run: ProbeRun,
    core: CoreResult,
    sizes: Sequence[int],
    costs: _Costs,
    timing_cost: Callable[[str, str], float],
) -> None:
    """One row per skipped group, with the budget that would have covered it."""
    # The groups' missing traces plus a timing child each, over the part of the budget the
    # core gets (the memory and throughput weights of the whole): what to add to --budget-s.
    need = sum(
        (0.0 if g in core.traced else costs.trace(g[1]) * len(sizes))
        + max(2 * MIN_CHILD_SHARE_S, timing_cost(*g))
        for g in core.skipped
    )
    suggested = covering_budget_s(
        run.options.budget_s, ("memory", "throughput"), need, run.clock.dropped
    )
    names = ", ".join(f"{p}/{c}" for p, c in core.skipped)
    fewer = "" if run.options.precisions else ", or --precision to profile fewer precisions"
    for p, c in core.skipped:
        spec = run.spec(p, c, sizes[0])
        derived = (
            f"; its recompute may still be timed beside {p}/none's step (the rows "
            f"'recompute delta' or '{p}/{c} recompute' say)"
            if c != "none" and (p, "none") in core.timed
            else ""
        )
        run.rows.append(
            probe_rows.skipped(
                "throughput",
                spec,
                f"time budget spent before this group was timed ({names} not timed: they need "
                f"~{need:.0f} s more); --budget-s {suggested} would cover them{fewer}{derived}",
                name=f"{p}/{c}",
            )
        )
