"""FSDP ranks with the blocks kept gathered (``fsdp_reshard_after_forward`` False): traced with
the fake process group like the resharded ones, fitted apart from them, resharded to other world
sizes with the kept parameters left whole, and scheduled after every existing distributed trace.

All traces come from ONE child process (cached), on a small gpt-tiny (two blocks) so it is quick.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from advisor.workload import AdvisorWorkload
from profilers.budget import SHARES
from profilers.memory import MemoryModel, MemoryTrace, fit_memory, fit_memory_models
from profilers.memory_distributed import trace_distributed_step_memories
from profilers.phases_distributed import (
    GROUP_NAME,
    KEPT_GATHERED_NAME,
    _distributed_specs,
    _record_results,
    what_if_rank_order,
)
from profilers.probe_run import CHILD_START_S, ProbeRun, ProfileOptions
from profilers.profile_record import Fits
from profilers.workload import StepSpec
from tests.strategies.profiles import memory_model

WORKLOAD = AdvisorWorkload("gpt-tiny", {"n_layer": 2, "n_embd": 128, "vocab_size": 4096})
SEQ_LEN = 64


def _spec(world: int, b: int, accum: int = 1, *, kept: bool = True) -> StepSpec:
    return StepSpec(
        seq_len=SEQ_LEN,
        micro_batch_size=b,
        grad_accum_steps=accum,
        parallelism="fsdp",
        world_size=world,
        fsdp_reshard_after_forward=not kept,
    )


_SPECS = (
    *(_spec(2, b) for b in (1, 4)),
    _spec(2, 4, 2),
    *(_spec(4, b) for b in (1, 4)),
    _spec(4, 4, 2),
    _spec(2, 4, kept=False),
)


@functools.cache
def _traces() -> dict[StepSpec, MemoryTrace]:
    return {t.spec: t for t in trace_distributed_step_memories(WORKLOAD, _SPECS)}


def _fit(world: int) -> MemoryModel:
    traces = _traces()
    return fit_memory([traces[_spec(world, b)] for b in (1, 4)] + [traces[_spec(world, 4, 2)]])


def test_kept_blocks_hold_the_whole_model_unsharded_whatever_the_world_size() -> None:
    traces = _traces()
    kept, resharded = traces[_spec(2, 4)], traces[_spec(2, 4, kept=False)]
    # The same shards and optimizer state; more parameters live at the forward/backward peak.
    assert kept.parameter_bytes == resharded.parameter_bytes
    assert kept.optimizer_state_bytes == resharded.optimizer_state_bytes
    assert kept.forward_backward_peak_bytes > resharded.forward_backward_peak_bytes
    whole = {
        w: traces[_spec(w, 4)].forward_backward_breakdown.parameters
        - traces[_spec(w, 4)].parameter_bytes
        for w in (2, 4)
    }
    # The gathered parameters at the peak: every block and the root, fp32, at any world size.
    assert whole[2] == whole[4]
    assert whole[2] == pytest.approx(2 * kept.parameter_bytes, rel=0.01)


def test_a_world_2_kept_fit_resharded_matches_the_direct_trace_at_4() -> None:
    traces = _traces()
    two = _fit(2)
    assert two.fsdp_reshard_after_forward is False
    four = two.resharded(4)
    assert four.fsdp_reshard_after_forward is False and four.world_size == 4
    for b in (1, 4):
        truth = traces[_spec(4, b)]
        # Kept parameters whole, sharded state x 2/4; the sharded gradients live at the world-2
        # peak are kept as traced (the upper bound), resharding them too is the lower bound.
        upper = four.forward_backward.predict(b)
        live = traces[_spec(2, b)].forward_backward_breakdown.gradients
        assert (
            upper - live * (1 - 2 / 4) - 1024 <= truth.forward_backward_peak_bytes <= upper + 1024
        )
        assert four.optimizer_step.predict(b) == pytest.approx(
            truth.optimizer_step_peak_bytes, rel=1e-4
        )
    assert four.predict(4, 2) == pytest.approx(traces[_spec(4, 4, 2)].peak_bytes, rel=1e-4)
    # Scaling the kept parameters by 2/4 as well would miss by a quarter of the model or more.
    wrong = four.forward_backward.predict(4) - (
        traces[_spec(2, 4)].forward_backward_breakdown.parameters
        - traces[_spec(2, 4)].parameter_bytes
    ) * (1 - 2 / 4)
    assert wrong < 0.97 * traces[_spec(4, 4)].forward_backward_peak_bytes


def test_kept_and_resharded_fits_are_told_apart_and_old_records_read_as_resharded() -> None:
    traces = list(_traces().values())
    models = fit_memory_models(t for t in traces if not t.spec.fsdp_reshard_after_forward)
    fits = Fits(memory=tuple(models))
    kept = fits.memory_model(
        "fp32", "none", parallelism="fsdp", world_size=2, fsdp_reshard_after_forward=False
    )
    assert kept is not None and kept.fsdp_reshard_after_forward is False
    # No resharded fit here: the kept one is never returned instead.
    assert fits.memory_model("fp32", "none", parallelism="fsdp", world_size=2) is None
    data = kept.to_dict()
    assert MemoryModel.from_dict(data) == kept
    del data["fsdp_reshard_after_forward"]
    assert MemoryModel.from_dict(data).fsdp_reshard_after_forward is True
    old_trace = traces[0].to_dict()
    del old_trace["spec"]["fsdp_reshard_after_forward"]
    assert MemoryTrace.from_dict(old_trace).spec.fsdp_reshard_after_forward is True


def test_kept_traces_follow_the_baseline_group_then_come_last_and_say_what_covers_them() -> None:
    run = ProbeRun(
        WORKLOAD,
        ProfileOptions(seq_len=SEQ_LEN, budget_s=120, checkpointing=("none", "full")),
        None,
    )
    specs = _distributed_specs(run, ("fp32", "bf16"), (2,), ("fsdp", "ddp"))
    kept = [i for i, s in enumerate(specs) if not s.fsdp_reshard_after_forward]
    resharded_fsdp = [s for s in specs if s.parallelism == "fsdp" and s.fsdp_reshard_after_forward]
    assert len(kept) == len(resharded_fsdp)

    def baseline(s: StepSpec) -> bool:
        return (s.precision, s.activation_checkpointing, s.grad_accum_steps) == ("fp32", "none", 1)

    # The baseline group's kept sizes right after its own traces (fsdp and ddp), so a default
    # profile can price the knob; every other kept trace after all the existing ones.
    n_base = sum(baseline(s) for s in specs if s.fsdp_reshard_after_forward)
    early = [i for i in kept if baseline(specs[i])]
    assert early == list(range(n_base, n_base + len(early))) and early
    late = [i for i in kept if not baseline(specs[i])]
    assert late == list(range(len(specs) - len(late), len(specs)))  # the rest at the end
    # The budget ran out after the first three: a row names the --budget-s covering the rest.
    results = [
        {"status": "ok", "trace": _traces()[_spec(2, 4)].to_dict(), "wall_s": 2.0}
        if i < 3
        else {"status": "skipped", "reason": "time budget spent"}
        for i in range(len(specs))
    ]
    _record_results(run, specs, results)
    row = next(r for r in run.rows if r.name == KEPT_GATHERED_NAME)
    assert row.status == "skipped"
    assert f"{len(kept)} FSDP traces with the blocks kept gathered" in row.reason
    # 2 s each over the phase's share, on top of the 120 s asked for, rounded up to 30 s:
    # for the baseline group's kept sizes (what the search needs), and for every kept trace.
    share = SHARES["memory_distributed"] / sum(SHARES.values())

    def covering(skipped: int) -> int:
        return int(-(-(120 + skipped * 2.0 / share) // 30) * 30)

    enough, every = covering(early[-1] + 1 - 3), covering(len(specs) - 3)
    assert f"--budget-s {enough} would trace fp32/none's (enough to search the knob), " in (
        row.reason
    )
    assert row.reason.endswith(f", {every} all of them")
    assert enough < every
    # The row for every trace left out, kept gathered or not, names the budget for them all.
    group = next(r for r in run.rows if r.name == GROUP_NAME)
    assert group.reason == (
        f"{len(specs) - 3} traces left out: time budget spent; --budget-s {every} would cover them"
    )


def test_a_model_without_repeated_blocks_has_no_kept_gathered_rank_traced() -> None:
    # Its root is its one FSDP unit and is never resharded after forward: a kept trace would
    # repeat the resharded one (Zamba2's default profile spent two traces so).
    run = ProbeRun(WORKLOAD, ProfileOptions(seq_len=SEQ_LEN, budget_s=120), None)
    every = _distributed_specs(run, ("fp32",), (2,), ("fsdp", "ddp"))
    specs = _distributed_specs(run, ("fp32",), (2,), ("fsdp", "ddp"), kept_gathered=False)
    assert specs == [s for s in every if s.fsdp_reshard_after_forward]
    assert len(specs) < len(every)


def test_a_group_order_puts_its_groups_first_keeping_sizes_before_accumulation() -> None:
    # A model that fits no device here: the profile serves a what-if, least memory first.
    run = ProbeRun(
        WORKLOAD,
        ProfileOptions(seq_len=SEQ_LEN, budget_s=120, checkpointing=("none", "full")),
        None,
    )
    order = [("bf16", "full"), ("fp32", "full")]
    specs = _distributed_specs(run, ("fp32", "bf16"), (2,), ("fsdp",), order)
    sizes = run.options.trace_micro_batch_sizes
    resharded = [s for s in specs if s.fsdp_reshard_after_forward]
    head = [(s.precision, s.activation_checkpointing, s.micro_batch_size) for s in resharded[:6]]
    assert head == [("bf16", "full", b) for b in sizes] + [("fp32", "full", b) for b in sizes]
    accumulating = [i for i, s in enumerate(specs) if s.grad_accum_steps > 1]
    plain = [
        i for i, s in enumerate(specs) if s.grad_accum_steps == 1 and s.fsdp_reshard_after_forward
    ]
    assert max(plain) < min(accumulating)


def test_the_rank_trace_child_starts_no_trace_it_expects_to_end_past_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trace starts only if it would end in time at the mean of the ones made: three 3 s
    traces fit a 10 s budget, the fourth (9 s + 3 s) is skipped instead of overrunning it
    (a 70B rank's trace is 10-15 s; before, the child only checked the deadline had not
    passed and ran the whole profile past its budget by that much)."""
    import profilers.memory_distributed as memory_distributed
    import profilers.phases_distributed as phases_distributed

    class FakeTime:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

    class Traced:
        def to_dict(self) -> dict[str, object]:
            return {}

    clock = FakeTime()

    def trace(workload: object, specs: list[StepSpec], target: str) -> list[Traced]:
        clock.now += 3.0
        return [Traced()]

    monkeypatch.setattr(phases_distributed, "time", clock)
    monkeypatch.setattr(memory_distributed, "trace_in_this_process", trace)
    specs = [_spec(2, b) for b in (1, 4, 8, 1, 4, 8)]
    out = phases_distributed._distributed_trace_child(WORKLOAD, specs, "cpu", 10.0)
    assert [r["status"] for r in out] == ["ok"] * 3 + ["skipped"] * 3
    assert clock.now == 9.0  # within the 10 s
    # The first trace too, when a one-device trace of the model took longer than the budget
    # (until 2026-12-05 the first always started).
    out = phases_distributed._distributed_trace_child(WORKLOAD, specs, "cpu", 10.0, 11.0)
    assert [r["status"] for r in out] == ["skipped"] * 6 and clock.now == 9.0


