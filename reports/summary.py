"""Summary: what to use and why, in a few sentences and one comparison table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import reports.fmt as fmt
from reports.candidates import TrialRow
from reports.common import (
    candidate,
    mapping,
    ok_measurement,
    plan_candidate,
    same_candidate,
    setting_differences,
    whatif_target,
)
from reports.common import prediction as read_prediction
from reports.fmt import num
from reports.model import Fact, Section, Table, cell, num_cell
from reports.training import MEMORY_KINDS, TrainingStats, diverged_sentence, steps_text

KNOB_PREFIXES = (
    "precision ",
    "activation checkpointing ",
    "parallelism ",
    "micro-batch/accumulation ",
    "loader workers ",
)
NUM_TOP_REASONS = 6


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    headline: tuple[str, ...]
    config: Mapping[str, Any]
    expected_speedup: float | None
    measured_speedup: float | None
    training_speedup: float | None  # training's median tokens/s over the baseline's measured
    predicted_tokens_per_s: float | None
    measured_tokens_per_s: float | None
    training_tokens_per_s: float | None
    reasons: tuple[str, ...]  # the top ones, plain sentences
    notes: tuple[str, ...]  # everything else the plan says
    estimate_label: str = ""
    trained_elsewhere: str = ""  # the device a what-if plan trained on instead of its target


def split_reasons(reasons: Sequence[str]) -> tuple[list[str], list[str]]:
    """(why this config won, search notes): the plan's reasons in the order a reader wants."""
    chosen, knobs, others, notes = [], [], [], []
    for r in reasons:
        text = str(r)
        if text.startswith("chosen:") or text.startswith("the top predicted candidate"):
            chosen.append(text)
        elif text.startswith(KNOB_PREFIXES):
            knobs.append(text)
        elif text.startswith("baseline") or ": not validated (" in text:
            others.append(text)
        else:
            notes.append(text)
    top = chosen + knobs + others
    return top[:NUM_TOP_REASONS], top[NUM_TOP_REASONS:] + notes


def plain_label(c: Mapping[str, Any]) -> str:
    """``bf16 with full activation checkpointing on one device, micro-batch 8 × 1
    accumulation``: the config in words."""
    text = str(c.get("precision", "?"))
    if c.get("activation_checkpointing") not in (None, "none"):
        text += f" with {c['activation_checkpointing']} activation checkpointing"
    if c.get("parallelism") in (None, "single"):
        text += " on one device"
    else:
        text += f", {str(c['parallelism']).upper()} over {c.get('world_size', '?')} ranks"
    text += (
        f", micro-batch {c.get('micro_batch_size', '?')} × {c.get('grad_accum_steps', '?')} "
        "accumulation"
    )
    if c.get("num_workers"):
        text += f", {c['num_workers']} loader workers"
    if (c.get("loss_chunks") or 1) > 1:
        text += f", the loss in {c['loss_chunks']} chunks"
    if c.get("fsdp_reshard_after_forward") is False:  # absent (older plans): resharded
        text += ", the blocks kept gathered from forward to backward"
    if c.get("compile"):  # absent (older plans): eager
        text += ", each block torch.compile'd"
    return text


