"""The profiler's budget clock: how a phase's share follows from what earlier phases spent."""

from __future__ import annotations

import pytest

from profilers.budget import SHARES, Clock

BUDGET_S = 100.0


class FakeTime:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def planned(phase: str) -> float:
    return BUDGET_S * SHARES[phase] / sum(SHARES.values())


def test_phases_that_spend_exactly_their_share_leave_the_later_ones_their_planned_part() -> None:
    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now)
    for phase in SHARES:
        share = clock.share(phase)
        assert share == pytest.approx(planned(phase))
        now.t += share
    assert clock.remaining() == pytest.approx(0.0)


def test_time_a_phase_leaves_unused_flows_to_the_later_ones() -> None:
    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now)
    first, *later = SHARES
    clock.share(first)  # and spends nothing
    shares = {}
    for phase in later:
        shares[phase] = clock.share(phase)
        now.t += shares[phase]
    # Every later phase grows by the same factor, and together they use the whole budget.
    factors = {shares[p] / planned(p) for p in later}
    assert min(factors) > 1 and max(factors) == pytest.approx(min(factors))
    assert sum(shares.values()) == pytest.approx(BUDGET_S)


def test_a_phase_that_overran_shrinks_every_later_one_and_the_last_gets_what_is_left() -> None:
    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now)
    first, *later = SHARES
    now.t += clock.share(first) + 10.0  # 10 s over
    shares = {}
    for phase in later:
        shares[phase] = clock.share(phase)
        now.t += shares[phase]
    factors = [shares[p] / planned(p) for p in later]
    assert all(0 < f < 1 for f in factors)
    assert max(factors) == pytest.approx(min(factors))  # no phase starves for another
    assert clock.remaining() == pytest.approx(0.0)


def test_once_the_budget_is_spent_every_share_is_zero() -> None:
    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now)
    now.t += 2 * BUDGET_S
    assert clock.remaining() == 0.0
    assert [clock.share(p) for p in SHARES] == [0.0] * len(SHARES)


def test_progress_reports_the_fraction_spent_capped_at_one() -> None:
    now = FakeTime()
    calls: list[tuple[str, float]] = []
    clock = Clock(BUDGET_S, lambda message, spent: calls.append((message, spent)), now=now)
    now.t += BUDGET_S / 4
    clock.say("a")
    now.t += 2 * BUDGET_S
    clock.say("b")
    assert calls == [("a", 0.25), ("b", 1.0)]
    Clock(BUDGET_S, None, now=now).say("nobody listens")  # no progress callback: silent


def test_dropped_phases_give_their_share_to_the_others_from_the_start() -> None:
    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now)
    clock.drop("communication", "input")
    kept = [p for p in SHARES if p not in ("communication", "input")]
    total = sum(SHARES[p] for p in kept)
    shares = {}
    for phase in SHARES:
        shares[phase] = clock.share(phase)
        now.t += shares[phase]
    assert shares["communication"] == 0.0 and shares["input"] == 0.0
    for phase in kept:  # each its weight's part of the whole budget among the kept phases
        assert shares[phase] == pytest.approx(BUDGET_S * SHARES[phase] / total)
    assert sum(shares.values()) == pytest.approx(BUDGET_S)
    with pytest.raises(ValueError, match="unknown phase"):
        clock.drop("no-such-phase")


def test_options_that_turn_a_phase_off_drop_it() -> None:
    from profilers.probe_run import ProfileOptions
    from profilers.profiler import _phases_turned_off
    from tests.profilers.toy_workload import ToyWorkload

    toy = ToyWorkload()
    assert _phases_turned_off(toy, ProfileOptions(seq_len=8)) == ["input"]  # no data loader
    off = _phases_turned_off(toy, ProfileOptions(seq_len=8, comm=False))
    assert off == ["communication", "input"]
    assert "communication" in _phases_turned_off(
        toy, ProfileOptions(seq_len=8, comm_world_sizes=())
    )


def test_a_data_workload_keeps_its_input_phase_unless_no_worker_setting_is_asked_for() -> None:
    from advisor.workload import AdvisorWorkload
    from profilers.probe_run import ProfileOptions
    from profilers.profiler import _phases_turned_off

    data = AdvisorWorkload(model="gpt-tiny", model_args={}, data="synthetic")
    assert _phases_turned_off(data, ProfileOptions(seq_len=8)) == []
    assert _phases_turned_off(data, ProfileOptions(seq_len=8, input_workers=())) == ["input"]


