from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import torch

from profilers.isolate import Isolation, run_isolated
from profilers.throughput import (
    StepTimer,
    StepTiming,
    TimeModel,
    fit_step_time,
    fit_step_times,
    measure_interleaved,
    profile_step_time,
    round_robin,
    time_steps,
)
from profilers.workload import Batch, StepSpec, StepStats
from tests.profilers.toy_workload import ToyStep, ToyWorkload

TINY = ToyWorkload(d=16, layers=1, heads=2, max_len=16)


def spec(b: int = 1, **kw: object) -> StepSpec:
    return StepSpec(seq_len=8, micro_batch_size=b, **kw)  # type: ignore[arg-type]


class _LoggedStep:
    """A ToyStep that logs (micro_batch_size, phase) for every call."""

    def __init__(self, inner: ToyStep, log: list[tuple[int, str]]) -> None:
        self.inner, self.log = inner, log
        self.spec, self.model, self.optimizer = inner.spec, inner.model, inner.optimizer
        self.device = inner.device

    def synthetic_batches(self, generator: torch.Generator | None = None) -> list[Batch]:
        return self.inner.synthetic_batches(generator)

    def forward_backward(self, batches: Sequence[Batch]) -> torch.Tensor:
        self.log.append((self.spec.micro_batch_size, "fb"))
        return self.inner.forward_backward(batches)

    def optimizer_step(self) -> StepStats:
        self.log.append((self.spec.micro_batch_size, "opt"))
        return self.inner.optimizer_step()

    def step(self, batches: Sequence[Batch]) -> tuple[torch.Tensor, StepStats]:
        return self.forward_backward(batches), self.optimizer_step()


@dataclass(frozen=True)
class _LoggedWorkload:
    inner: ToyWorkload = TINY
    log: list[tuple[int, str]] = field(default_factory=list, compare=False)

    def facts(self):  # type: ignore[no-untyped-def]
        return self.inner.facts()

    def build_step(self, spec: StepSpec, device: object, *, from_meta: bool = False) -> _LoggedStep:
        return _LoggedStep(self.inner.build_step(spec, device, from_meta=from_meta), self.log)  # type: ignore[arg-type]


def _timing(
    b: int, fb: Sequence[float], opt: Sequence[float], threads: int = 0, **kw: object
) -> StepTiming:
    return StepTiming(
        spec=spec(b, **kw),
        device="cpu",
        num_warmup=1,
        forward_backward_s=tuple(fb),
        optimizer_s=tuple(opt),
        threads=threads,
    )


# --- measuring -------------------------------------------------------------------------------


def test_time_steps_discards_warmup_and_keeps_every_sample() -> None:
    workload = _LoggedWorkload()
    timing = time_steps(workload, spec(2), "cpu", warmup=2, repeats=3)
    assert workload.log == [(2, "fb"), (2, "opt")] * 5  # 2 warm-up + 3 timed steps
    assert timing.num_warmup == 2
    assert len(timing.forward_backward_s) == len(timing.optimizer_s) == 3
    assert all(s > 0 for s in timing.step_s)
    assert timing.clock == "perf_counter"
    assert timing.tokens_per_step == 2 * 8
    assert timing.median_step_s == pytest.approx(sorted(timing.step_s)[1])
    assert timing.tokens_per_s == pytest.approx(16 / timing.median_step_s)


def test_interleaving_is_round_robin_after_warming_every_config() -> None:
    workload = _LoggedWorkload()
    timings = measure_interleaved(workload, [spec(1), spec(2), spec(3)], "cpu", rounds=2, warmup=1)
    fb_order = [b for b, phase in workload.log if phase == "fb"]
    assert fb_order == [1, 2, 3, 1, 2, 3, 1, 2, 3]  # warm-ups, then two rounds
    assert [t.spec.micro_batch_size for t in timings] == [1, 2, 3]
    assert all(len(t.forward_backward_s) == 2 and t.num_warmup == 1 for t in timings)