def _headline(
    plan: Mapping[str, Any],
    baseline_measured: float | None,
    stats: TrainingStats | None,
    summary: dict[str, Any],
    elsewhere: str = "",
) -> list[str]:
    """``elsewhere``: the device a what-if plan's training ran on instead of its target."""
    config = mapping(plan.get("config"))
    target = whatif_target(plan)
    use = (
        f"Use {plain_label(config)} for {config.get('model', '?')} at a global batch of "
        f"{config.get('global_batch_size', '?')} sequences of {config.get('seq_len', '?')} tokens."
    )
    if target:
        # A what-if plan was made for hardware this host is not: nothing of it ran there.
        use = (
            f"What-if for {target}, which this plan was never run on: "
            + use[0].lower()
            + use[1:]
            + " Every number of this plan is a prediction for that hardware; the profile's "
            "measurements (Device and model) are of the host that profiled."
        )
    out = [use]
    measured, expected = summary["measured_speedup"], summary["expected_speedup"]
    if target and summary["predicted_tokens_per_s"] is not None:
        text = f"It is predicted to run at {fmt.rate(summary['predicted_tokens_per_s'])} there"
        if expected is not None:
            one = mapping(plan.get("machine")).get("name") or "device"
            text += f", {fmt.ratio(expected)} the naive fp32 loop on one {one} (also predicted)"
        out.append(text + ".")
    elif summary["measured_tokens_per_s"] is not None:
        text = f"It measured {fmt.rate(summary['measured_tokens_per_s'])} in validation"
        if measured is not None:
            text += f", {fmt.ratio(measured)} the naive fp32 loop ({fmt.rate(baseline_measured)})"
        if expected is not None:
            text += f"; the cost model expected {fmt.ratio(expected)}"
        out.append(text + ".")
    elif summary["predicted_tokens_per_s"] is not None:
        text = f"It is predicted to run at {fmt.rate(summary['predicted_tokens_per_s'])}"
        if expected is not None:
            text += f", {fmt.ratio(expected)} the naive fp32 loop"
        out.append(text + " (not validated by a real run).")
    baseline = candidate(mapping(plan.get("baseline")).get("config"))
    if same_candidate(baseline, plan_candidate(plan)):
        out.append(
            "That is the naive fp32 loop itself: none of the validated alternatives measured "
            "faster on this device."
        )
    elif expected is not None and measured is not None and (expected < 1) != (measured < 1):
        out.append(
            "The prediction and the measurement disagree on whether it beats the naive loop: "
            "the measurement decided (see Predicted vs measured)."
        )
    if measured is not None and measured < 1 and not same_candidate(baseline, plan_candidate(plan)):
        # A recommendation slower than the measured baseline needs its reason on the page,
        # not only in the search notes (audit 41, D8).
        only = mapping(mapping(mapping(plan.get("profile")).get("request")).get("only"))
        limits = " ".join(
            f"--only {str(k).replace('_', '-')}={','.join(str(v) for v in vs)}"
            for k, vs in only.items()
            if isinstance(vs, list | tuple)
        )
        out.append(
            f"The naive fp32 loop measured faster, but {limits} left it out of the search: "
            "the recommendation is the fastest config the search could choose."
            if limits
            else "The naive fp32 loop measured faster; the recommendation is the fastest of "
            "the validated candidates (the search notes say why the loop was not one)."
        )
    if stats is not None and stats.diverged_step is not None:
        out.append(diverged_sentence(stats) + " See Training.")
    elif stats is not None:
        text = f"Training ran {stats.steps}"
        if stats.total_steps:
            text += f" of {stats.total_steps}"
        unfinished = (
            " (unfinished: see Training)" if stats.total_steps and not stats.complete else ""
        )
        text += " step" if stats.steps == 1 else " steps"
        if elsewhere:
            text += f"{unfinished} on this host ({elsewhere}), not on {target},"
        else:
            text += unfinished
        text += f" at a median {stats.rate_text()}"
        if stats.last_loss is not None and stats.steps <= 1:
            text += f"; loss {stats.last_loss:.2f}"
        elif stats.first_loss is not None and stats.last_loss is not None:
            text += f"; loss {stats.first_loss:.2f} → {stats.last_loss:.2f}"
        if stats.last_eval_loss is not None:
            text += f" (eval {stats.last_eval_loss:.2f})"
        out.append(text + ".")
    return out


