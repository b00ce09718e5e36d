"""The profiler's chunked-loss phase: which chunk count it measures, its traced memory, and the
step time it builds from a same-child delta against the plain loss."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from profilers.fit import AffineFit
from profilers.memory_model import fit_memory
from profilers.phases_chunked import (
    checkpointed_settings,
    chosen_loss_chunks,
    chunked_loss_phase,
    chunked_precision,
    chunked_time_model,
)
from profilers.probe_run import ProbeRun, ProfileOptions
from profilers.throughput import StepTiming, TimeModel
from profilers.workload import ModelFacts, StepSpec


def facts(vocab: int, width: int, head: bool = True) -> ModelFacts:
    return ModelFacts(
        name="m",
        family="gpt",
        objective="causal_lm",
        num_params=1,
        num_trainable_params=1,
        num_embedding_params=1,
        num_layers=2,
        hidden_size=width,
        num_heads=4,
        vocab_size=vocab,
        max_seq_len=512,
        block_class="Block",
        output_head=head,
    )


def test_chunk_count_makes_a_chunk_of_the_loss_about_one_blocks_activations() -> None:
    many = 1 << 20  # tokens enough for any chunk count
    assert chosen_loss_chunks(facts(256, 256), many) == 1  # gpt-tiny's bytes: nothing to gain
    assert chosen_loss_chunks(facts(32000, 256), many) == 32  # 12·32000 / (64·256) = 23.4
    assert chosen_loss_chunks(facts(50257, 768), 8 * 1024) == 16  # GPT-2 124M: 12.3 -> 16
    assert chosen_loss_chunks(facts(32000, 256, head=False), many) == 1
    # ... but no chunk below 256 tokens: 8 x 128 tokens make 4 chunks, 1 x 128 none
    assert chosen_loss_chunks(facts(32000, 256), 8 * 128) == 4
    assert chosen_loss_chunks(facts(32000, 256), 128) == 1


def timing(b: int, chunks: int, fb: tuple[float, ...]) -> StepTiming:
    return StepTiming(
        spec=StepSpec(seq_len=64, micro_batch_size=b, loss_chunks=chunks),
        device="cpu",
        num_warmup=1,
        forward_backward_s=fb,
        optimizer_s=tuple(0.01 for _ in fb),
    )


def test_time_model_is_the_plain_fit_plus_the_same_child_delta() -> None:
    plain = TimeModel(
        precision="fp32",
        activation_checkpointing="none",
        seq_len=64,
        parallelism="single",
        world_size=1,
        device="cpu",
        forward_backward=AffineFit(intercept=0.1, slope=0.05, xs=(2.0, 8.0), ys=(0.2, 0.5)),
        optimizer_s=0.01,
    )
    # In the child the host ran slower than in the core's (0.3 s and 0.9 s plain): only the
    # differences, +0.02 s at b=2 and +0.08 s at b=8 (the medians), are carried over.
    timings = [
        timing(2, 1, (0.30, 0.31, 0.29)),
        timing(2, 16, (0.32, 0.33, 0.31)),
        timing(8, 1, (0.90, 0.90, 0.95)),
        timing(8, 16, (0.98, 0.99, 0.90)),
    ]
    model = chunked_time_model(plain, timings)
    assert model.loss_chunks == 16
    assert model.forward_backward_s(2) == pytest.approx(0.2 + 0.02)
    assert model.forward_backward_s(8) == pytest.approx(0.5 + 0.08)
    assert model.optimizer_s == plain.optimizer_s
    assert TimeModel.from_dict(model.to_dict()) == model
    old = plain.to_dict()
    del old["loss_chunks"]
    assert TimeModel.from_dict(old).loss_chunks == 1  # a profile from before the knob


def test_measured_precision_is_the_one_whose_plain_step_was_fastest() -> None:
    fp32 = _plain_model()  # 0.2 s per sequence
    bf16 = dataclasses.replace(
        fp32,
        precision="bf16",
        forward_backward=AffineFit(intercept=0.05, slope=0.1, xs=(1.0, 2.0), ys=(0.15, 0.25)),
    )
    checkpointed = dataclasses.replace(bf16, precision="fp16", activation_checkpointing="full")
    checkpointed = dataclasses.replace(
        checkpointed, forward_backward=AffineFit(intercept=0.0, slope=0.01, xs=(), ys=())
    )
    assert chunked_precision([fp32, bf16, checkpointed], 2) == "bf16"  # full is not compared
    assert chunked_precision([fp32], 2) == "fp32"
    assert chunked_precision([], 2) == "fp32"  # nothing timed or traced
    # nothing timed (a model that fits no device here): the what-if's order among the traced
    assert chunked_precision([], 2, traced=["bf16"]) == "bf16"
    assert chunked_precision([], 2, traced=["fp32", "fp16", "bf16"]) == "bf16"
    assert chunked_precision([], 2, traced=["fp32", "fp16"]) == "fp16"
    assert chunked_precision([fp32], 2, traced=["fp32", "bf16"]) == "fp32"  # timed wins


def _traced(precision: str, setting: str, b: int, **extra: Any) -> Any:
    spec = StepSpec(
        seq_len=128,
        micro_batch_size=b,
        precision=precision,
        activation_checkpointing=setting,
        **extra,
    )
    return SimpleNamespace(spec=spec)


def test_checkpointed_settings_are_the_fitted_ones_full_first() -> None:
    traced = [
        _traced("fp32", "none", 2),
        _traced("fp32", "none", 4),
        _traced("fp32", "ops", 2),
        _traced("fp32", "ops", 4),
        _traced("fp32", "full", 2),
        _traced("fp32", "full", 4),
        _traced("fp32", "blocks:1", 2),  # one size: no fit to chunk beside
        _traced("bf16", "ops-half", 2),  # another precision
        _traced("bf16", "ops-half", 4),
        _traced("fp32", "ops-half", 2, parallelism="fsdp", world_size=2),  # a rank
        _traced("fp32", "ops-half", 4, parallelism="fsdp", world_size=2),
        _traced("fp32", "blocks:1", 2, grad_accum_steps=2),  # an accumulating trace
    ]
    assert checkpointed_settings(traced, "fp32") == ["full", "ops"]
    assert checkpointed_settings(traced, "bf16") == ["ops-half"]
    assert checkpointed_settings(traced, "fp16") == []


def _phase_run(budget_s: float = 60) -> tuple[Any, Any, ProbeRun, int]:
    from advisor.workload import AdvisorWorkload

    workload = AdvisorWorkload("gpt-tiny", {"vocab_size": 8192, "n_layer": 1, "n_embd": 64})
    options = ProfileOptions(seq_len=128, budget_s=budget_s, trace_micro_batch_sizes=(1, 2, 4))
    run = ProbeRun(workload, options, None)
    model_facts = workload.facts()
    chunks = chosen_loss_chunks(model_facts, 4 * 128)
    assert chunks == 2  # 32 by memory (12·8192 / (64·64) = 24), 2 by 256-token chunks
    return workload, model_facts, run, chunks


# The core's plain traces without and with full checkpointing at the chunked sizes (only their
# specs count).
FULL_TRACED = [_traced("fp32", setting, b) for setting in ("none", "full") for b in (2, 4)]


@pytest.mark.slow  # four traces and a timing child: 20-40 s on two shared cores
def test_phase_traces_and_times_the_chunked_loss_of_a_large_vocabulary_model() -> None:
    # A share (0.1 of 600 s) that outlasts the timing's rounds: the full pair follows it.
    _, model_facts, run, chunks = _phase_run(budget_s=600)
    # The core's fp32/none timings (hand-made: only their sizes and times plan the child).
    plain_timings = [timing(1, 1, (0.2, 0.2)), timing(2, 1, (0.4, 0.4))]
    result = chunked_loss_phase(
        run, model_facts, "cpu", plain_timings, [_plain_model()], FULL_TRACED, lambda _: 0.0
    )
    assert {t.spec.loss_chunks for t in result.traces} == {chunks}
    by_setting: dict[str, list[int]] = {}
    for trace in result.traces:
        spec = trace.spec
        by_setting.setdefault(spec.activation_checkpointing, []).append(spec.micro_batch_size)
    # Without checkpointing first (the time delta's base), then the core's other setting.
    assert by_setting == {"none": [2, 4], "full": [2, 4]}
    none_fit = fit_memory([t for t in result.traces if t.spec.activation_checkpointing == "none"])
    full_fit = fit_memory([t for t in result.traces if t.spec.activation_checkpointing == "full"])
    assert none_fit.loss_chunks == full_fit.loss_chunks == chunks
    # Full checkpointing keeps less than none for the same chunked loss.
    assert full_fit.predict(4, 1) < none_fit.predict(4, 1)
    assert [m.loss_chunks for m in result.time_models] == [chunks]
    assert {t.spec.loss_chunks for t in result.timings} == {1, chunks}  # the plain steps too
    assert any(r.name.endswith(f"/lc{chunks}") and r.status == "ok" for r in run.rows)


def test_a_setting_the_share_cannot_cover_gets_a_row_not_a_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import profilers.phases_chunked as phase
    import profilers.phases_core as core

    _, model_facts, run, chunks = _phase_run()
    traced: list[StepSpec] = []
    monkeypatch.setattr(core, "_trace", lambda run, spec, target, costs=None: traced.append(spec))
    # No plain timings: the delta is skipped with its row, no child is started.
    result = phase.chunked_loss_phase(
        run, model_facts, "cpu", [], [], FULL_TRACED, lambda setting: 1e6
    )
    assert result.traces == [] and result.time_models == []
    # Nor is the plain pair started: 2e6 s against the 60 s budget (until 2026-12-06 the first
    # size started whatever the budget said, and the second waited on it).
    assert traced == []
    plain = [r for r in run.rows if r.probe == "memory" and r.name.startswith("fp32/none/")]
    pair_budget = phase._covering_budget_s(run, 2e6, phase.SHARE_OF_REMAINING)
    assert [r.name for r in plain] == [f"fp32/none/b=2/lc{chunks}", f"fp32/none/b=4/lc{chunks}"]
    assert all(
        r.reason == f"time budget spent; --budget-s {pair_budget} would cover it" for r in plain
    )
    skipped = [r for r in run.rows if r.status == "skipped" and r.probe == "memory"][2:]
    assert [r.name for r in skipped] == [f"fp32/full/b=2/lc{chunks}", f"fp32/full/b=4/lc{chunks}"]
    # the budget whose later phases' part covers the pair (1e6 s a trace, x2)
    suggested = phase._covering_budget_s(run, 2e6, phase.EXTRA_SHARE_OF_REMAINING)
    assert suggested > run.options.budget_s + 2e6
    assert all(
        (r.reason or "").endswith(
            f"; --budget-s {suggested} would cover the 1 chunked-loss pairs left out"
        )
        for r in skipped
    )
    assert any(r.probe == "throughput" and "no base" in (r.reason or "") for r in run.rows)


def test_a_core_that_fitted_full_and_not_none_has_its_chunked_loss_traced_with_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A what-if profile traces full before none and on a slow host full alone (Qwen3.5-9B,
    2026-12-06): its chunked loss is traced beside full, the fit its plans can use, and full
    is not traced twice. With none fitted too, none stays first."""
    import profilers.phases_chunked as phase
    import profilers.phases_core as core

    assert phase.first_setting(FULL_TRACED, "fp32") == "none"
    full_only = FULL_TRACED[2:]
    assert phase.first_setting(full_only, "fp32") == "full"
    assert phase.first_setting([], "fp32") == "none"  # nothing fitted: as before
    assert phase.first_setting(full_only, "bf16") == "none"  # another precision's fits
    _, model_facts, run, chunks = _phase_run(budget_s=600)
    traced: list[StepSpec] = []
    monkeypatch.setattr(core, "_trace", lambda run, spec, target, costs=None: traced.append(spec))
    phase.chunked_loss_phase(run, model_facts, "cpu", [], [], full_only, lambda _: 0.0)
    assert [(s.activation_checkpointing, s.micro_batch_size) for s in traced] == [
        ("full", 2),
        ("full", 4),
    ]
    assert {s.loss_chunks for s in traced} == {chunks}