def test_no_round_starts_after_the_deadline_but_the_first_always_runs() -> None:
    workload = _LoggedWorkload()
    past = time.perf_counter() - 1.0
    timings = measure_interleaved(
        workload, [spec(1), spec(2)], "cpu", rounds=3, warmup=0, deadline=past
    )
    assert [b for b, phase in workload.log if phase == "fb"] == [1, 2]  # one whole round
    assert all(len(t.forward_backward_s) == 1 for t in timings)
    future = time.perf_counter() + 3600.0
    timings = measure_interleaved(TINY, [spec(1)], "cpu", rounds=3, warmup=0, deadline=future)
    assert len(timings[0].forward_backward_s) == 3


def test_round_robin_order() -> None:
    assert round_robin(3, 2) == [0, 1, 2, 0, 1, 2]
    assert round_robin(1, 3) == [0, 0, 0]


def test_steps_per_round_multiplies_samples() -> None:
    timings = measure_interleaved(
        TINY, [spec(1), spec(2)], "cpu", rounds=2, warmup=0, steps_per_round=2
    )
    assert [len(t.optimizer_s) for t in timings] == [4, 4]
    assert [t.num_warmup for t in timings] == [0, 0]


def test_grad_accumulation_runs_every_micro_batch() -> None:
    timing = time_steps(TINY, spec(1, grad_accum_steps=3), "cpu", warmup=0, repeats=1)
    assert timing.tokens_per_step == 3 * 8


def test_step_timer_outside_with_block_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="with"):
        StepTimer(TINY, spec(), "cpu").sample()