def build_summary(
    plan: Mapping[str, Any] | None, stats: TrainingStats | None, elsewhere: str = ""
) -> Summary | None:
    """``elsewhere``: the device (e.g. "cpu") a what-if plan's training ran on instead of its
    target; its speed then describes this host, not the plan."""
    if not plan:
        return None
    baseline = mapping(plan.get("baseline"))
    baseline_measured = num(mapping(ok_measurement(baseline.get("measured"))).get("tokens_per_s"))
    measured = ok_measurement(plan.get("measured"))
    # no speed-up from a run too short to leave its warm-up step out, nor from this host's
    # training of a what-if plan
    steady = stats is not None and not stats.warmup_included and not elsewhere
    training_tps = stats.median_tokens_per_s if stats and steady else None
    if same_candidate(candidate(baseline.get("config")), plan_candidate(plan)):
        # The chosen config is the naive loop: a "speed-up" of its training over its own
        # validation is the host's load, not the config (audit 41, D10).
        training_tps = None
    values: dict[str, Any] = {
        "expected_speedup": num(baseline.get("expected_speedup")),
        "measured_speedup": num(baseline.get("measured_speedup")),
        "training_speedup": training_tps / baseline_measured
        if training_tps and baseline_measured
        else None,
        "predicted_tokens_per_s": num(mapping(plan.get("predicted")).get("tokens_per_s")),
        "measured_tokens_per_s": num(measured.get("tokens_per_s")) if measured else None,
        "training_tokens_per_s": training_tps,
    }
    top, notes = split_reasons(plan.get("reasons") or ())
    return Summary(
        headline=tuple(_headline(plan, baseline_measured, stats, values, elsewhere)),
        config=dict(mapping(plan.get("config"))),
        reasons=tuple(top),
        notes=tuple(notes),
        estimate_label=str(plan.get("label") or "") if plan.get("estimate") else "",
        trained_elsewhere=elsewhere,
        **values,
    )


def _comparison(plan: Mapping[str, Any], stats: TrainingStats | None, elsewhere: str = "") -> Table:
    p = mapping(plan.get("predicted"))
    predicted = read_prediction(p)
    traced = predicted.traced_bytes if predicted is not None else None
    rows = [
        (
            cell(
                f"predicted for {target} (cost model)"
                if (target := whatif_target(plan))
                else "predicted (cost model)"
            ),
            num_cell(
                fmt.with_interval(
                    fmt.rate,
                    p.get("tokens_per_s"),
                    predicted.tokens_per_s_interval if predicted else None,
                ),
                num(p.get("tokens_per_s")),
                hint="90% interval",
            ),
            num_cell(
                fmt.with_interval(
                    fmt.seconds,
                    p.get("step_time_s"),
                    predicted.step_time_interval_s if predicted else None,
                ),
                num(p.get("step_time_s")),
                hint="90% interval",
            ),
            num_cell(fmt.size(p.get("peak_memory_bytes")), num(p.get("peak_memory_bytes"))),
            cell(
                f"per rank with overhead; traced tensors {fmt.size(traced)}"
                if traced
                else "per rank",
                cls="muted",
            ),
        )
    ]
    measured = mapping(plan.get("measured"))
    if measured:
        ok = ok_measurement(measured) is not None
        samples = len(measured.get("step_samples_s") or ())
        visits = int(measured.get("visits") or 1)
        runs = f" over {visits} runs" if visits > 1 else ""
        rows.append(
            (
                cell(f"measured (validation, {samples} steps{runs})" if ok else "validation"),
                num_cell(fmt.rate(measured.get("tokens_per_s")), num(measured.get("tokens_per_s"))),
                num_cell(
                    fmt.seconds(measured.get("step_time_s")), num(measured.get("step_time_s"))
                ),
                num_cell(
                    fmt.size(measured.get("peak_memory_bytes")),
                    num(measured.get("peak_memory_bytes")),
                ),
                cell(
                    str(measured.get("memory_kind") or "")
                    if ok
                    else f"{measured.get('status')}: {measured.get('reason')}",
                    cls="muted" if ok else "bad",
                ),
            )
        )
    if stats is not None:
        warm = ", warm-up included" if stats.warmup_included else ""
        rows.append(
            (
                cell(
                    f"measured on this host ({elsewhere}), not the target (training, "
                    f"{steps_text(stats.steps)}{warm})"
                    if elsewhere
                    else f"measured (training, {steps_text(stats.steps)}{warm})"
                ),
                num_cell(fmt.rate(stats.median_tokens_per_s), stats.median_tokens_per_s),
                num_cell(fmt.seconds(stats.median_step_time_s), stats.median_step_time_s),
                num_cell(fmt.size(stats.peak_memory_bytes), stats.peak_memory_bytes),
                cell(MEMORY_KINDS.get(stats.memory_kind, stats.memory_kind), cls="muted"),
            )
        )
    return Table(
        columns=("", "tokens/s", "step time", "peak memory", "memory measured as"), rows=tuple(rows)
    )


