"""Training curves from metrics.jsonl, and how the run compares with the plan's prediction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import reports.fmt as fmt
from profilers.metrics_record import EvalRecord, MetricsRecord, TrainRecord
from profilers.rundir import PLAN, TUNED_PLAN, TrainDir
from reports.candidates import ValidationRow
from reports.charts import Chart, Series, nonempty
from reports.common import (
    candidate,
    mapping,
    median,
    plan_candidate,
    prediction,
    same_candidate,
    setting_differences,
    steady_state,
    trained_elsewhere,
    whatif_target,
)
from reports.fmt import GiB, MiB, num
from reports.model import Fact, Section
from reports.runfiles import RunFiles
from strategies.prediction import Prediction
from strategies.space import Candidate

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
    # The step whose loss became NaN/inf: the trainer logs it (loss not finite) and stops.
    diverged_step: int | None = None
    # Timed steps, and how many of them the medians keep (all of a run of 3 steps or fewer:
    # then they include the warm-up step, which pays for allocation and lazy initialisation).
    timed_steps: int = 0
    steady_steps: int = 0

    @property
    def complete(self) -> bool:
        return self.total_steps is not None and self.steps >= self.total_steps

    @property
    def warmup_included(self) -> bool:
        """Whether the medians include the warm-up step: too short a run to leave it out, so
        they are no steady rate to hold a prediction against (audit 42, D17)."""
        return self.timed_steps > 0 and self.steady_steps >= self.timed_steps

    def rate_text(self) -> str:
        """The median throughput as the page gives it: with what it includes when the run was
        too short for a steady rate."""
        text = fmt.rate(self.median_tokens_per_s)
        if self.median_tokens_per_s is not None and self.warmup_included:
            text += f" ({steps_text(self.timed_steps)}, warm-up included)"
        return text


def steps_text(n: int) -> str:
    return "1 step" if n == 1 else f"{n} steps"


def diverged_step(run: RunFiles) -> int | None:
    """The step at which the run's loss became NaN/inf: its last step line has no finite loss
    (the trainer writes that line, then stops; since 2026-12-07)."""
    steps = run.metrics.train
    if steps and steps[-1].loss is None and steps[-1].step:
        return steps[-1].step
    return None


def training_stats(run: RunFiles) -> TrainingStats | None:
    train = run.train_records
    diverged = diverged_step(run)
    if not train:
        if diverged is None:
            return None
        total = num(mapping(run.train_config).get("total_steps"))
        return TrainingStats(  # diverged at its first step: nothing was measured before it
            steps=0,
            total_steps=int(total) if total is not None else None,
            tokens=0,
            first_loss=None,
            last_loss=None,
            last_eval_loss=None,
            median_tokens_per_s=None,
            median_step_time_s=None,
            peak_memory_bytes=None,
            memory_kind="",
            elapsed_s=None,
            skipped_steps=0,
            median_mfu=None,
            num_checkpoints=0,
            diverged_step=diverged,
        )
    last = train[-1]
    evals = run.eval_records
    memory = [r.peak_memory_bytes for r in train if r.peak_memory_bytes is not None]
    checkpoints = len(TrainDir(run.train_dir).checkpoint_dirs()) if run.train_dir else 0
    total = num(mapping(run.train_config).get("total_steps"))
    timed = [v for r in train if (v := num(r.tokens_per_s)) is not None]
    return TrainingStats(
        timed_steps=len(timed),
        steady_steps=len(steady_state(train, "tokens_per_s")),
        steps=last.step or len(train),
        total_steps=int(total) if total is not None else None,
        tokens=last.tokens or 0,
        first_loss=train[0].loss,
        last_loss=last.loss,
        last_eval_loss=evals[-1].eval_loss if evals else None,
        median_tokens_per_s=median(steady_state(train, "tokens_per_s")),
        median_step_time_s=median(steady_state(train, "step_time_s")),
        peak_memory_bytes=max(memory) if memory else None,
        memory_kind=last.peak_memory_kind,
        elapsed_s=last.elapsed_s,
        skipped_steps=last.skipped_steps or 0,
        median_mfu=median(steady_state(train, "mfu")),
        num_checkpoints=checkpoints,
        diverged_step=diverged,
    )


def diverged_sentence(stats: TrainingStats) -> str:
    """What the page says of a diverged run (empty when it did not diverge)."""
    if stats.diverged_step is None:
        return ""
    return (
        f"Training diverged: the loss became NaN or inf at step {stats.diverged_step}"
        + (f" of {stats.total_steps}" if stats.total_steps else "")
        + ", and the trainer stopped there."
    )


def comparable_predicted_memory(p: Prediction, memory_kind: str) -> float | None:
    """The prediction a training run's measured peak compares with: on CPU the resident peak
    includes what the cost model adds as fixed overhead, so the full per-rank prediction; on
    CUDA ``max_memory_allocated`` counts tensors only, so the traced peak."""
    if memory_kind.startswith("cpu"):
        return float(p.peak_memory_bytes)
    memory = p.breakdown.memory
    return float(memory.traced_bytes) if memory is not None else None


def _trained_plan(
    plan: Mapping[str, Any] | None, config: Mapping[str, Any]
) -> tuple[Candidate, Prediction] | None:
    """The plan's config and prediction when the training run used the plan's knobs (else a
    prediction of it would describe another run)."""
    chosen, p = plan_candidate(plan), prediction(mapping(plan).get("predicted"))
    if chosen is None or p is None or not same_candidate(chosen, candidate(config)):
        return None
    return chosen, p


def training_validation(
    stats: TrainingStats | None,
    plan: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    *,
    steady_only: bool = True,
) -> ValidationRow | None:
    """The training run as one more measurement of the plan's config (when it ran that config;
    with ``steady_only``, when it ran long enough for its medians to leave the warm-up out)."""
    trained = _trained_plan(plan, config) if stats is not None else None
    if stats is None or trained is None or (steady_only and stats.warmup_included):
        return None
    c, p = trained
    return ValidationRow(
        key=c.key,
        label=c.short_label(),
        role="training",
        status="ok",
        reason="",
        predicted_tokens_per_s=p.tokens_per_s,
        measured_tokens_per_s=stats.median_tokens_per_s,
        predicted_step_time_s=p.step_time_s,
        measured_step_time_s=stats.median_step_time_s,
        predicted_memory_bytes=comparable_predicted_memory(p, stats.memory_kind),
        measured_memory_bytes=stats.peak_memory_bytes,
        memory_kind=MEMORY_KINDS.get(stats.memory_kind, stats.memory_kind),
    )


def _series(
    records: Sequence[MetricsRecord], key: str, label: str, role: str, scale: float = 1.0
) -> Series:
    points = tuple(
        (float(r.step), round(v / scale, 6))
        for r in records
        if (v := num(getattr(r, key))) is not None
    )
    return Series(label=label, role=role, points=points)


def _flat(label: str, role: str, steps: Sequence[float], value: float | None) -> Series | None:
    if value is None or not steps or min(steps) == max(steps):
        return None  # a one-step run: a line of no length, only a legend entry
    return Series(label=label, role=role, points=((min(steps), value), (max(steps), value)))


def gemm_utilisation(
    records: Sequence[TrainRecord],
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
        (float(r.step), round(tps / world * per_token / gemm, 6))
        for r in records
        if (tps := r.tokens_per_s) is not None
    )
    return Series(label="model FLOP/s ÷ measured GEMM FLOP/s", role="gemm", points=points)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Run:
    """What the training charts share: the records, their steps, and the plan's prediction
    when the run trained the plan's config."""

    train: Sequence[TrainRecord]
    evals: Sequence[EvalRecord]
    steps: Sequence[float]
    predicted: Prediction | None


