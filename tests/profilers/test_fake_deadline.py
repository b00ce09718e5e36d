"""Nothing traced in the profile's process runs unbounded: a fake trace or count past its
deadline stops (profilers.fake_kernels.fake_deadline) and its probe row says why. Before, a
model traced whole (no repeated blocks: Jamba, 52B, sequence 4096) spent over 10 minutes of a
120 s profile in its FLOP count alone."""

from __future__ import annotations

import re
import sys
import time

import pytest
import torch

import profilers.fake_kernels as fake_kernels
from advisor.workload import AdvisorWorkload
from profilers.fake_kernels import TraceOverBudget, fake_deadline
from profilers.flops import count_step_flops
from profilers.memory import trace_step_memory
from profilers.probe_run import ProfileOptions
from profilers.profiler import run_profile
from profilers.workload import StepSpec

SPEC = StepSpec(seq_len=16, micro_batch_size=2)
SLOW = "tests/data/fake_slow_model.py:factory"
# A profile of fp32 without checkpointing in 4 s (and its 10 s of trace overrun), nothing else.
FOUR_SECONDS = ProfileOptions(
    seq_len=16,
    budget_s=4,
    precisions=("fp32",),
    checkpointing=("none",),
    comm=False,
    input_workers=(),
)


def test_a_count_and_a_trace_past_their_deadline_stop_and_a_real_step_does_not() -> None:
    workload = AdvisorWorkload("gpt-tiny", {"n_layer": 2})
    passed = time.perf_counter() - 1
    with fake_deadline(passed, "the test's deadline"):
        with pytest.raises(TraceOverBudget, match="ran past the test's deadline"):
            count_step_flops(workload, SPEC)  # no fallback to a real count either
        with pytest.raises(TraceOverBudget):
            trace_step_memory(workload, SPEC)
        model = torch.nn.Linear(4, 4)
        model(torch.ones(2, 4)).sum().backward()  # real tensors: never stopped
    # the hook and the function mode are gone
    assert fake_kernels._DEADLINES == [] and fake_kernels._TOP_DEPTH == []
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.overrides._get_current_function_mode_stack()
    assert count_step_flops(workload, SPEC).method == "fake"  # and nothing stops afterwards


def test_a_deadline_in_the_future_changes_nothing() -> None:
    workload = AdvisorWorkload("gpt-tiny", {"n_layer": 2})
    free = count_step_flops(workload, SPEC)
    with fake_deadline(time.perf_counter() + 600):
        bounded = count_step_flops(workload, SPEC)
    assert bounded.flops_by_op == free.flops_by_op


def test_a_profile_of_a_model_too_slow_to_trace_stops_its_traces_with_a_reason() -> None:
    """8 layers x 0.5 s per fake forward: a count of two modes takes 8 s and more, each trace
    4 s and more, against a 4 s budget (and its 10 s of overrun)."""
    workload = AdvisorWorkload(SLOW)
    options = FOUR_SECONDS
    profile = run_profile(workload, options)
    flops = [r for r in profile.probes if r.probe == "flops"]
    assert [r.status for r in flops] == ["skipped"]
    # stopped in its forward, or before a backward that would end past the deadline
    assert flops[0].reason.startswith("time budget spent: the fake-tensor trace")
    assert "past half of what was left of --budget-s 4" in flops[0].reason
    assert profile.flops is None
    cut = [r for r in profile.probes if r.probe == "memory" and "past --budget-s 4" in r.reason]
    assert cut and all(r.status == "skipped" for r in cut)
    assert not [r for r in profile.probes if r.status == "error"]


