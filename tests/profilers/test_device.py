from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from profilers import device
from profilers.device import (
    DeviceInfo,
    probe_device,
    read_cpu_info,
    read_host_memory,
    supported_precisions,
)
from profilers.hardware import match_device
from profilers.workload import PRECISIONS

BUDGET_S = 2.0


@pytest.fixture(scope="module")
def cpu_info() -> DeviceInfo:
    return probe_device("cpu", budget_s=BUDGET_S)


def test_cpu_probe_shape(cpu_info: DeviceInfo) -> None:
    info = cpu_info
    assert info.kind == "cpu" and info.index is None and info.gpu is None
    assert info.datasheet is None and info.peak_flops("bf16") is None  # CPUs: never a guess
    assert 0 < info.free_memory_bytes <= info.total_memory_bytes
    assert info.cpu.num_logical_cores >= info.cpu.num_usable_cores >= 1
    assert info.cpu.torch_num_threads >= 1 and info.cpu.torch_cpu_capability
    assert set(info.matmul) == {"fp32", "bf16", "fp16"}  # TF32 is a CUDA mode
    for bench in info.matmul.values():
        assert bench.error is not None or (bench.samples_s and bench.rate and bench.size >= 512)
    fp32 = info.measured_flops("fp32")
    assert fp32 is not None and fp32 > 1e8  # any CPU of this decade does > 0.1 GFLOP/s
    assert info.memory_bandwidth is not None and (info.memory_bandwidth.rate or 0) > 1e8
    assert list(info.precisions) == list(PRECISIONS)
    assert info.precisions["fp32"].speedup_vs_fp32 == 1.0
    assert all(check.supported for check in info.precisions.values())
    assert info.budget_s == BUDGET_S and info.elapsed_s > 0


