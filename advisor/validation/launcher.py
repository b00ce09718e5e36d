"""The launcher validator: ddp/fsdp configs measured by a short ``advisor train`` under torchrun."""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from advisor.validation.validator import SAFETY, STARTUP_S, over_budget
from profilers.host_activity import HostMeter
from profilers.metrics_record import MetricsRecord, TrainRecord
from profilers.orphans import kill_with_parent
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement
from strategies.prediction import MiB


@dataclass(frozen=True, kw_only=True)
class LauncherValidator:
    """ddp/fsdp validation: a short ``advisor train`` of each config through torchrun.

    The very code path the plan will run (launcher, process group, wrappers, real data). Step
    time is the median ``step_time_s`` of the steps after ``warmup``; memory is the largest
    per-rank peak of those steps: CUDA ``max_memory_allocated`` (like for like with the
    traced peak), CPU the rank's resident peak minus the profiled per-process overhead
    (``fixed_overhead_bytes``: interpreter and libraries; ``parallel_overhead_bytes``: a rank's
    process group and wrapper modules, per parallelism), so it too compares with the trace.

    With ``budget_bytes`` a run that held more than the budget is "oom" for the plan, judged
    as the prediction's budgeted bytes are: on CUDA the largest rank's allocated peak plus the
    overheads the prediction counted beyond its trace (fragmentation, context, per-rank
    extras); on a CPU host every rank's resident peak added up (they share its RAM; 0.87-1.25x
    the prediction's budgeted bytes over five regret sessions' ddp/fsdp runs).
    """

    device: str  # "cpu" or "cuda"
    max_world_size: int
    fixed_overhead_bytes: int = 0
    parallel_overhead_bytes: Mapping[str, int] = field(default_factory=dict)
    budget_bytes: int | None = None  # None: no over-budget check (the regret benchmark's reads)
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
            timeout = STARTUP_S * 2 + SAFETY * steps * prediction.step_time_s
            timeout += SAFETY * prediction.compile_s  # torch.compile: paid in the first step
            meter = HostMeter()
            log = Path(tmp) / "stderr.log"
            try:
                # Its stderr goes to a file, not a pipe, and it dies with this process
                # (orphans.kill_with_parent; its ranks die with it): a SIGKILLed 'advisor run'
                # left it measuring on, writing into a pipe nobody read.
                with meter, open(log, "w") as err:  # closes after the run and its ranks
                    done = subprocess.run(
                        command,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        timeout=timeout,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"},
                        preexec_fn=kill_with_parent(),
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
                lines = log.read_text(errors="replace").strip().splitlines()
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
        measured = self.measurement(config, records, wall)
        measured = dataclasses.replace(measured, host_others_share=meter.others_share)
        return self._within_budget(measured, records, config, prediction)

    def _within_budget(
        self,
        measured: Measurement,
        records: Sequence[MetricsRecord],
        config: TrainConfig,
        predicted: Prediction,
    ) -> Measurement:
        """``measured`` as "oom" when the run held more than ``budget_bytes`` (class doc)."""
        if self.budget_bytes is None or not measured.ok:
            return measured
        timed = self._timed(records)
        if not timed:
            return measured
        if self.device.startswith("cuda"):
            peak = max(int(r.peak_memory_bytes or 0) for r in timed)
            traced = predicted.traced_bytes
            overhead = predicted.peak_memory_bytes - traced if traced is not None else 0
            total = peak + max(0, overhead)
            what = (
                f"largest rank's allocated peak {peak / MiB:,.0f} MiB + the overheads predicted "
                f"beyond the trace {max(0, overhead) / MiB:,.0f} MiB = {total / MiB:,.0f} MiB"
            )
        else:
            ranks = [
                sum(r.peak_memory_bytes_per_rank)
                if r.peak_memory_bytes_per_rank
                else int(r.peak_memory_bytes or 0) * config.world_size  # the largest, each
                for r in timed
            ]
            total = max(ranks)
            what = f"the ranks' resident peaks together {total / MiB:,.0f} MiB"
        return over_budget(measured, total, what, self.budget_bytes)

    def _timed(self, records: Sequence[MetricsRecord]) -> list[TrainRecord]:
        """The steps after the warm-up that logged a step time and a peak."""
        return [
            r
            for r in records
            if isinstance(r, TrainRecord)
            and r.step > self.warmup
            and r.step_time_s is not None
            and r.peak_memory_bytes is not None
        ]

    def measurement(
        self, config: TrainConfig, records: Sequence[MetricsRecord], wall: float
    ) -> Measurement:
        """The measurement of one run from its metrics.jsonl records."""
        train = self._timed(records)
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