def test_no_rank_trace_child_starts_when_a_one_device_trace_took_longer_than_the_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Zamba2 (2.48B, traced whole, ~140 s a one-device trace) had its rank-trace child
    killed after the phase's 46 s share. The core's trace costs say beforehand: no child, and
    the row names the budget that covers the traces at that cost."""
    import profilers.phases_distributed as phases_distributed

    run = ProbeRun(WORKLOAD, ProfileOptions(seq_len=SEQ_LEN, budget_s=120), None)

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("a child started")

    monkeypatch.setattr(run, "isolated", no_child)
    traces = phases_distributed.distributed_trace_phase(
        run, ("fp32",), "cpu", (2,), ("fsdp",), None, lambda checkpointing: 1e4
    )
    assert traces == []
    (row,) = [r for r in run.rows if r.name == GROUP_NAME]
    n = len(_distributed_specs(run, ("fp32",), (2,), ("fsdp",)))
    assert row.status == "skipped" and row.reason.startswith(f"{n} traces left out")
    suggested = int(row.reason.split("--budget-s ")[1].split()[0])
    share = SHARES["memory_distributed"] / sum(SHARES.values())
    assert suggested >= n * 1e4 / share  # at the one-device trace's 1e4 s each


def test_the_first_rank_trace_is_expected_to_take_longer_than_a_one_device_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Qwen3.5-9B (2026-12-06): one-device traces of 12 s, its first rank trace 31 s, started
    with 20 s of the budget left. The child gets RANK_TRACE_FACTOR times the one-device time
    as the first trace's expected time, and no child starts when that exceeds the share."""
    import profilers.phases_distributed as phases_distributed

    run = ProbeRun(WORKLOAD, ProfileOptions(seq_len=SEQ_LEN, budget_s=1200), None)
    started: list[float] = []

    def child(
        fn: object,
        workload: object,
        specs: object,
        target: str,
        budget_s: float,
        first_s: float,
        timeout_s: float,
    ) -> object:
        started.append(first_s)
        raise AssertionError("stop here")

    monkeypatch.setattr(run, "isolated", child)
    with pytest.raises(AssertionError, match="stop here"):
        phases_distributed.distributed_trace_phase(
            run, ("fp32",), "cpu", (2,), ("fsdp",), None, lambda checkpointing: 2.0
        )
    assert phases_distributed.RANK_TRACE_FACTOR >= 2.6  # Qwen3.5-9B's measured ratio
    assert started == [phases_distributed.RANK_TRACE_FACTOR * 2.0]
    # a one-device trace that fits the share once but not RANK_TRACE_FACTOR times: no child
    run = ProbeRun(WORKLOAD, ProfileOptions(seq_len=SEQ_LEN, budget_s=1200), None)
    share = run.clock.peek("memory_distributed")
    one_device_s = share / phases_distributed.RANK_TRACE_FACTOR + 1.0
    assert one_device_s < share - CHILD_START_S  # a child would start at 1x
    monkeypatch.setattr(run, "isolated", child)
    assert (
        phases_distributed.distributed_trace_phase(
            run, ("fp32",), "cpu", (2,), ("fsdp",), None, lambda checkpointing: one_device_s
        )
        == []
    )
    assert started == [phases_distributed.RANK_TRACE_FACTOR * 2.0]