def _compile_fact(predicted: Mapping[str, Any]) -> Fact:
    """torch.compile in the plan: the per-step time and the one measured on the whole run."""
    compile_s = num(predicted.get("compile_s"))
    step, amortised = num(predicted.get("step_time_s")), num(predicted.get("amortised_step_time_s"))
    value = "each repeated block"
    if compile_s is not None and step is not None and amortised is not None:
        value += (
            f": cold compile {compile_s:.0f} s once; predicted {step:.3f} s/step, "
            f"{amortised:.3f} s/step over the run's {predicted.get('run_steps')} steps"
        )
    return Fact(
        label="torch.compile",
        value=value,
        hint="speed-up and compile time measured by the profile's compile probe (an empty "
        "inductor cache: a later run on this machine compiles faster)",
    )


def summary_section(
    summary: Summary | None,
    plan: Mapping[str, Any] | None,
    stats: TrainingStats | None,
    has_profile: bool,
    tuned: Mapping[str, Any] | None = None,
    trained: Mapping[str, Any] | None = None,
    searched: Sequence[TrialRow] = (),
    plan_is_tuned: bool = False,
) -> Section:
    """``tuned``: the tuned plan's config (advisor tune), whose optimizer the run trains
    (``plan_is_tuned``: the directory has no plan.json, its tuned plan stands for it);
    ``trained``: train_config.json's config, what the training run actually used;
    ``searched``: the Candidates rows (trials.csv), which a search that chose nothing leaves."""
    if summary is None or not plan:
        note = (
            "Profiled, but no recommendation yet: run 'advisor recommend --profile "
            "RUN/profile.json --global-batch-size N --out RUN' (or 'advisor run --out RUN "
            "--resume')."
            if has_profile
            else "No recommendation yet."
        )
        if searched:
            note = _nothing_chosen(searched)
        return Section(id="summary", title="Summary", note=note)
    config = summary.config
    speedups = []
    if summary.expected_speedup is not None:
        speedups.append(f"expected {fmt.ratio(summary.expected_speedup)}")
    if summary.measured_speedup is not None:
        speedups.append(f"measured {fmt.ratio(summary.measured_speedup)} in validation")
    if summary.training_speedup is not None:
        speedups.append(f"{fmt.ratio(summary.training_speedup)} in training")
    facts = [
        Fact(
            label="speed-up over the naive fp32 loop",
            value=", ".join(speedups) or fmt.DASH,
            hint="the baseline: fp32, no checkpointing, one device, the whole global batch in "
            "one micro-batch if it fits; in training: the run's median against the baseline's "
            "validation",
        ),
        Fact(label="precision", value=str(config.get("precision"))),
        Fact(label="activation checkpointing", value=str(config.get("activation_checkpointing"))),
        Fact(
            label="parallelism",
            value=str(config.get("parallelism"))
            + (
                f" × {config.get('world_size')} ranks"
                if config.get("parallelism") != "single"
                else ""
            ),
        ),
        Fact(
            label="micro-batch × accumulation",
            value=f"{config.get('micro_batch_size')} × {config.get('grad_accum_steps')}"
            f" (global batch {config.get('global_batch_size')})",
        ),
        Fact(label="loader workers", value=str(config.get("num_workers", 0))),
        *(
            [
                Fact(
                    label="loss",
                    value=f"in {config['loss_chunks']} chunks of the tokens",
                    hint="each chunk's logits recomputed in backward, never all held at once",
                )
            ]
            if (config.get("loss_chunks") or 1) > 1
            else []
        ),
        *(
            [
                Fact(
                    label="FSDP resharding",
                    value=(
                        "after forward (parameters all-gathered again in backward)"
                        if config.get("fsdp_reshard_after_forward", True)
                        else "none: blocks kept gathered from forward to backward"
                    ),
                    hint="reshard_after_forward: less memory per rank, or one all-gather less "
                    "per micro-batch",
                )
            ]
            if config.get("parallelism") == "fsdp"
            else []
        ),
        *([_compile_fact(mapping(plan.get("predicted")))] if config.get("compile") else []),
        _optimizer_fact(config, tuned, trained, plan_is_tuned),
    ]
    lead = summary.headline
    changed = setting_differences(tuned or config, trained or {})
    if changed:
        lead = (
            *lead,
            "The training run was given other settings than the plan's: "
            + "; ".join(changed)
            + ". Its numbers are of those settings (see Training).",
        )
    return Section(
        id="summary",
        title="Summary",
        lead=lead,
        facts=tuple(facts),
        tables=(_comparison(plan, stats, summary.trained_elsewhere),),
        bullets=summary.reasons,
        details_title="Everything the search noted" if summary.notes else "",
        details=summary.notes,
    )


