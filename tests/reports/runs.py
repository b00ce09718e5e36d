"""Run directories for the report tests: hand-made (milliseconds, every section) and one real
``advisor run`` per session (tiny settings), shared by tests/reports and tests/advisor."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from advisor.cli import main
from advisor.recommending import recommend
from profilers.comm_records import CommSample
from profilers.memory_records import MemoryBreakdown, MemoryTrace
from profilers.profile_record import ProbeRow
from profilers.workload import StepSpec
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement
from strategies.space import SearchRequest
from tests.strategies.profiles import ADAM_BYTES, GRAD_BYTES, PARAM_BYTES, SEQ_LEN, hand_profile

MiB = 2**20
HOSTILE_MODEL = "x.py:<script>alert(1)</script>"


class FakeValidator:
    """Measures every config at 90% of its predicted throughput, 2% above its traced memory.
    A subclass changes :meth:`measure`."""

    name = "fake"

    def unsupported_reason(self, config: TrainConfig) -> str | None:
        return None

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]:
        return [self.measure(c, p) for c, p in zip(configs, predictions, strict=True)]

    def measure(self, config: TrainConfig, p: Prediction) -> Measurement:
        traced = p.traced_bytes or 0
        return Measurement(
            status="ok",
            step_time_s=p.step_time_s / 0.9,
            tokens_per_s=p.tokens_per_s * 0.9,
            peak_memory_bytes=int(traced * 1.02),
            memory_kind="fake: allocator peak",
            step_samples_s=(p.step_time_s / 0.9,) * 3,
            device="cpu",
            validator=self.name,
        )


def _trace(precision: str, checkpointing: str, micro: int, accum: int = 1) -> MemoryTrace:
    activations = {"none": 10, "full": 2.5}[checkpointing] * 10**6 * micro
    fb = MemoryBreakdown(
        parameters=PARAM_BYTES,
        gradients=GRAD_BYTES // 2 if accum > 1 else 0,
        optimizer_state=ADAM_BYTES,
        activations=int(activations * 0.8),
        temporaries=int(activations * 0.2),
    )
    spec = StepSpec(
        seq_len=SEQ_LEN,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        precision=precision,
        activation_checkpointing=checkpointing,
    )
    total = fb.total
    return MemoryTrace(
        spec=spec,
        target_device_type="cpu",
        peak_bytes=total,
        forward_backward_peak_bytes=total,
        optimizer_step_peak_bytes=PARAM_BYTES + GRAD_BYTES + ADAM_BYTES,
        forward_backward_breakdown=fb,
        optimizer_step_breakdown=fb,
        parameter_bytes=PARAM_BYTES,
        gradient_bytes=GRAD_BYTES,
        optimizer_state_bytes=ADAM_BYTES,
        resident_bytes=PARAM_BYTES + ADAM_BYTES,
        trace_seconds=0.1,
    )


def _comm_samples() -> tuple[CommSample, ...]:
    out = []
    for collective in ("all_reduce", "all_gather"):
        for size in (2**10, 2**16, 2**20, 2**24):
            out.append(
                CommSample(
                    backend="gloo",
                    device_type="cpu",
                    collective=collective,
                    world_size=2,
                    bytes=size,
                    time_s=(1e-4 + size / 2e9,) * 3,
                    iters_per_sample=4,
                )
            )
    return tuple(out)


def make_hand_run(
    root: Path,
    *,
    model: str = "gpt-tiny",
    plan: bool = True,
    steps: int | None = 40,
    total_steps: int | None = None,
) -> Path:
    """profile.json (+ probes.csv) from the hand profile, a plan searched by the real
    strategies with a fake validator, and a hand-written training run of ``steps`` steps."""
    profile = hand_profile(model=model, fixed_bytes=300 * MiB)
    probes = (
        ProbeRow(probe="device", name="test CPU", status="ok", wall_s=1.0),
        ProbeRow(probe="memory", name="fp32/none/b=1", status="ok", wall_s=0.5),
        ProbeRow(
            probe="throughput",
            name="bf16/full/b=1",
            status="skipped",
            reason="time budget spent",
        ),
        ProbeRow(probe="communication", name="communication", status="ok", wall_s=3.0),
    )
    traces = tuple(
        _trace(p, c, b, a)
        for p in ("fp32", "bf16")
        for c in ("none", "full")
        for b, a in ((1, 1), (4, 1), (1, 2))
    )
    profile = dataclasses.replace(
        profile,
        memory=traces,
        communication=_comm_samples(),
        probes=probes,
        created="2026-01-01T00:00:00+00:00",
        tool={"advisor": "0.1.0", "torch": "2.13.0+cpu", "python": "3.11"},
        budget_s=60.0,
        elapsed_s=42.0,
    )
    root.mkdir(parents=True, exist_ok=True)
    profile.save(root)
    if not plan:
        return root
    result = recommend(
        root / "profile.json",
        SearchRequest(global_batch_size=8),
        validate_top_k=2,
        out=root,
        validators=[FakeValidator()],
    )
    if steps is not None:
        write_training(root / "train", result.config, steps, total_steps or steps)
    return root


def write_training(out: Path, config: TrainConfig, steps: int, total_steps: int) -> None:
    """metrics.jsonl and train_config.json as the trainer writes them (a CPU run)."""
    out.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, Any]] = []
    tokens_per_step = config.global_batch_size * config.seq_len
    for step in range(1, steps + 1):
        tokens_per_s = 500.0 if step == 1 else 1000.0 + (step % 3)
        lines.append(
            {
                "kind": "train",
                "step": step,
                "loss": 5.5 * math.exp(-step / 20) + 1.0,
                "lr": 1e-3 * min(1.0, step / 10),
                "grad_norm": 1.0,
                "tokens": step * tokens_per_step,
                "step_time_s": tokens_per_step / tokens_per_s,
                "data_time_s": 0.001,
                "tokens_per_s": tokens_per_s,
                "peak_memory_bytes": 400 * MiB + step,
                "peak_memory_kind": "cpu_peak_rss",
                "mfu": None,
                "skipped_steps": 0,
                "elapsed_s": step * 1.0,
            }
        )
        if step % 10 == 0:
            lines.append({"kind": "eval", "step": step, "eval_loss": 3.0 - step / 100, "tokens": 0})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (out / "train_config.json").write_text(
        json.dumps(
            {
                "config": config.to_dict(),
                "total_steps": total_steps,
                "device": "cpu",
                "data": "synthetic tokens",
            }
        )
    )
    (out / "checkpoints" / f"step_{steps:08d}").mkdir(parents=True)


# -- one real run per session ---------------------------------------------------------------------

REAL_RUN_ARGS = (
    "--model-arg",
    "n_layer=1",
    "--budget-s",
    "30",
    "--global-batch-size",
    "4",
    "--steps",
    "6",
    "--validate-top",
    "1",
    "--no-comm",
    "--eval-every",
    "3",
    "--quiet",
)


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What the tests read of the real run's CliRunner result (kept on disk: it is shared)."""

    exit_code: int
    output: str
    stdout: str
    exception: str


def real_run(base: Path) -> tuple[Path, RunOutcome]:
    """``advisor run`` with tiny settings (about a minute on 2 cores), once per test session:
    ``base`` is the session's temporary directory (``tmp_path_factory.getbasetemp()``); under
    pytest-xdist its parent is shared by the workers, and the first to ask runs it (under a
    lock) while the others wait and read its result."""
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, record = root / "real-run", root / "real-run.json"
    with open(root / "real-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            result = CliRunner().invoke(main, ["run", *REAL_RUN_ARGS, "--out", str(out)])
            outcome = RunOutcome(
                exit_code=result.exit_code,
                output=result.output,
                stdout=result.stdout,
                exception=repr(result.exception) if result.exception else "",
            )
            record.write_text(json.dumps(dataclasses.asdict(outcome)))
    return out, RunOutcome(**json.loads(record.read_text()))