def test_a_long_loop_inside_one_module_stops_between_its_torch_calls() -> None:
    """Until 2026-12-05 the deadline was checked only as a module's forward started: one
    module looping over ops (Jamba's Mamba scan at sequence 4096, ~20 s of fake ops) ran to
    its end past it. Here 20 steps of 0.1 s in one forward, a deadline 0.5 s in."""
    from advisor.models.registry import load_factory

    steps = 20
    workload = AdvisorWorkload(SLOW, {"loop_steps": steps, "delay_s": 0.1})
    progress = sys.modules[load_factory(SLOW).__module__].PROGRESS
    quick = AdvisorWorkload(SLOW, {"loop_steps": 1, "delay_s": 0.0})
    for count in (count_step_flops, trace_step_memory):
        count(quick, SPEC)  # what is imported or built once per process, before the deadline
        progress.clear()
        with (
            fake_deadline(time.perf_counter() + 0.5, "the test's deadline"),
            pytest.raises(TraceOverBudget, match="ran past the test's deadline"),
        ):
            count(workload, SPEC)
        assert len(progress) == 1 and progress[0] < steps, (count.__name__, progress)
    progress.clear()
    trace_step_memory(workload, SPEC)  # no deadline: every loop runs to its end
    assert progress == [steps]  # the measured step (the first one's optimizer state is primed)


def test_a_backward_that_would_end_past_the_deadline_is_not_started() -> None:
    """A backward runs in the autograd engine's C++ and is never interrupted, so it is not
    started when twice its forward would end past the deadline: here a 2 s forward (20
    steps of 0.1 s) with 2 s left when it ends."""
    workload = AdvisorWorkload(SLOW, {"loop_steps": 20, "delay_s": 0.1})
    count_step_flops(AdvisorWorkload(SLOW, {"loop_steps": 1, "delay_s": 0.0}), SPEC)
    t0 = time.perf_counter()
    with (
        fake_deadline(t0 + 4, "the test's deadline"),
        pytest.raises(TraceOverBudget, match=r"backward would run past the test's deadline"),
    ):
        count_step_flops(workload, SPEC)
    # with room for it, the same backward runs (its own time is short: the sleeps are forward's)
    with fake_deadline(time.perf_counter() + 30, "the test's deadline"):
        assert count_step_flops(workload, SPEC).method == "fake"


def test_a_trace_that_could_only_be_stopped_at_the_deadline_is_not_started() -> None:
    """A trace whose backward was refused at the profile's deadline counts what it still
    needed (that backward) in its cost, and a trace expected to take longer than is left
    before that deadline is not started. Until 2026-12-05 the group's second size was: a
    Zamba2 (2.48B, traced whole, seq 4096) spent 52 s on a forward whose backward was refused
    again. Here each fake forward takes 5 s (50 steps of 0.1 s) against a 4 s budget and its
    10 s of overrun."""
    from advisor.models.registry import load_factory

    workload = AdvisorWorkload(SLOW, {"loop_steps": 50, "delay_s": 0.1})
    progress = sys.modules[load_factory(SLOW).__module__].PROGRESS
    progress.clear()
    options = FOUR_SECONDS
    profile = run_profile(workload, options)
    core = [r for r in profile.probes if r.probe == "memory" and r.name.startswith("fp32/none/b=")]
    first, second = core[0], core[1]
    assert "backward would run past --budget-s 4" in first.reason, first.reason
    assert second.status == "skipped" and "not started" in second.reason, second.reason
    expected = float(re.search(r"a trace takes at least ~(\d+) s here", second.reason).group(1))  # type: ignore[union-attr]
    assert expected >= 2.5 * first.wall_s  # its forward and at least the backward it refused
    # the FLOP count's forward (stopped early, or not begun where the device probe took most
    # of the 4 s: 3.1 s on a busy 2-core host) and the first trace's, whole: no third forward
    assert len(progress) <= 2 and progress[-1] == 50, progress
    # both rows name the budget whose core share runs the two traces, at that cost each, as
    # a lower bound (the trace stopped before its end)
    tail = re.search(
        r"; --budget-s (\d+) at least would cover the 2 traces of fp32/none left out \(a trace "
        r"stopped before its end gives only a lower bound of its time\)$",
        first.reason,
    )
    assert tail is not None and second.reason.endswith(tail.group(0)), (first.reason, second.reason)
    assert int(tail.group(1)) > options.budget_s + 2 * expected
    assert "a larger --budget-s" not in first.reason + second.reason