def _step_chart(
    id: str, title: str, y_label: str, series: Sequence[Series], **options: Any
) -> Chart:
    """A line chart over the run's steps."""
    return Chart(
        id=id,
        title=title,
        kind="line",
        x_label="step",
        y_label=y_label,
        series=tuple(series),
        **options,
    )


def _loss_chart(run: _Run) -> Chart:
    return _step_chart(
        "train-loss",
        "Loss",
        "loss",
        [
            s
            for s in (
                _series(run.train, "loss", "train", "train"),
                _series(run.evals, "eval_loss", "eval (held-out)", "eval"),
            )
            if s.points  # no evaluation yet: no legend entry with nothing behind it
        ],
    )


def _throughput_chart(run: _Run) -> Chart:
    series = [_series(run.train, "tokens_per_s", "tokens/s", "train")]
    if run.predicted is not None and (
        flat := _flat("predicted", "predicted", run.steps, run.predicted.tokens_per_s)
    ):
        series.append(flat)
    return _step_chart("train-throughput", "Throughput", "tokens/s", series, y_min=0)


def _mfu_chart(
    run: _Run, profile: Mapping[str, Any] | None, config: Mapping[str, Any]
) -> tuple[Chart | None, float | None]:
    """(MFU against the datasheet peak, or model FLOP/s over the measured GEMM rate where the
    peak is unknown; that ratio's largest value where it exceeded 1, else None)."""
    series = [s for s in (_series(run.train, "mfu", "MFU (datasheet peak)", "mfu"),) if s.points]
    above_one: float | None = None
    if (gemm := gemm_utilisation(run.train, profile, config)) is not None and gemm.points:
        series.append(gemm)
        top = max((y or 0.0) for _x, y in gemm.points)
        above_one = top if top > 1 else None
    if not series:
        return None, above_one
    note = ""
    if not any(s.role == "mfu" for s in series):
        note = (
            "MFU needs the device's datasheet peak, which is unknown here (CPUs and unlisted "
            "GPUs): shown instead is model FLOP/s over the GEMM rate measured by the profile."
        )
    chart = _step_chart(
        "train-mfu",
        "Model FLOPs utilisation",
        "fraction",
        series,
        y_min=0,
        caption=note
        + " Model FLOPs: 6N + 12·L·H·Q·T per token (PaLM, App. B); N counts the weights a"
        " token multiplies: of a mixture of experts, the experts it is routed to.",
    )
    return chart, above_one


