"""The local validator: single-device configs measured in one isolated child.

LocalValidator runs every config in ONE isolated child (profilers.isolate: spawn, timeout,
memory cap): first each config's real peak memory (CPU: the allocator's own count through the
profiler, :func:`profilers.memory.measure_cpu_step_memory`; CUDA: the caching allocator plus
context and workspaces, :func:`profilers.memory.measure_cuda_step_memory`), then their step
times interleaved round-robin (:func:`profilers.throughput.measure_interleaved`: slow drift of a
shared host spreads over all configs instead of biasing one) when all of them fit in memory at
once, else one after the other. If that child fails, each config is retried in a child of its
own so one crash (an OOM the model did not predict) doesn't cost the others their measurement.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from advisor.validation.validator import SAFETY, STARTUP_S, over_budget
from profilers.isolate import (
    Isolation,
    describe_exception,
    quiet_native_output,
    run_isolated,
)
from profilers.workload import StepSpec
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement
from strategies.prediction import MiB

if TYPE_CHECKING:
    from profilers.workload import Workload


# How far above the budget the CPU validation child's memory cap (RLIMIT_DATA) sits. The cap
# guards the host; whether a config fits the budget is judged from its measured peak (below).
# The child holds more than a training process of the same config: its memory pass runs under
# torch.profiler, whose records stay in the heap it counts, and the timed steps follow in the
# same process. Capped at the budget itself, configs that `advisor train` ran within it failed
# "oom" (10th regret session, hf-gpt2-32k, 1,122 MiB budget: re-run uncapped the child peaked at
# 1,048 and 1,227 MiB resident where training held 962-966 and 1,085-1,097).
CAP_HEADROOM = 0.25


@dataclass(frozen=True, kw_only=True)
class LocalValidator:
    """Single-device validation on ``device`` ("cpu" or "cuda[:i]")."""

    device: str
    budget_bytes: int
    warmup: int = 2
    rounds: int = 3
    memory_limit: bool = True  # cap the child (CPU RAM) at the budget + CAP_HEADROOM
    progress: Callable[[str], None] | None = field(default=None, compare=False)
    name: str = "local"

    def unsupported_reason(self, config: TrainConfig) -> str | None:
        if config.parallelism != "single" or config.world_size != 1:
            return (
                f"{config.parallelism}×{config.world_size} runs on several ranks: the local "
                "validator measures single-device configs"
            )
        return None

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]:
        if not configs:
            return []
        say = self.progress or (lambda _m: None)
        workload = _workload_args(configs[0])
        specs = [c.step_spec() for c in configs]
        together = sum(p.budgeted_bytes for p in predictions) <= self.budget_bytes
        say(
            f"validating {len(configs)} config{'' if len(configs) == 1 else 's'} on {self.device} "
            f"({'interleaved' if together else 'one after the other'}, {self.warmup} warm-up + "
            f"{self.rounds} timed steps each)"
        )
        outcome = run_isolated(
            self._isolation(predictions),
            measure_configs,
            workload,
            specs,
            self.device,
            warmup=self.warmup,
            rounds=self.rounds,
            interleave=together,
        )
        if outcome.ok:
            return [
                self._within_budget(_measurement(r, c, self.device, self.name), p)
                for r, c, p in zip(outcome.value, configs, predictions, strict=True)
            ]
        if len(configs) == 1:
            return [
                Measurement(
                    status=outcome.status,
                    reason=outcome.reason,
                    device=self.device,
                    validator=self.name,
                    wall_s=outcome.wall_s,
                )
            ]
        say(
            f"the shared validation child failed ({outcome.status}: {outcome.reason}); "
            "measuring each config alone"
        )
        return [self.validate([c], [p])[0] for c, p in zip(configs, predictions, strict=True)]

    def _within_budget(self, measured: Measurement, predicted: Prediction) -> Measurement:
        """A config measured over the budget is out of memory for the plan: the user's budget
        leaves headroom the device may have, and a run that needs it does not fit.

        On CUDA the child's peak is the device footprint already (peak reserved + the CUDA
        context + the library workspaces: :func:`_memory_pass`). On CPU it is the allocator's
        peak, what the trace predicts: the process overhead the prediction counted (its
        budgeted bytes beyond the traced peak) is added, as the cap would have judged it with
        no instrument in the child; so it reads as training does (hf-gpt2-32k: 988 and 1,092
        MiB for two memory-bound configs whose `advisor train` peaked at 962-966 and
        1,085-1,097 MiB resident)."""
        traced = predicted.traced_bytes
        peak = measured.peak_memory_bytes
        if not measured.ok or peak is None:
            return measured
        if self.device.startswith("cuda"):
            total, what = (
                peak,
                f"measured peak {peak / MiB:,.0f} MiB (reserved + CUDA context + workspaces)",
            )
        elif self.device == "cpu" and traced is not None:
            overhead = predicted.budgeted_bytes - traced
            total = peak + overhead
            what = (
                f"measured peak {peak / MiB:,.0f} MiB + the process overhead "
                f"{overhead / MiB:,.0f} MiB = {total / MiB:,.0f} MiB"
            )
        else:
            return measured
        return over_budget(measured, total, what, self.budget_bytes)

    def _isolation(self, predictions: Sequence[Prediction]) -> Isolation:
        steps = self.warmup + self.rounds + 4  # + the memory pass (warm-up + measured step)
        work = sum(p.step_time_s for p in predictions) * steps
        # torch.compile: each compiled config compiles once in the child (twice: the memory pass
        # builds its step again), its measured cold compile time.
        work += sum(2 * p.compile_s for p in predictions)
        limit = (
            math.floor(self.budget_bytes * (1 + CAP_HEADROOM))
            if self.memory_limit and self.device == "cpu"
            else None
        )
        return Isolation(
            timeout_s=STARTUP_S * len(predictions) + SAFETY * work,
            memory_limit_bytes=limit,
        )


# -- the child ------------------------------------------------------------------------------------


def _workload_args(config: TrainConfig) -> dict[str, Any]:
    return {
        "model": config.model,
        "model_args": dict(config.model_args),
        "tokenizer": config.tokenizer,
    }


def measure_configs(
    workload: Mapping[str, Any],
    specs: Sequence[StepSpec],
    device: str,
    *,
    warmup: int,
    rounds: int,
    interleave: bool,
) -> list[dict[str, Any]]:
    """Runs in the isolated child: each spec's real peak memory, then its timed steps.

    Returns one plain dict per spec (status, reason, memory, samples, and the share of the
    host others took while the steps were timed). A spec whose memory pass fails is not timed.
    The child dies with the process that started it (profilers.isolate: a SIGKILLed ``advisor
    run`` left it measuring on for 30-60 s).
    """
    from advisor.workload import AdvisorWorkload

    # AdvisorWorkload satisfies the probes' Workload protocol (AdvisorStep is a TrainStep);
    # mypy cannot see it through the protocol's return type.
    w = cast(
        "Workload",
        AdvisorWorkload(
            model=workload["model"],
            model_args=workload["model_args"],
            data="synthetic",
            tokenizer=workload["tokenizer"],
        ),
    )
    from profilers.host_activity import HostMeter

    out = _memory_pass(w, specs, device)
    runnable = [i for i, r in enumerate(out) if r["status"] == "ok"]
    with HostMeter() as meter:  # what others took of the host while the steps were timed
        timed = _timing_pass(
            w, specs, device, runnable, warmup=warmup, rounds=rounds, interleave=interleave
        )
    for i, found in timed.items():
        out[i].update(found, host_others_share=meter.others_share)
    return out


def release_freed_memory() -> None:
    """Hand the heap the memory pass freed back to the system (glibc's ``malloc_trim``).

    On CPU the memory pass runs under torch.profiler, whose event records are freed when it
    ends but stay in the process's heap, and a validation child capped at the budget
    (``RLIMIT_DATA``, which counts the heap) then failed the timed steps of configs that fit:
    hf-gpt2-32k, micro-batch 8 x 2, 1,143 MiB budget, ~730 MiB a real `advisor train` holds.
    A no-op where there is no glibc.
    """
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return
    trim(0)


def _memory_pass(w: Workload, specs: Sequence[StepSpec], device: str) -> list[dict[str, Any]]:
    """Each spec's real peak memory, one step at a time: a dict per spec with its status, and
    its peak (``peak``, ``allocated``, ``kind``) or the failure's reason."""
    import torch

    from profilers.memory import measure_cpu_step_memory, measure_cuda_step_memory

    out: list[dict[str, Any]] = []
    for spec in specs:
        started = time.perf_counter()
        try:
            if device.startswith("cuda"):
                cuda = measure_cuda_step_memory(w, spec, device)
                peak = cuda.peak_reserved_bytes + cuda.context_bytes + cuda.workspace_bytes
                kind = "cuda: peak reserved + context + workspaces"
                allocated = cuda.peak_allocated_bytes
            else:
                with quiet_native_output():  # kineto prints "USDT: profiler_start/stop"
                    cpu = measure_cpu_step_memory(w, spec)
                peak = allocated = cpu.peak_bytes
                kind = "cpu: allocator peak (torch.profiler), process overhead excluded"
            out.append(
                {
                    "status": "ok",
                    "peak": peak,
                    "allocated": allocated,
                    "kind": kind,
                    "wall_s": time.perf_counter() - started,
                }
            )
        except Exception as exc:
            from profilers.isolate import classify_exception

            out.append(
                {
                    "status": classify_exception(exc),
                    "reason": describe_exception(exc),
                    "wall_s": time.perf_counter() - started,
                }
            )
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        else:
            release_freed_memory()  # before the next spec's pass and the timed steps
    return out


def _timing_pass(
    w: Workload,
    specs: Sequence[StepSpec],
    device: str,
    runnable: Sequence[int],
    *,
    warmup: int,
    rounds: int,
    interleave: bool,
) -> dict[int, dict[str, Any]]:
    """The step times of the specs at ``runnable`` (their memory pass succeeded): interleaved
    round-robin, or one after the other. Per index, what to add to that spec's dict: its
    ``samples``, or (one after the other) the failure's status and reason."""
    from profilers.throughput import measure_interleaved, time_steps

    found: dict[int, dict[str, Any]] = {}
    timed: dict[int, tuple[float, ...]] = {}
    if interleave and runnable:
        timings = measure_interleaved(
            w, [specs[i] for i in runnable], device, rounds=rounds, warmup=warmup
        )
        timed = {i: t.step_s for i, t in zip(runnable, timings, strict=True)}
    else:
        for i in runnable:
            try:
                timed[i] = time_steps(w, specs[i], device, warmup=warmup, repeats=rounds).step_s
            except Exception as exc:
                from profilers.isolate import classify_exception

                found[i] = {"status": classify_exception(exc), "reason": describe_exception(exc)}
    for i, samples in timed.items():
        found[i] = {"samples": list(samples)}
    return found


def _measurement(
    result: Mapping[str, Any], config: TrainConfig, device: str, validator: str
) -> Measurement:
    if result["status"] != "ok" or not result.get("samples"):
        return Measurement(
            status=result["status"] if result["status"] != "ok" else "error",
            reason=result.get("reason", "no timed step"),
            device=device,
            validator=validator,
            wall_s=float(result.get("wall_s", 0.0)),
        )
    samples = tuple(float(s) for s in result["samples"])
    step = statistics.median(samples)
    # One rank: its share of the global batch is all of it (world size 1).
    tokens = config.micro_batch_size * config.grad_accum_steps * config.seq_len
    return Measurement(
        status="ok",
        step_time_s=step,
        tokens_per_s=tokens / step,
        peak_memory_bytes=int(result["peak"]),
        memory_kind=str(result["kind"]),
        step_samples_s=samples,
        device=device,
        validator=validator,
        wall_s=float(result.get("wall_s", 0.0)),
        host_others_share=_share(result.get("host_others_share")),
    )


def _share(value: Any) -> float | None:
    return None if value is None else float(value)
