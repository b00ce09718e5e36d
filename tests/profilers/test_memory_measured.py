"""A model no fake trace can run (it reads tensor values on the host: a mixture of experts that
counts its tokens per expert with ``.tolist()``, as transformers' JetMoE does) has its memory
measured on real steps instead: before, every memory probe of such a model failed and it got
no plan."""

from __future__ import annotations

import pytest
import torch

from advisor.workload import AdvisorWorkload
from profilers.flops import count_step_flops
from profilers.memory import measure_cpu_step_memory, trace_step_memory
from profilers.memory_measured import (
    REAL_STEP,
    measure_step_trace,
    needs_real_values,
    training_state_bytes,
)
from profilers.memory_records import MemoryTrace
from profilers.phases_core import _trace
from profilers.probe_run import ProbeRun, ProfileOptions
from profilers.profiler import run_profile
from profilers.workload import StepSpec

ROUTED = "tests/data/host_routed_model.py:factory"
SPEC = StepSpec(seq_len=32, micro_batch_size=4)


@pytest.fixture(scope="module")
def workload() -> AdvisorWorkload:
    return AdvisorWorkload(ROUTED)


def test_the_fake_trace_fails_for_want_of_values_and_says_so(workload: AdvisorWorkload) -> None:
    with pytest.raises(Exception) as caught:
        trace_step_memory(workload, SPEC)
    assert needs_real_values(caught.value)
    assert not needs_real_values(ValueError("a bad shape"))
    wrapped = RuntimeError("raised while tracing")  # what caused an error counts too
    wrapped.__cause__ = caught.value
    assert needs_real_values(wrapped)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_real_step_trace_is_the_allocators_peak_with_the_state_named(
    workload: AdvisorWorkload, precision: str
) -> None:
    spec = StepSpec(seq_len=32, micro_batch_size=4, precision=precision)
    trace = MemoryTrace.from_dict(measure_step_trace(workload, spec, "cpu", "cpu"))
    truth = measure_cpu_step_memory(workload, spec)
    assert trace.method == REAL_STEP and MemoryTrace.from_dict(trace.to_dict()) == trace
    assert trace.peak_bytes == truth.peak_bytes
    assert trace.forward_backward_peak_bytes == truth.forward_backward_peak_bytes
    assert trace.optimizer_step_peak_bytes == truth.optimizer_step_peak_bytes
    params = workload.facts().num_params
    assert trace.parameter_bytes == trace.gradient_bytes == 4 * params  # fp32 master weights
    # AdamW's two moments, plus one scalar step count per parameter tensor
    tensors = len(list(workload.build_step(spec, "cpu").model.parameters()))
    assert trace.optimizer_state_bytes == 8 * params + 4 * tensors
    for breakdown, peak in (
        (trace.forward_backward_breakdown, trace.forward_backward_peak_bytes),
        (trace.optimizer_step_breakdown, trace.optimizer_step_peak_bytes),
    ):
        assert breakdown.total == peak and breakdown.other > 0
        assert breakdown.parameters == 4 * params and breakdown.activations == 0


def test_a_profile_measures_what_it_cannot_trace_and_fits_it(workload: AdvisorWorkload) -> None:
    options = ProfileOptions(
        seq_len=32,
        budget_s=30,
        precisions=("fp32",),
        checkpointing=("none",),
        comm=False,
        input_workers=(),
    )
    profile = run_profile(workload, options)
    rows = [r for r in profile.probes if r.probe == "memory"]
    done = [r for r in rows if r.status == "ok"]
    assert len(done) >= 2, [(r.status, r.reason) for r in rows]
    assert all(r.status != "error" for r in rows)  # the failed fake trace is not a row
    assert all(r.reason.startswith("real step: no fake trace can run this model") for r in done)
    assert all(t.method == REAL_STEP for t in profile.memory)
    checks = [r for r in profile.probes if r.probe == "memory_check" and r.status == "ok"]
    assert checks and all(r.reason.startswith("real-step fit ") for r in checks)
    (model,) = [m for m in profile.fits.memory if m.activation_checkpointing == "none"]
    b = done[0].micro_batch_size
    assert model.predict(b) == pytest.approx(done[0].value, rel=0.01)


def test_a_real_step_that_cannot_fit_is_skipped_with_the_reason(
    workload: AdvisorWorkload,
) -> None:
    run = ProbeRun(workload, ProfileOptions(seq_len=32), None)
    run.untraceable = "DynamicOutputShapeException: aten.bincount.default"
    run.usable_bytes = 2**19
    run.state_bytes = training_state_bytes(workload.facts().num_params)  # 16 B/param: 0.8 MiB
    assert _trace(run, SPEC, "cpu") is None
    (row,) = run.rows
    assert row.status == "skipped"
    assert "no fake trace can run this model (DynamicOutputShapeException" in row.reason
    assert "a real step cannot fit" in row.reason and "GiB usable" in row.reason


def test_its_flops_are_counted_on_a_real_step_unless_that_cannot_fit_the_host(
    workload: AdvisorWorkload, monkeypatch: pytest.MonkeyPatch
) -> None:
    import profilers.device

    spec = StepSpec(seq_len=32, micro_batch_size=1)
    assert count_step_flops(workload, spec).method == "real"
    # 8 B/param of fp32 weights and gradients: 0.4 MB here, more than this host has left
    monkeypatch.setattr(profilers.device, "read_host_memory", lambda: (2**30, 2**18))
    with pytest.raises(RuntimeError, match=r"no FLOP count: the fake count failed \(Fake"):
        count_step_flops(workload, spec)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_real_step_trace_is_the_caching_allocators_step_peak(
    workload: AdvisorWorkload,
) -> None:
    from profilers.memory import measure_cuda_step_memory

    spec = StepSpec(seq_len=32, micro_batch_size=4, precision="bf16")
    trace = MemoryTrace.from_dict(measure_step_trace(workload, spec, "cuda", "cuda"))
    truth = measure_cuda_step_memory(workload, spec)
    assert trace.target_device_type == "cuda" and trace.method == REAL_STEP
    # the step's own peak: the libraries' per-process workspaces are the checks' overhead
    assert trace.peak_bytes == pytest.approx(truth.step_peak_allocated_bytes, rel=0.02)
    assert trace.parameter_bytes == 4 * workload.facts().num_params
