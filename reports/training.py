"""Training curves from metrics.jsonl, and how the run compares with the plan's prediction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reports import fmt
from reports.candidates import ValidationRow
from reports.charts import Chart, Series, nonempty
from reports.common import candidate_key, mapping, median, plan_candidate, short_label, steady_state
from reports.fmt import GiB, MiB, num
from reports.model import Fact, Section
from reports.runfiles import RunFiles

MEMORY_KINDS = {
    "cpu_peak_rss": "process resident-set peak (VmHWM): includes the Python runtime and libraries",
    "cpu_max_rss_lifetime": "process lifetime maximum RSS: includes the Python runtime",
    "cuda_max_allocated": "CUDA caching allocator max_memory_allocated (tensor memory)",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingStats:
    steps: int
    total_steps: int | None
    tokens: int
    first_loss: float | None
    last_loss: float | None
    last_eval_loss: float | None
    median_tokens_per_s: float | None
    median_step_time_s: float | None
    peak_memory_bytes: int | None
    memory_kind: str
    elapsed_s: float | None
    skipped_steps: int
    median_mfu: float | None
    num_checkpoints: int

    @property
    def complete(self) -> bool:
        return self.total_steps is not None and self.steps >= self.total_steps


def training_stats(run: RunFiles) -> TrainingStats | None:
    train = run.train_records
    if not train:
        return None
    last = train[-1]
    evals = run.eval_records
    memory = [int(v) for r in train if (v := num(r.get("peak_memory_bytes"))) is not None]
    mfu = steady_state(train, "mfu")
    checkpoints = 0
    if run.train_dir is not None and (run.train_dir / "checkpoints").is_dir():
        checkpoints = sum(
            1 for p in Path(run.train_dir / "checkpoints").iterdir() if p.name.startswith("step_")
        )
    total = num(mapping(run.train_config).get("total_steps"))
    return TrainingStats(
        steps=int(num(last.get("step")) or len(train)),
        total_steps=int(total) if total is not None else None,
        tokens=int(num(last.get("tokens")) or 0),
        first_loss=num(train[0].get("loss")),
        last_loss=num(last.get("loss")),
        last_eval_loss=num(evals[-1].get("eval_loss")) if evals else None,
        median_tokens_per_s=median(steady_state(train, "tokens_per_s")),
        median_step_time_s=median(steady_state(train, "step_time_s")),
        peak_memory_bytes=max(memory) if memory else None,
        memory_kind=str(last.get("peak_memory_kind") or ""),
        elapsed_s=num(last.get("elapsed_s")),
        skipped_steps=int(num(last.get("skipped_steps")) or 0),
        median_mfu=median(mfu),
        num_checkpoints=checkpoints,
    )


def training_validation(
    stats: TrainingStats | None, plan: Mapping[str, Any] | None, config: Mapping[str, Any]
) -> ValidationRow | None:
    """The training run as one more measurement of the plan's config (when it ran that config)."""
    if stats is None or not plan:
        return None
    c = plan_candidate(plan)
    if candidate_key(c) != candidate_key(config):
        return None  # trained with other knobs than the plan chose: not comparable
    p = mapping(plan.get("predicted"))
    memory = mapping(mapping(p.get("breakdown")).get("memory"))
    # CPU: the resident peak includes what the cost model adds as fixed overhead, so it compares
    # with the full per-rank prediction; CUDA max_memory_allocated with the traced peak.
    if stats.memory_kind.startswith("cpu"):
        predicted_memory = num(p.get("peak_memory_bytes"))
    else:
        predicted_memory = num(memory.get("traced_bytes"))
    return ValidationRow(
        key=candidate_key(c),
        label=short_label(c),
        role="training",
        status="ok",
        reason="",
        predicted_tokens_per_s=num(p.get("tokens_per_s")),
        measured_tokens_per_s=stats.median_tokens_per_s,
        predicted_step_time_s=num(p.get("step_time_s")),
        measured_step_time_s=stats.median_step_time_s,
        predicted_memory_bytes=predicted_memory,
        measured_memory_bytes=stats.peak_memory_bytes,
        memory_kind=MEMORY_KINDS.get(stats.memory_kind, stats.memory_kind),
    )