def _plain_model() -> TimeModel:
    return TimeModel(
        precision="fp32",
        activation_checkpointing="none",
        seq_len=32,
        parallelism="single",
        world_size=1,
        device="cpu",
        forward_backward=AffineFit(intercept=0.0, slope=0.2, xs=(1.0, 2.0), ys=(0.2, 0.4)),
        optimizer_s=0.001,
    )


def test_no_trace_starts_that_could_only_be_stopped_at_the_profiles_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside the profile's fake-trace deadline (60 s away here), a chunked trace expected to
    take as long as the core's plain one (1e6 s) is not started: its row says why. A Zamba2
    (2.48B, traced whole) spent 49 s on a chunked trace's forward whose backward was refused."""
    import time

    import profilers.phases_chunked as phase
    import profilers.phases_core as core
    from profilers.fake_kernels import fake_deadline

    _, model_facts, run, chunks = _phase_run()
    traced: list[StepSpec] = []
    monkeypatch.setattr(core, "_trace", lambda run, spec, target, costs=None: traced.append(spec))
    with fake_deadline(time.perf_counter() + 60, "the test's deadline"):
        phase.chunked_loss_phase(run, model_facts, "cpu", [], [], FULL_TRACED, lambda _: 1e6)
    assert traced == []
    late = [r for r in run.rows if "not started" in (r.reason or "")]
    assert [r.name for r in late] == [f"fp32/none/b=2/lc{chunks}", f"fp32/none/b=4/lc{chunks}"]
    assert "its 2 traces (one fit) take ~2000000 s here" in late[0].reason
    assert "before the test's deadline" in late[0].reason
    # ... and the budget that covers both (not "a larger --budget-s gives it more")
    part = min(phase.SHARE_OF_REMAINING, phase.EXTRA_SHARE_OF_REMAINING)
    suggested = phase._covering_budget_s(run, 2e6, part)
    assert all(
        r.reason.endswith(
            f"; --budget-s {suggested} would cover the 2 chunked-loss traces left out"
        )
        for r in late
    )
    # Time for one of the pair (40 s of 60) but not both: neither starts (one size fits
    # nothing; Qwen3.5-9B's what-if profile spent its last 19 s on such a first trace).
    _, model_facts, run, chunks = _phase_run()
    with fake_deadline(time.perf_counter() + 60, "the test's deadline"):
        phase.chunked_loss_phase(run, model_facts, "cpu", [], [], FULL_TRACED, lambda _: 40.0)
    assert traced == []
    late = [r for r in run.rows if "not started" in (r.reason or "")]
    assert [r.name for r in late][:2] == [f"fp32/none/b=2/lc{chunks}", f"fp32/none/b=4/lc{chunks}"]
    assert "its 2 traces (one fit) take ~80 s here" in late[0].reason
    # with the time to run them, they run
    with fake_deadline(time.perf_counter() + 60, "the test's deadline"):
        phase.chunked_loss_phase(run, model_facts, "cpu", [], [], FULL_TRACED, lambda _: 1.0)
    assert [s.micro_batch_size for s in traced][:2] == [2, 4]