def _nothing_chosen(rows: Sequence[TrialRow]) -> str:
    """What a search that chose nothing found (it wrote trials.csv, no plan.json): it said
    "no recommendation yet: run 'advisor recommend'", the command that had just failed."""
    priced = [r for r in rows if r.predicted_peak_bytes is not None]
    if not priced:
        # None priced: no budget was missed, the profile lacks what the cost model needs.
        return (
            f"The search chose nothing: none of its {len(rows)} candidates could be priced "
            "from the profile. Candidates gives each one's reason (the measurement it lacks); "
            "a longer 'advisor profile' (--budget-s) measures more."
        )
    text = f"The search chose nothing: none of its {len(rows)} candidates fits the budget"
    if priced:
        smallest = min(priced, key=lambda r: r.predicted_peak_bytes or 0.0)
        text += (
            f"; the smallest it could price ({smallest.label}) needs "
            f"{fmt.size(smallest.predicted_peak_bytes)} a rank"
        )
    unpriced = len(rows) - len(priced)
    if unpriced:
        text += f"; {unpriced} could not be priced"
    return (
        text + ". Candidates gives each one's reason; 'advisor recommend' says which flag "
        "would help (a larger --memory-budget, a longer profile --budget-s ...)."
    )


def _optimizer(config: Mapping[str, Any]) -> str:
    return (
        f"AdamW lr {fmt.plain(config.get('lr'))} → {fmt.plain(config.get('min_lr'))}, "
        f"warm-up {config.get('warmup_steps')}, "
        f"weight decay {fmt.plain(config.get('weight_decay'))}, "
        f"clip {fmt.plain(config.get('grad_clip'))}"
    )


def _optimizer_fact(
    config: Mapping[str, Any],
    tuned: Mapping[str, Any] | None,
    trained: Mapping[str, Any] | None = None,
    plan_is_tuned: bool = False,
) -> Fact:
    """The optimizer the run trains: the tuned plan's when advisor tune ran (the summary showed
    the untuned values beside a Tuning section and a Reproduce with the tuned ones); the
    training run's own when it was given other values (advisor train --plan P --lr X)."""
    if trained and setting_differences(tuned or config, trained):
        return Fact(
            label="optimizer (as trained)",
            value=_optimizer(trained),
            hint=f"the training run's flags overrode the plan's: {_optimizer(tuned or config)}",
        )
    if not tuned:
        return Fact(label="optimizer", value=_optimizer(config))
    own = _optimizer(config)
    return Fact(
        label="optimizer (tuned)",
        value=_optimizer(tuned),
        hint=f"advisor tune's values; the recommended plan's own: {own}"
        if own != _optimizer(tuned)
        else "advisor tune's values (the plan it tuned is not in this directory)"
        if plan_is_tuned
        # The study kept the plan's own values: the hint said the plan was missing beside it.
        else "advisor tune's values, the same as the recommended plan's own",
    )