def _series(
    records: Sequence[Mapping[str, Any]], key: str, label: str, role: str, scale: float = 1.0
) -> Series:
    points = tuple(
        (float(r["step"]), round(v / scale, 6))
        for r in records
        if num(r.get("step")) is not None and (v := num(r.get(key))) is not None
    )
    return Series(label=label, role=role, points=points)


def _flat(label: str, role: str, steps: Sequence[float], value: float | None) -> Series | None:
    if value is None or not steps:
        return None
    return Series(label=label, role=role, points=((min(steps), value), (max(steps), value)))


def gemm_utilisation(
    records: Sequence[Mapping[str, Any]],
    profile: Mapping[str, Any] | None,
    config: Mapping[str, Any],
) -> Series | None:
    """Model FLOP/s over the profile's MEASURED GEMM rate at the run's precision: a utilisation
    that exists where no datasheet peak does (CPUs), labelled as such — never called MFU."""
    if not profile:
        return None
    device = mapping(profile.get("device"))
    flops = mapping(mapping(profile.get("model")).get("flops"))
    per_token = num(flops.get("formula_flops_per_token"))
    bench = mapping(mapping(device.get("matmul")).get(str(config.get("precision", "fp32"))))
    gemm = num(bench.get("rate"))
    world = max(int(num(config.get("world_size")) or 1), 1)
    if not per_token or not gemm:
        return None
    points = tuple(
        (float(r["step"]), round(tps / world * per_token / gemm, 6))
        for r in records
        if (tps := num(r.get("tokens_per_s"))) is not None and num(r.get("step")) is not None
    )
    return Series(label="model FLOP/s ÷ measured GEMM FLOP/s", role="gemm", points=points)