def test_a_what_if_traces_the_16_bit_ranks_first_least_memory_first_within_each() -> None:
    # A model too large for this device: its profile serves GPUs, where plans are bf16. By
    # memory alone fp32/full and fp16/full came before bf16/none, and a 6.7B Llama's budget
    # ran out before bf16/none's ranks were traced.
    def model(precision: str, checkpointing: str, chunks: int) -> MemoryModel:
        # fp16 holds what bf16 does (the hand-made profile has no fp16 of its own).
        base = memory_model("fp32" if precision == "fp32" else "bf16", checkpointing)
        return dataclasses.replace(base, precision=precision, loss_chunks=chunks)

    models = [
        model(p, c, chunks)
        for p in ("fp32", "fp16", "bf16")
        for c in ("none", "full")
        for chunks in (1, 4)
    ]
    order = what_if_rank_order(models, largest=8)
    assert order == [
        ("bf16", "full"),
        ("bf16", "none"),
        ("fp16", "full"),
        ("fp16", "none"),
        ("fp32", "full"),
        ("fp32", "none"),
    ]
    assert memory_model("fp32", "full").forward_backward.predict(8) < (
        memory_model("bf16", "none").forward_backward.predict(8)
    )  # by memory alone fp32/full would have come second


def test_a_what_if_traces_blocks_k_ranks_after_the_others_of_their_precision() -> None:
    # A blocks:K rank is priced from the none and full ranks' line and traced whole: by memory
    # alone it came second (between full and none), and a 7.53B Llama's default profile spent
    # its rank traces on blocks:16 instead of ops and none.
    def model(precision: str, checkpointing: str) -> MemoryModel:
        if not checkpointing.startswith("blocks:"):
            return memory_model(precision, checkpointing)
        full, none = memory_model(precision, "full"), memory_model(precision, "none")
        between = dataclasses.replace(
            full.forward_backward,
            slope=(full.forward_backward.slope + none.forward_backward.slope) / 2,
        )
        return dataclasses.replace(
            full, activation_checkpointing=checkpointing, forward_backward=between
        )

    models = [model(p, c) for p in ("bf16", "fp32") for c in ("none", "blocks:1", "full")]
    fitted = {
        m.activation_checkpointing: m.forward_backward.predict(8)
        for m in models
        if m.precision == "bf16"
    }
    assert fitted["full"] < fitted["blocks:1"] < fitted["none"]  # by memory: second
    assert what_if_rank_order(models, largest=8) == [
        ("bf16", "full"),
        ("bf16", "none"),
        ("bf16", "blocks:1"),
        ("fp32", "full"),
        ("fp32", "none"),
        ("fp32", "blocks:1"),
    ]
