"""The first phases: what the device is and can run, and what the model is (facts and FLOPs).

These run in the profiler's own process: they take no real training step, so nothing in them
can run out of memory or hang the way a step can.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from profilers import probe_rows
from profilers.checkpointing import OPS_HALF
from profilers.device import DeviceInfo
from profilers.fake_kernels import fake_deadline
from profilers.flops import FlopCount
from profilers.probe_run import ProbeRun
from profilers.workload import PRECISIONS, ModelContractError, ModelFacts

# Every later phase needs the device facts, so the device probe always runs, however small the
# budget: probe_device refuses a budget <= 0, and a second keeps each of its benchmark parts
# above the 0.01 s under which it skips the benchmark.
MIN_DEVICE_BUDGET_S = 1.0
# The FLOP count may take at most this part of the budget left when it starts.
FLOPS_MAX_PART = 0.5


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelPhase:
    facts: ModelFacts
    flops: FlopCount | None  # None when counting failed (the row says why)


def device_phase(run: ProbeRun) -> DeviceInfo:
    """Device facts and micro-benchmarks (GEMM per dtype, bandwidth, precision steps)."""
    from profilers.device import probe_device

    run.clock.say("device: facts, matmul and bandwidth benchmarks")
    t0 = time.perf_counter()
    info = probe_device(
        run.options.device, budget_s=max(MIN_DEVICE_BUDGET_S, run.clock.share("device"))
    )
    if run.on_gpu:
        # The benchmarks' GEMM operands stay in this process's caching allocator otherwise
        # (gigabytes at 16384²), and every later child would read them as its own context
        # (mem_get_info sees the whole device): the first device run's profile charged each
        # process 10.2 GB of "fixed" memory, and its plan's peak read +35% over the training.
        # What stays: this process's CUDA context (each child still counts it, with its own:
        # an over-estimate of a few hundred MB, the safe side).
        import torch

        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:  # cuBLAS's workspaces are tensors the pool keeps
            clear_workspaces()
        torch.cuda.empty_cache()
    run.measured(
        "device", None, since=t0, name=info.name, value=info.total_memory_bytes, unit="bytes"
    )
    return info


def usable_precisions(run: ProbeRun, device: DeviceInfo) -> list[str]:
    """The precisions asked for (all by default) less those the device cannot run: a row each."""
    wanted = run.options.precisions or PRECISIONS
    out = []
    for precision in wanted:
        check = device.precisions.get(precision)
        if check is not None and not check.supported:
            run.rows.append(
                probe_rows.row(
                    "device",
                    None,
                    "unsupported",
                    reason=check.reason or "",
                    name=f"precision {precision}",
                )
            )
            continue
        out.append(precision)
    return out


def model_phase(run: ProbeRun) -> ModelPhase:
    """The model's shape facts and its FLOPs per token (an fp32 step at micro-batch 1)."""
    from profilers.flops import count_step_flops

    run.clock.say("model: shape facts and FLOPs per token")
    run.clock.share("model")
    t0 = time.perf_counter()
    facts = run.workload.facts()
    run.measured("model", None, since=t0, name=facts.name, value=facts.num_params, unit="params")
    t0 = time.perf_counter()
    flops: FlopCount | None
    # At most half of what is left: the count comes first, and without the traces after it
    # the profile has nothing to plan from (a Jamba's whole-model count ran for minutes).
    at = t0 + FLOPS_MAX_PART * run.clock.remaining()
    try:
        # ops-half recomputes some matmuls: its count is its own (FlopCount.per_token)
        also = [c for c in run.options.checkpointing if c == OPS_HALF]
        with fake_deadline(at, f"half of what was left of --budget-s {run.options.budget_s:g}"):
            flops = count_step_flops(run.workload, run.spec("fp32", "none", 1), also=also)
        per_token = flops.model_flops_per_token
        run.measured("flops", None, since=t0, value=per_token, unit="flops/token")
    except ModelContractError:  # the first step of the model: nothing after it can run
        raise
    except Exception as exc:
        flops = None
        run.rows.append(probe_rows.raised("flops", None, exc, wall_s=time.perf_counter() - t0))
    return ModelPhase(facts=facts, flops=flops)