def training_section(
    run: RunFiles, plan: Mapping[str, Any] | None, stats: TrainingStats | None
) -> Section:
    if stats is None:
        note = (
            "No training yet: run 'advisor train --plan RUN/plan.json --out RUN/train' "
            "(or 'advisor run --out RUN --resume')."
            if plan
            else "No training yet."
        )
        return Section(id="training", title="Training", note=note)
    train, evals = run.train_records, run.eval_records
    config = mapping(mapping(run.train_config).get("config")) or mapping(
        mapping(plan).get("config")
    )
    steps = [float(s) for r in train if (s := num(r.get("step"))) is not None]
    predicted = mapping(mapping(plan).get("predicted")) if plan else {}
    same_config = plan is not None and candidate_key(plan_candidate(plan)) == candidate_key(config)
    charts: list[Chart] = []
    charts.append(
        Chart(
            id="train-loss",
            title="Loss",
            kind="line",
            x_label="step",
            y_label="loss",
            series=(
                _series(train, "loss", "train", "train"),
                _series(evals, "eval_loss", "eval (held-out)", "eval"),
            ),
        )
    )
    throughput = [_series(train, "tokens_per_s", "tokens/s", "train")]
    if same_config and (
        flat := _flat("predicted", "predicted", steps, num(predicted.get("tokens_per_s")))
    ):
        throughput.append(flat)
    charts.append(
        Chart(
            id="train-throughput",
            title="Throughput",
            kind="line",
            x_label="step",
            y_label="tokens/s",
            series=tuple(throughput),
            y_min=0,
        )
    )
    mfu_series = [s for s in (_series(train, "mfu", "MFU (datasheet peak)", "mfu"),) if s.points]
    above_one = False
    if (gemm := gemm_utilisation(train, run.profile, config)) is not None and gemm.points:
        mfu_series.append(gemm)
        above_one = any((y or 0.0) > 1 for _x, y in gemm.points)
    mfu_note = ""
    if not any(s.role == "mfu" for s in mfu_series):
        mfu_note = (
            "MFU needs the device's datasheet peak, which is unknown here (CPUs and unlisted "
            "GPUs): shown instead is model FLOP/s over the GEMM rate measured by the profile."
        )
    if mfu_series:
        charts.append(
            Chart(
                id="train-mfu",
                title="Model FLOPs utilisation",
                kind="line",
                x_label="step",
                y_label="fraction",
                series=tuple(mfu_series),
                y_min=0,
                caption=mfu_note + " Model FLOPs: 6N + 12·L·H·Q·T per token (PaLM, App. B).",
            )
        )
    memory = [int(v) for r in train if (v := num(r.get("peak_memory_bytes"))) is not None]
    if memory:
        unit, scale = ("GiB", GiB) if max(memory) >= GiB else ("MiB", MiB)
        series = [_series(train, "peak_memory_bytes", "peak per step", "train", scale)]
        if same_config:
            kind_cpu = stats.memory_kind.startswith("cpu")
            m = mapping(mapping(predicted.get("breakdown")).get("memory"))
            value = num(predicted.get("peak_memory_bytes") if kind_cpu else m.get("traced_bytes"))
            if value is not None and (
                flat := _flat("predicted", "predicted", steps, round(value / scale, 4))
            ):
                series.append(flat)
        charts.append(
            Chart(
                id="train-memory",
                title="Peak memory",
                kind="line",
                x_label="step",
                y_label=unit,
                series=tuple(series),
                y_min=0,
                caption=MEMORY_KINDS.get(stats.memory_kind, stats.memory_kind),
            )
        )
    charts.append(
        Chart(
            id="train-lr",
            title="Learning rate",
            kind="line",
            x_label="step",
            y_label="lr",
            series=(_series(train, "lr", "learning rate", "lr"),),
            y_min=0,
        )
    )
    facts = [
        Fact(
            label="steps",
            value=f"{stats.steps}" + (f" of {stats.total_steps}" if stats.total_steps else ""),
            hint="" if stats.complete or stats.total_steps is None else "incomplete: resume it",
        ),
        Fact(label="tokens", value=fmt.count(stats.tokens)),
        Fact(
            label="loss",
            value=f"{stats.first_loss:.3f} → {stats.last_loss:.3f}"
            if stats.first_loss is not None and stats.last_loss is not None
            else fmt.DASH,
        ),
        Fact(
            label="eval loss",
            value=f"{stats.last_eval_loss:.3f}" if stats.last_eval_loss is not None else fmt.DASH,
        ),
        Fact(
            label="median throughput",
            value=fmt.rate(stats.median_tokens_per_s),
            hint="after warm-up",
        ),
        Fact(
            label="peak memory",
            value=fmt.size(stats.peak_memory_bytes),
            hint=MEMORY_KINDS.get(stats.memory_kind, stats.memory_kind),
        ),
        Fact(label="wall time", value=fmt.seconds(stats.elapsed_s)),
        Fact(label="checkpoints kept", value=str(stats.num_checkpoints)),
    ]
    if stats.median_mfu is not None:
        facts.append(Fact(label="median MFU", value=fmt.percent(stats.median_mfu)))
    if stats.skipped_steps:
        facts.append(Fact(label="fp16 overflow skips", value=str(stats.skipped_steps)))
    data = mapping(run.train_config).get("data")
    if data:
        facts.append(Fact(label="data", value=str(data)))
    bullets = []
    if above_one:
        load = num(mapping(mapping(run.profile).get("device")).get("host_load_1m"))
        bullets.append(
            "Model FLOP/s exceed the profile's GEMM rate at some steps: the benchmark ran while "
            "the host was busier"
            + (f" (load {load:.2f} when profiled)" if load is not None else "")
            + ": the ratio overstates how much of the device the model used."
        )
    if not mfu_series:
        bullets.append(
            "MFU is unknown: it needs the device's datasheet peak (none for CPUs and unlisted "
            "GPUs), and the profile measured no GEMM rate to compare with instead."
        )
    lead = []
    if not same_config and plan is not None:
        lead.append(
            "This training run used other knobs than the plan chose: no prediction is drawn."
        )
    return Section(
        id="training",
        title="Training",
        lead=tuple(lead),
        facts=tuple(facts),
        bullets=tuple(bullets),
        charts=nonempty(charts),
    )
