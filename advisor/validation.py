"""Validation: short real runs of the top predicted candidates, on the profiled device.

A :class:`Validator` turns TrainConfigs into :class:`strategies.plan.Measurement`s. The
recommendation routes each config to the first validator that accepts it
(``unsupported_reason`` returns None); a config no validator accepts is recorded
``not_validated`` with the reasons, and :func:`strategies.plan.decide` never lets it beat a
measured one. :class:`LocalValidator` runs single-device configs, :class:`LauncherValidator`
ddp/fsdp ones through torchrun, both implementing the same two methods.

LocalValidator runs every config in ONE isolated child (profilers.isolate: spawn, timeout,
memory cap): first each config's real peak memory (CPU: the allocator's own count through the
profiler, :func:`profilers.memory.measure_cpu_step_memory`; CUDA: the caching allocator plus
context and workspaces, :func:`profilers.memory.measure_cuda_step_memory`), then their step
times interleaved round-robin (:func:`profilers.throughput.measure_interleaved`: slow drift of a
shared host spreads over all configs instead of biasing one) when all of them fit in memory at
once, else one after the other. If that child fails, each config is retried in a child of its
own so one crash (an OOM the model did not predict) doesn't cost the others their measurement.

:func:`validate_rounds` is what recommend calls: every finalist once through :func:`route`, then
the close contenders (within :data:`TIE_MARGIN` of the fastest) again, at different moments and
in alternating order, their samples pooled, so that a near tie is decided by more than one
moment of a shared host.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from profilers.isolate import (
    Isolation,
    describe_exception,
    quiet_native_output,
    run_isolated,
)
from profilers.metrics_record import MetricsRecord, TrainRecord
from profilers.workload import StepSpec
from strategies.budgets import DEFAULT_VALIDATE_ROUNDS, TIE_MARGIN
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement

if TYPE_CHECKING:
    from profilers.workload import Workload

# Seconds per validated config beyond its predicted steps: child start-up and import of torch
# (~3-5 s on this 2-vCPU host), building the model, the profiler's memory pass.
_STARTUP_S = 60.0
_SAFETY = 5.0  # timeout = SAFETY × the predicted work: predictions can be off by a few ×


class Validator(Protocol):
    """Measures candidate configs for real. Contract:

    * ``unsupported_reason(config)``: None if this validator can run ``config``, else why not
      (one line, e.g. "ddp×8 needs 8 GPUs; this machine has 2"). Cheap and side-effect free.
    * ``validate(configs, predictions)``: one :class:`Measurement` per config, in order; never
      raises for a config's failure (status ``oom``/``timeout``/``error`` with the reason).
      ``predictions`` (same order) size timeouts and decide what may run side by side.
    """

    @property
    def name(self) -> str: ...

    def unsupported_reason(self, config: TrainConfig) -> str | None: ...

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]: ...


@dataclass(frozen=True, kw_only=True)
class LocalValidator:
    """Single-device validation on ``device`` ("cpu" or "cuda[:i]")."""

    device: str
    budget_bytes: int
    warmup: int = 2
    rounds: int = 3
    memory_limit: bool = True  # cap the child (CPU RAM) at the budget
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
            f"validating {len(configs)} configs on {self.device} "
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
                _measurement(r, c, self.device, self.name)
                for r, c in zip(outcome.value, configs, strict=True)
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

    def _isolation(self, predictions: Sequence[Prediction]) -> Isolation:
        steps = self.warmup + self.rounds + 4  # + the memory pass (warm-up + measured step)
        work = sum(p.step_time_s for p in predictions) * steps
        limit = self.budget_bytes if self.memory_limit and self.device == "cpu" else None
        return Isolation(
            timeout_s=_STARTUP_S * len(predictions) + _SAFETY * work,
            memory_limit_bytes=limit,
        )


@dataclass(frozen=True, kw_only=True)
class Unvalidated:
    """The validator of last resort: records why nobody could measure a config."""

    reason: str
    name: str = "none"

    def unsupported_reason(self, config: TrainConfig) -> str | None:
        return None

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]:
        return [Measurement(status="not_validated", reason=self.reason) for _ in configs]


def route(
    configs: Sequence[TrainConfig],
    predictions: Sequence[Prediction],
    validators: Sequence[Validator],
) -> list[Measurement]:
    """Measure each config with the first validator that accepts it (batched per validator)."""
    results: list[Measurement | None] = [None] * len(configs)
    batches: dict[int, list[int]] = {}
    for i, config in enumerate(configs):
        refusals = []
        for j, validator in enumerate(validators):
            why = validator.unsupported_reason(config)
            if why is None:
                batches.setdefault(j, []).append(i)
                break
            refusals.append(why)
        else:
            reason = "; ".join(refusals) or "no validator"
            results[i] = Measurement(status="not_validated", reason=reason)
    for j, indices in batches.items():
        measured = validators[j].validate(
            [configs[i] for i in indices], [predictions[i] for i in indices]
        )
        for i, m in zip(indices, measured, strict=True):
            results[i] = m
    return [m if m is not None else Measurement(status="error", reason="lost") for m in results]


# -- close contenders: more visits, at different moments ---------------------------------------
# (TIE_MARGIN and DEFAULT_VALIDATE_ROUNDS, with their measurements: strategies.budgets)


def merge_measurements(first: Measurement, again: Measurement) -> Measurement:
    """One measurement from two visits of the same config: the samples pooled (throughput from
    their median), the larger memory peak, the walls summed. A failed visit wins: a config that
    ran out of memory or crashed once is not one to recommend."""
    visits = first.visits + again.visits
    wall = first.wall_s + again.wall_s
    if not first.ok:
        return dataclasses.replace(first, visits=visits, wall_s=wall)
    if not again.ok:
        reason = f"visit {visits}: {again.reason}"
        if first.tokens_per_s:
            reason += f" (earlier visits measured {first.tokens_per_s:,.0f} tok/s)"
        return dataclasses.replace(again, reason=reason, visits=visits, wall_s=wall)
    assert first.step_time_s and first.tokens_per_s
    tokens_per_step = first.tokens_per_s * first.step_time_s
    samples = first.step_samples_s + again.step_samples_s
    step = statistics.median(samples)
    return dataclasses.replace(
        first,
        step_time_s=step,
        tokens_per_s=tokens_per_step / step,
        peak_memory_bytes=max(first.peak_memory_bytes or 0, again.peak_memory_bytes or 0),
        step_samples_s=samples,
        wall_s=wall,
        visits=visits,
    )


def contenders(measurements: Sequence[Measurement], margin: float = TIE_MARGIN) -> list[int]:
    """Indices of the measured configs within ``margin`` of the fastest, fastest first."""
    ok = [(m.tokens_per_s or 0.0, i) for i, m in enumerate(measurements) if m.ok]
    if not ok:
        return []
    best = max(t for t, _ in ok)
    return [i for t, i in sorted(ok, reverse=True) if t >= (1.0 - margin) * best]


def validate_rounds(
    configs: Sequence[TrainConfig],
    predictions: Sequence[Prediction],
    validators: Sequence[Validator],
    *,
    rounds: int = DEFAULT_VALIDATE_ROUNDS,
    margin: float = TIE_MARGIN,
    progress: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """:func:`route` every config once, then up to ``rounds - 1`` more visits of the close
    contenders (within ``margin`` of the fastest), each round in the reverse order of the one
    before, samples pooled.

    One short visit measures the host's state at that moment as much as the config: two configs
    a few percent apart can swap places from one minute to the next (a multi-threaded process
    suffers more from a busy neighbour than single-threaded ranks do). Visiting the contenders
    again, in reverse order each round, spreads that drift over all of them, like the
    profiler's interleaved timing does within one process. Stops early when a round leaves
    fewer than two contenders (one candidate clearly ahead).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    say = progress or (lambda _m: None)
    results = route(configs, predictions, validators)
    order = list(range(len(configs)))
    for r in range(1, rounds):
        close = set(contenders(results, margin))
        if len(close) < 2:
            break
        order = [i for i in reversed(order) if i in close]
        say(
            f"validation round {r + 1}/{rounds}: {len(close)} configs within {margin:.0%} of "
            "the fastest, measuring them again"
        )
        again = route([configs[i] for i in order], [predictions[i] for i in order], validators)
        for i, m in zip(order, again, strict=True):
            results[i] = merge_measurements(results[i], m)
    return results


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

    Returns one plain dict per spec (status, reason, memory, samples). A spec whose memory pass
    fails is not timed.
    """
    import torch

    from advisor.workload import AdvisorWorkload
    from profilers.memory import measure_cpu_step_memory, measure_cuda_step_memory
    from profilers.throughput import measure_interleaved, time_steps

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
    runnable = [i for i, r in enumerate(out) if r["status"] == "ok"]
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

                out[i].update(status=classify_exception(exc), reason=describe_exception(exc))
    for i, samples in timed.items():
        out[i]["samples"] = list(samples)
    return out


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
    )


# -- distributed candidates: short real runs through the launcher --------------------------------


@dataclass(frozen=True, kw_only=True)
class LauncherValidator:
    """ddp/fsdp validation: a short ``advisor train`` of each config through torchrun.

    The very code path the plan will run (launcher, process group, wrappers, real data). Step
    time is the median ``step_time_s`` of the steps after ``warmup``; memory is the largest
    per-rank peak of those steps: CUDA ``max_memory_allocated`` (like for like with the
    traced peak), CPU the rank's resident peak minus the profiled per-process overhead
    (``fixed_overhead_bytes``: interpreter and libraries; ``parallel_overhead_bytes``: a rank's
    process group and wrapper modules, per parallelism), so it too compares with the trace.
    """

    device: str  # "cpu" or "cuda"
    max_world_size: int
    fixed_overhead_bytes: int = 0
    parallel_overhead_bytes: Mapping[str, int] = field(default_factory=dict)
    warmup: int = 2
    rounds: int = 3
    progress: Callable[[str], None] | None = field(default=None, compare=False)
    name: str = "torchrun"

    def unsupported_reason(self, config: TrainConfig) -> str | None:
        if config.parallelism == "single":
            return "single-device configs are measured by the local validator"
        if config.world_size > self.max_world_size:
            return (
                f"{config.parallelism}×{config.world_size} needs {config.world_size} "
                f"{'GPUs' if self.device.startswith('cuda') else 'cores'}; this machine has "
                f"{self.max_world_size}"
            )
        return None

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]:
        return [self._one(c, p) for c, p in zip(configs, predictions, strict=True)]

    def _one(self, config: TrainConfig, prediction: Prediction) -> Measurement:
        import json
        import subprocess
        import tempfile
        from pathlib import Path

        from advisor.trainer.options import RunOptions
        from profilers.metrics_record import read_metrics
        from profilers.rundir import TrainDir

        say = self.progress or (lambda _m: None)
        steps = self.warmup + self.rounds
        say(
            f"validating {config.parallelism}×{config.world_size} through torchrun "
            f"({self.warmup} warm-up + {self.rounds} timed steps)"
        )
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="advisor-validate-") as tmp:
            out = Path(tmp) / "run"
            plan = Path(tmp) / "config.json"
            plan.write_text(json.dumps({"config": config.to_dict()}))
            # No evaluation, no checkpoint before the end: only the steps are measured.
            options = RunOptions(
                out=out,
                steps=steps,
                eval_every=0,
                eval_batches=1,
                checkpoint_every=10**9,
                keep_checkpoints=1,
                device=self.device.split(":")[0],
                progress=False,
            )
            command = [sys.executable, "-m", "advisor", *options.train_args(plan)]
            timeout = _STARTUP_S * 2 + _SAFETY * steps * prediction.step_time_s
            try:
                done = subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            except subprocess.TimeoutExpired:
                return Measurement(
                    status="timeout",
                    reason=f"no result after {timeout:.0f} s",
                    device=self.device,
                    validator=self.name,
                    wall_s=time.perf_counter() - started,
                )
            wall = time.perf_counter() - started
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines()
                reason = lines[-1].removeprefix("error: ") if lines else f"exit {done.returncode}"
                status = "oom" if "out of memory" in reason.lower() else "error"
                return Measurement(
                    status=status,
                    reason=reason[:300],
                    device=self.device,
                    validator=self.name,
                    wall_s=wall,
                )
            records = read_metrics(TrainDir(out).metrics).records
        return self.measurement(config, records, wall)

    def measurement(
        self, config: TrainConfig, records: Sequence[MetricsRecord], wall: float
    ) -> Measurement:
        """The measurement of one run from its metrics.jsonl records."""
        train = [
            r
            for r in records
            if isinstance(r, TrainRecord)
            and r.step > self.warmup
            and r.step_time_s is not None
            and r.peak_memory_bytes is not None
        ]
        if not train:
            return Measurement(
                status="error",
                reason="the run logged no timed step",
                device=self.device,
                validator=self.name,
                wall_s=wall,
            )
        samples = tuple(float(r.step_time_s or 0.0) for r in train)
        median = statistics.median(samples)
        peak = max(int(r.peak_memory_bytes or 0) for r in train)
        if self.device.startswith("cuda"):
            kind = "cuda: max_memory_allocated, largest rank"
        else:
            overhead = self.fixed_overhead_bytes
            overhead += self.parallel_overhead_bytes.get(config.parallelism, 0)
            peak = max(0, peak - overhead)
            kind = "cpu: largest rank's resident peak minus the profiled process overheads"
        return Measurement(
            status="ok",
            step_time_s=median,
            tokens_per_s=config.tokens_per_step / median,
            peak_memory_bytes=peak,
            memory_kind=kind,
            step_samples_s=samples,
            device=self.device,
            validator=self.name,
            wall_s=wall,
        )