def test_the_probe_splits_its_budget_into_fixed_shares_that_add_up_to_it(
    cpu_info: DeviceInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each phase plans its calls within the share it is given (the shares are what bound the
    probe; its wall time on a loaded host is not asserted: a call that started in time may end
    after it)."""
    shares: list[tuple[str, float]] = []

    def record(name: str, result: object) -> Callable[..., object]:
        def bench(dev: object, *args: object) -> object:
            budget = next(a for a in args if isinstance(a, float))
            shares.append((name, budget))
            return result

        return bench

    real = cpu_info
    monkeypatch.setattr(device, "matmul_benchmark", record("matmul", real.matmul["fp32"]))
    monkeypatch.setattr(device, "copy_benchmark", record("copy", real.memory_bandwidth))
    monkeypatch.setattr(device, "precision_benchmarks", record("precision", real.precisions))
    info = probe_device("cpu", budget_s=7.0)
    names = [name for name, _ in shares]
    assert names == ["matmul"] * len(info.matmul) + ["copy", "precision"]
    assert sum(budget for _, budget in shares) == pytest.approx(7.0)
    matmul = [budget for name, budget in shares if name == "matmul"]
    assert len(set(matmul)) == 1 and dict(shares)["precision"] == pytest.approx(3 * matmul[0])
    assert dict(shares)["copy"] == pytest.approx(0.5 * matmul[0])


def test_device_info_round_trips_through_json(cpu_info: DeviceInfo) -> None:
    data = json.loads(json.dumps(cpu_info.to_dict()))
    assert data["matmul"]["fp32"]["rate"] == cpu_info.measured_flops("fp32")
    assert DeviceInfo.from_dict(data) == cpu_info


def test_supported_precisions_on_cpu() -> None:
    assert supported_precisions("cpu") == {"fp32": None, "bf16": None, "fp16": None}


def test_unsupported_devices_are_refused() -> None:
    with pytest.raises(ValueError, match="unsupported device 'meta'"):
        probe_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here: use 'cpu'"):
            supported_precisions("cuda")


def test_read_cpu_info_keeps_isa_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Test CPU 9000\n"
        "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_tile amx_bf16\n\n"
        "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu\n"
    )
    info = read_cpu_info(str(cpuinfo))
    assert info.model_name == "Test CPU 9000"
    assert info.isa_flags == (
        "amx_bf16",
        "amx_tile",
        "avx",
        "avx2",
        "avx512_bf16",
        "avx512f",
        "fma",
    )


def test_read_host_memory_parses_meminfo_and_honours_a_cgroup_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree:     100 kB\nMemAvailable:    600 kB\n")
    monkeypatch.setattr(device, "_cgroup_memory", lambda: (None, None))
    assert read_host_memory(str(meminfo)) == (1000 * 1024, 600 * 1024)
    # A container limited to 500 KiB, 100 KiB of it in use: the limit is the machine.
    monkeypatch.setattr(device, "_cgroup_memory", lambda: (500 * 1024, 100 * 1024))
    assert read_host_memory(str(meminfo)) == (500 * 1024, 400 * 1024)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
def test_cuda_probe() -> None:
    info = probe_device("cuda", budget_s=6.0)
    assert info.kind == "cuda" and info.index is not None and info.gpu is not None
    assert info.datasheet == match_device(info.name)
    major = int(info.gpu.compute_capability.split(".")[0])
    assert "tf32" in info.matmul
    assert info.precisions["bf16"].supported == (major >= 8)
    assert (info.measured_flops("fp32") or 0) > 1e11
    if info.datasheet is not None:  # measured GEMMs cannot beat the datasheet by much
        for dtype in ("fp32", "bf16"):
            peak, measured = info.peak_flops(dtype), info.measured_flops(dtype)
            if peak and measured:
                assert measured < 1.15 * peak
    assert DeviceInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


@pytest.mark.gpu
@gpu
def test_cuda_bf16_refusal_names_the_fix() -> None:
    reasons = supported_precisions("cuda")
    if torch.cuda.get_device_capability()[0] < 8:
        assert "--precision fp16" in (reasons["bf16"] or "")
    else:
        assert reasons == {"fp32": None, "bf16": None, "fp16": None}


def test_one_precision_is_checked_alone_and_fp32_needs_no_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: list[str] = []
    monkeypatch.setattr(device, "try_autocast_step", lambda dev, p: tried.append(p))
    assert device.precision_problem("cpu", "fp32") is None
    assert device.precision_problem("cpu", "bf16") is None
    assert tried == ["bf16"]
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        device.precision_problem("cpu", "fp8")


def test_a_precisions_speed_comes_from_timed_calls_never_from_its_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first device run (an H200): bf16's first call took 1.33 s (its kernels' set-up), fp32's
    # 35 ms, and a budget spent on warm-ups read bf16 as 38x slower than fp32; the core then
    # priced bf16's timing far past the budget and the plan was fp32.
    import torch

    from profilers import device_precision

    calls: dict[str, int] = {}
    warm = {"fp32": 0.035, "bf16": 1.33}
    timed = {"fp32": 0.035, "bf16": 0.012}

    def fake_time_call(fn: object, sync: object) -> float:
        p = fn.args[2]  # type: ignore[attr-defined]  # functools.partial(_autocast_step, b, x, p)
        calls[p] = calls.get(p, 0) + 1
        return warm[p] if calls[p] == 1 else timed[p]

    monkeypatch.setattr(device_precision, "time_call", fake_time_call)
    checks = device_precision.precision_benchmarks(
        torch.device("cpu"), 60.0, {"fp32": None, "bf16": None, "fp16": "unsupported"}
    )
    assert checks["bf16"].speedup_vs_fp32 == pytest.approx(0.035 / 0.012)
    assert checks["bf16"].samples_s and all(s == 0.012 for s in checks["bf16"].samples_s)
    assert not checks["bf16"].warmup_only and checks["fp16"].reason == "unsupported"


def test_a_gpu_profiles_parent_frees_its_benchmark_memory_before_any_child_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first device run: the GEMM benchmarks' operands stayed in the parent's caching
    # allocator, and every child, reading the whole device's use, charged 10.2 GB as context.
    import torch

    from profilers import phases_facts
    from profilers.probe_run import ProbeRun, ProfileOptions
    from tests.profilers.toy_workload import ToyWorkload

    freed: list[str] = []
    info = device.probe_device("cpu", budget_s=0.5)
    monkeypatch.setattr(device, "probe_device", lambda *a, **k: info)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append("cache"))
    monkeypatch.setattr(
        torch._C, "_cuda_clearCublasWorkspaces", lambda: freed.append("cublas"), raising=False
    )
    cpu = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=16, budget_s=10, device="cpu"), None)
    assert phases_facts.device_phase(cpu) is info and freed == []
    gpu = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=16, budget_s=10, device="cuda"), None)
    assert phases_facts.device_phase(gpu) is info and freed == ["cublas", "cache"]