def test_a_trace_stopped_at_the_deadline_names_a_budget_from_a_lower_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chunked trace stopped at the profile's fake-trace deadline (its row is the core's
    skipped one) names the budget that covers at least what it ran and that part's backward."""
    import profilers.phases_chunked as phase
    import profilers.phases_core as core
    from profilers import probe_rows
    from profilers.fake_kernels import TraceOverBudget

    _, model_facts, run, chunks = _phase_run(budget_s=600)  # room for the pair's 200 s

    def stopped(run: ProbeRun, spec: StepSpec, target: str, costs: Any = None) -> None:
        exc = TraceOverBudget("the fake-tensor trace's backward would run past the deadline")
        run.rows.append(probe_rows.raised("memory", spec, exc, wall_s=0.0))

    monkeypatch.setattr(core, "_trace", stopped)
    # the plain pair, each expected at 100 s (the core's plain trace): both start, both stop
    phase.chunked_loss_phase(run, model_facts, "cpu", [], [], [], lambda _: 100.0)
    cut = [r for r in run.rows if (r.reason or "").startswith(probe_rows.TIME_SPENT)]
    assert [r.name for r in cut] == [f"fp32/none/b=2/lc{chunks}", f"fp32/none/b=4/lc{chunks}"]
    part = min(phase.SHARE_OF_REMAINING, phase.EXTRA_SHARE_OF_REMAINING)
    suggested = phase._covering_budget_s(run, 200.0, part)
    assert all(
        (r.reason or "").endswith(
            f"; --budget-s {suggested} at least would cover the 2 chunked-loss traces left "
            "out (a trace stopped before its end gives only a lower bound of its time)"
        )
        for r in cut
    )
    assert not any(probe_rows.LARGER_BUDGET in (r.reason or "") for r in cut)