def _memory_chart(run: _Run, memory_kind: str) -> Chart | None:
    memory = [r.peak_memory_bytes for r in run.train if r.peak_memory_bytes is not None]
    if not memory:
        return None
    unit, scale = ("GiB", GiB) if max(memory) >= GiB else ("MiB", MiB)
    series = [_series(run.train, "peak_memory_bytes", "peak per step", "train", scale)]
    if run.predicted is not None:
        value = comparable_predicted_memory(run.predicted, memory_kind)
        if value is not None and (
            flat := _flat("predicted", "predicted", run.steps, round(value / scale, 4))
        ):
            series.append(flat)
    caption = MEMORY_KINDS.get(memory_kind, memory_kind)
    return _step_chart("train-memory", "Peak memory", unit, series, y_min=0, caption=caption)


def _lr_chart(run: _Run) -> Chart:
    lr = _series(run.train, "lr", "learning rate", "lr")
    return _step_chart("train-lr", "Learning rate", "lr", (lr,), y_min=0)


def _steps_hint(stats: TrainingStats) -> str:
    if stats.diverged_step is not None:
        return f"diverged: the loss became NaN or inf at step {stats.diverged_step}"
    return "" if stats.complete or stats.total_steps is None else "incomplete: resume it"


def _loss_text(stats: TrainingStats) -> str:
    """First → last train loss; one value for a run of one logged step (it read
    "5.560 → 5.560")."""
    first, last = stats.first_loss, stats.last_loss
    if first is None or last is None:
        return fmt.DASH
    if stats.steps <= 1:
        return f"{last:.3f} (one step)"
    return f"{first:.3f} → {last:.3f}"