def test_a_phase_dropped_midway_gives_its_time_to_the_later_ones_and_says_why() -> None:
    # Nothing fits the device (known after the core): the collectives and the loader serve no
    # plan on it, so the phases still to come (the per-rank traces) share their time.
    from profilers.phases_comm import communication_phase
    from profilers.probe_run import ProbeRun, ProfileOptions
    from tests.profilers.toy_workload import ToyWorkload

    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=8, budget_s=BUDGET_S), None)
    for phase in ("device", "model", "memory", "throughput"):
        run.clock.share(phase)
    before = run.clock.remaining() * SHARES["memory_distributed"]
    run.clock.drop("communication", "input", reason="the model does not fit this device")
    assert run.clock.drop_reasons["input"] == "the model does not fit this device"
    assert communication_phase(run) is None
    (row,) = [r for r in run.rows if r.probe == "communication"]
    assert row.status == "skipped" and row.reason == "the model does not fit this device"
    waiting = sum(w for p, w in SHARES.items() if p not in run.clock.started)
    assert run.clock.share("memory_distributed") * waiting == pytest.approx(before, rel=1e-3)


def test_a_clock_started_earlier_counts_what_ran_before_the_probes() -> None:
    """advisor.profiling starts the budget when the request arrives: importing torch and
    reading a 70B model's facts (seconds) are spent from it, not added to it."""
    from profilers.probe_run import ProbeRun, ProfileOptions
    from tests.profilers.toy_workload import ToyWorkload

    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now, start=now.t - 7.0)
    assert clock.elapsed() == pytest.approx(7.0)
    assert clock.share(next(iter(SHARES))) == pytest.approx(
        (BUDGET_S - 7.0) * next(iter(SHARES.values())) / sum(SHARES.values())
    )
    import time

    arrived = time.perf_counter() - 30.0
    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=8, started_at=arrived), None)
    assert run.clock.elapsed() >= 30.0


def test_peek_tells_a_phase_its_share_without_starting_it() -> None:
    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now)
    peeked = clock.peek("compile")
    assert peeked == pytest.approx(planned("compile"))
    assert clock.peek("compile") == peeked  # peeking twice changes nothing
    assert clock.share("device") == pytest.approx(planned("device"))  # nor the others' shares
    now.t += planned("device")
    assert clock.share("compile") == pytest.approx(peeked)
    assert clock.peek("compile") == 0.0  # started: nothing left to borrow
    clock.drop("input")
    assert clock.peek("input") == 0.0


def test_a_joint_share_counts_the_time_left_once_and_may_borrow_a_later_phase() -> None:
    now = FakeTime()
    clock = Clock(BUDGET_S, None, now=now)
    joint = clock.joint_share("memory", "throughput")
    assert joint == pytest.approx(planned("memory") + planned("throughput"))
    # Asked in turn, the second share counts the time left again, as if the first were unused.
    other = Clock(BUDGET_S, None, now=now)
    assert other.share("memory") + other.share("throughput") > joint * 1.05
    # Borrowed: its part now, the phase itself not started (it gets what is left later).
    clock = Clock(BUDGET_S, None, now=now)
    borrowed = clock.joint_share("memory", "throughput", borrow=("memory_refine",))
    assert borrowed == pytest.approx(joint + planned("memory_refine"))
    assert clock.peek("memory_refine") > 0.0 and clock.peek("memory") == 0.0


def test_real_step_checks_left_out_name_the_budget_that_covers_them() -> None:
    """profilers.phases_memory: each check skipped for time names the --budget-s whose
    memory-check share covers them all, at the checks' mean time."""
    from types import SimpleNamespace

    from profilers import probe_rows
    from profilers.budget import covering_budget_s
    from profilers.phases_memory import _name_covering_budget

    rows = [
        probe_rows.skipped("memory_check", None, "time budget spent", name=f"fp32/c{i}/b=4")
        for i in range(3)
    ]
    run = SimpleNamespace(
        options=SimpleNamespace(budget_s=120.0), clock=SimpleNamespace(dropped=()), rows=rows
    )
    _name_covering_budget(run, [0, 2], [4.0, 6.0])  # type: ignore[arg-type]
    suggested = covering_budget_s(120.0, ("memory_check",), 2 * 5.0)
    assert suggested > 120
    expected = (
        f"time budget spent; --budget-s {suggested} would cover the 2 real-step checks left out"
    )
    assert [r.reason for r in run.rows] == [expected, "time budget spent", expected]
    _name_covering_budget(run, [1], [])  # type: ignore[arg-type]  # nothing ran: no estimate
    assert run.rows[1].reason == "time budget spent"