def test_invalid_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match="repeats"):
        time_steps(TINY, spec(), "cpu", repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        measure_interleaved(TINY, [spec()], "cpu", warmup=-1)


def test_profile_step_time_fits_the_probed_sizes() -> None:
    timings, model = profile_step_time(
        TINY, spec(5, grad_accum_steps=4), "cpu", micro_batch_sizes=(1, 3), rounds=2, warmup=1
    )
    assert [(t.spec.micro_batch_size, t.spec.grad_accum_steps) for t in timings] == [(1, 1), (3, 1)]
    assert model.forward_backward.xs == (1.0, 1.0, 3.0, 3.0)
    assert (model.precision, model.activation_checkpointing, model.seq_len) == ("fp32", "none", 8)


def test_time_steps_runs_isolated() -> None:
    outcome = run_isolated(
        Isolation(timeout_s=120, num_threads=1),
        time_steps,
        TINY,
        spec(2),
        "cpu",
        warmup=1,
        repeats=2,
    )
    assert outcome.status == "ok", outcome.reason
    assert isinstance(outcome.value, StepTiming) and len(outcome.value.step_s) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_time_steps_on_cuda_uses_events() -> None:
    timing = time_steps(TINY, spec(2, precision="bf16"), "cuda", warmup=2, repeats=3)
    assert timing.clock == "cuda_events"
    assert len(timing.step_s) == 3 and all(s > 0 for s in timing.step_s)


# --- records ---------------------------------------------------------------------------------


def test_step_timing_round_trips_through_json() -> None:
    timing = _timing(4, [0.3, 0.1, 0.2], [0.05, 0.07, 0.06])
    data = json.loads(json.dumps(timing.to_dict()))
    assert StepTiming.from_dict(data) == timing
    assert data["median_forward_backward_s"] == 0.2
    assert data["median_optimizer_s"] == 0.06
    assert data["median_step_s"] == pytest.approx(0.26)


def test_the_host_share_a_timing_child_saw_travels_with_its_timings() -> None:
    import dataclasses

    from profilers.host_activity import PROC_STAT
    from profilers.throughput import interleaved_child

    plain = _timing(4, [0.3], [0.05])
    assert "host_others_share" not in plain.to_dict()  # not measured: profiles stay as they were
    busy = dataclasses.replace(plain, host_others_share=0.4)
    assert StepTiming.from_dict(json.loads(json.dumps(busy.to_dict()))) == busy
    got = interleaved_child(TINY, [spec(2), spec(4)], "cpu", 30.0, 1)
    if PROC_STAT.is_file():
        assert all(0.0 <= d["host_others_share"] <= 1.0 for d in got)
    assert [StepTiming.from_dict(d).spec.micro_batch_size for d in got] == [2, 4]


def test_step_timing_rejects_unpaired_samples() -> None:
    with pytest.raises(ValueError, match="pair"):
        _timing(1, [0.1, 0.2], [0.1])


# --- fitting ---------------------------------------------------------------------------------


def test_fit_recovers_a_known_affine_and_composes_accumulation() -> None:
    # t_fb(b) = 0.5 + 0.25 b exactly; the optimizer step takes 0.1 s (median of 0.1, 0.1, 0.4 ...)
    timings = [_timing(b, [0.5 + 0.25 * b] * 3, [0.1, 0.4, 0.1]) for b in (2, 8)]
    model = fit_step_time(timings)
    assert model.forward_backward.intercept == pytest.approx(0.5, rel=1e-12)
    assert model.forward_backward.slope == pytest.approx(0.25, rel=1e-12)
    assert model.optimizer_s == pytest.approx(0.1)
    assert model.predict(4) == pytest.approx(1.5 + 0.1)
    assert model.predict(4, grad_accum_steps=3) == pytest.approx(3 * 1.5 + 0.1)
    assert model.tokens_per_s(4, 3) == pytest.approx(4 * 3 * 8 / (3 * 1.5 + 0.1))
    assert TimeModel.from_dict(json.loads(json.dumps(model.to_dict()))) == model


def test_fit_uses_every_sample_and_normalises_accumulation() -> None:
    # Samples scatter around 1 + 1*b; at b=4 the config ran 2 micro-batches per step.
    timings = [
        _timing(1, [1.9, 2.1], [0.1, 0.1]),
        _timing(4, [10.0, 10.0], [0.1, 0.1], grad_accum_steps=2),
    ]
    model = fit_step_time(timings)
    assert model.forward_backward.xs == (1.0, 1.0, 4.0, 4.0)
    assert model.forward_backward.ys == (1.9, 2.1, 5.0, 5.0)
    assert model.forward_backward.predict(1) == pytest.approx(2.0)
    assert model.forward_backward.predict(4) == pytest.approx(5.0)


def test_fit_refuses_mixed_groups_and_fit_step_times_splits_them() -> None:
    fp32 = [_timing(b, [1.0 + b], [0.1]) for b in (1, 2)]
    ckpt = [_timing(b, [2.0 + b], [0.2], activation_checkpointing="full") for b in (1, 2)]
    with pytest.raises(ValueError, match="fit_step_times"):
        fit_step_time(fp32 + ckpt)
    models = fit_step_times(ckpt + fp32)
    assert [m.activation_checkpointing for m in models] == ["full", "none"]
    assert [m.forward_backward.intercept for m in models] == pytest.approx([2.0, 1.0])


def test_fit_needs_two_micro_batch_sizes() -> None:
    with pytest.raises(ValueError, match="two or more distinct"):
        fit_step_time([_timing(2, [1.0, 1.1], [0.1, 0.1])])


def test_a_timing_on_fewer_threads_gives_the_split_ratio_and_stays_out_of_the_fit() -> None:
    # Two threads: t_fb = 1 + b; one thread at b = 8: 1.6x the two-thread step (not 2x).
    full = [_timing(b, [1.0 + b] * 2, [0.1, 0.1], threads=2) for b in (2, 8)]
    half = _timing(8, [1.6 * 9.0 + 0.06] * 2, [0.1, 0.1], threads=1)
    model = fit_step_time([*full, half])
    assert model.forward_backward.xs == (2.0, 2.0, 8.0, 8.0)  # the split timing is not fitted
    assert model.forward_backward.intercept == pytest.approx(1.0)
    assert (model.threads, model.split_threads) == (2, 1)
    assert model.split_ratio == pytest.approx(1.6)
    assert TimeModel.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    # Without one: nothing to say; a profile from before these fields reads the same way.
    plain = fit_step_time(full)
    assert plain.split_ratio is None and plain.split_threads == 0
    legacy = {k: v for k, v in plain.to_dict().items() if "threads" not in k and "split" not in k}
    assert TimeModel.from_dict(legacy).split_ratio is None


def test_step_timer_records_the_cpu_thread_count() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        timing = time_steps(TINY, spec(2), "cpu", warmup=1, repeats=1)
    finally:
        torch.set_num_threads(before)
    assert timing.threads == 1
    assert StepTiming.from_dict(json.loads(json.dumps(timing.to_dict()))).threads == 1