def _facts(stats: TrainingStats, data: Any, val_data: Any = None) -> tuple[Fact, ...]:
    """``data``/``val_data``: train_config.json's descriptions of the data and of the
    --val-data file the evaluations read (None: the data's own validation split)."""
    facts = [
        Fact(
            label="steps",
            value=f"{stats.steps}" + (f" of {stats.total_steps}" if stats.total_steps else ""),
            hint=_steps_hint(stats),
        ),
        Fact(label="tokens", value=fmt.count(stats.tokens)),
        Fact(label="loss", value=_loss_text(stats)),
        Fact(
            label="eval loss",
            value=f"{stats.last_eval_loss:.3f}" if stats.last_eval_loss is not None else fmt.DASH,
        ),
        Fact(
            label="median throughput",
            value=stats.rate_text(),
            hint="too few steps to leave the warm-up step out: no steady rate"
            if stats.warmup_included
            else "after warm-up",
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
    if data:
        facts.append(Fact(label="data", value=str(data)))
    if val_data:
        facts.append(
            Fact(
                label="validation data",
                value=str(val_data),
                hint="what the eval loss is measured on (--val-data)",
            )
        )
    return tuple(facts)


def _bullets(profile: Mapping[str, Any] | None, above: float | None, has_mfu: bool) -> list[str]:
    """``above``: the largest model FLOP/s ÷ measured GEMM rate, when it exceeds 1."""
    bullets = []
    if above is not None:
        # Until 2026-12-07 this blamed a busier host at profiling time, which the files did
        # not show (load 1.06 on 2 cores); what they show is the ratio itself.
        bullets.append(
            f"Model FLOP/s exceed the GEMM rate the profile measured (up to {above:.1f}×): "
            "that benchmark, one matrix size timed during the profile, measured less than "
            "this training reached, so the ratio is no utilisation; read its trend only."
        )
    if not has_mfu:
        bullets.append(
            "MFU is unknown: it needs the device's datasheet peak (none for CPUs and unlisted "
            "GPUs), and "
            + (
                "the profile measured no GEMM rate to compare with instead."
                if profile
                else "with no profile in this run there is no measured GEMM rate to compare "
                "with instead."
            )
        )
    return bullets


def trained_differences(plan: Mapping[str, Any] | None, run: RunFiles) -> tuple[str, ...]:
    """The hyper-parameters the training run was given other values of than the plan it
    trained (the tuned plan's when advisor tune ran)."""
    planned = mapping(mapping(run.tuned_plan).get("config")) or mapping(mapping(plan).get("config"))
    return setting_differences(planned, mapping(mapping(run.train_config).get("config")))


def training_section(
    run: RunFiles, plan: Mapping[str, Any] | None, stats: TrainingStats | None
) -> Section:
    target = whatif_target(plan)
    if stats is None:
        plan_file = TUNED_PLAN if run.tuned_plan is not None else PLAN
        note = (
            f"No training yet: run 'advisor train --plan RUN/{plan_file} --out RUN/train' "
            "(or 'advisor run --out RUN --resume')."
            if plan
            else "No training yet."
        )
        if target:
            # 'advisor run --resume' plans for this host, and training here measures this host.
            note = (
                f"No training: this is a what-if plan for {target}. Train it there with "
                f"'advisor train --plan RUN/{plan_file} --out RUN/train' (see Reproduce); "
                "trained on this host it runs the same layout at this host's speed, which the "
                "plan does not predict."
            )
        return Section(id="training", title="Training", note=note)
    trained = mapping(run.train_config)
    config = mapping(trained.get("config")) or mapping(mapping(plan).get("config"))
    same_config = same_candidate(plan_candidate(plan), candidate(config))
    elsewhere = trained_elsewhere(plan, run.train_config)
    curves = _Run(
        train=run.train_records,
        evals=run.eval_records,
        steps=[float(r.step) for r in run.train_records],
        predicted=prediction(mapping(plan).get("predicted"))
        if same_config and not elsewhere
        else None,
    )
    mfu, above_one = _mfu_chart(curves, run.profile, config)
    charts = [
        _loss_chart(curves),
        _throughput_chart(curves),
        mfu,
        _memory_chart(curves, stats.memory_kind),
        _lr_chart(curves),
    ]
    lead = []
    if stats.warmup_included and same_config and not elsewhere and plan is not None:
        lead.append(
            f"The run timed {steps_text(stats.timed_steps)}, too few to leave the warm-up "
            "step out: its throughput and step time are no steady rate, and Predicted vs "
            "measured does not hold them against the plan's prediction."
        )
    if stats.diverged_step is not None:
        lead.append(
            diverged_sentence(stats)
            + " Resuming would diverge again: lower --lr, raise --warmup-steps, keep "
            "--grad-clip on, or use bf16 instead of fp16, and train afresh (or resume from a "
            "checkpoint before the divergence)."
        )
    if elsewhere:
        device = mapping(run.train_config).get("device") or "this host"
        lead.append(
            f"This run trained a what-if plan for {target} on this host ({device}): its "
            "speed and memory are this host's, so no prediction of the plan is drawn beside "
            "them."
        )
    if not same_config and plan is not None:
        lead.append(
            "This training run used other knobs than the plan chose: no prediction is drawn."
        )
    elif plan is not None and (changed := trained_differences(plan, run)):
        lead.append(
            "This training run was given other settings than the plan's: "
            + "; ".join(changed)
            + " (train_config.json). The charts show what trained."
        )
    return Section(
        id="training",
        title="Training",
        lead=tuple(lead),
        facts=_facts(stats, trained.get("data"), trained.get("val_data")),
        bullets=tuple(_bullets(run.profile, above_one, mfu is not None)),
        charts=nonempty(charts),
    )
