"""Communication probe: records, nccl-tests arithmetic, alpha-beta fit, and real gloo launches.

The launches (world 2, gloo, CPU) each cost ~2-4 s of spawn + rendezvous on 2 cores.
"""

from __future__ import annotations

import itertools
import json
import math
import time

import pytest

from profilers.comm import (
    COLLECTIVES,
    CommFit,
    CommProfile,
    CommRun,
    CommSample,
    _launch_world,
    available_world_sizes,
    bus_bandwidth_factor,
    fit_alpha_beta,
    message_sizes,
    predict_collective_time,
    probe_communication,
)

KiB = 1024
MiB = 1024 * KiB


def _sample(collective: str = "all_reduce", num_bytes: int = MiB, **changes: object) -> CommSample:
    fields: dict[str, object] = {
        "backend": "gloo",
        "device_type": "cpu",
        "collective": collective,
        "world_size": 2,
        "bytes": num_bytes,
        "time_s": (2e-3, 1e-3, 3e-3),
        "iters_per_sample": 4,
    }
    fields.update(changes)
    return CommSample(**fields)  # type: ignore[arg-type]


# --- pure arithmetic and records -------------------------------------------------------------


@pytest.mark.parametrize(
    ("collective", "world_size", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_gather", 2, 0.5),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("broadcast", 8, 1.0),
    ],
)
def test_bus_bandwidth_factor_follows_nccl_tests(
    collective: str, world_size: int, factor: float
) -> None:
    assert bus_bandwidth_factor(collective, world_size) == pytest.approx(factor)


def test_bus_bandwidth_factor_rejects_unknown_collective() -> None:
    with pytest.raises(ValueError, match="all_to_all"):
        bus_bandwidth_factor("all_to_all", 2)


def test_sample_bandwidths_use_median_time() -> None:
    sample = _sample("all_reduce", 10**6, world_size=4)
    assert sample.time_median_s == pytest.approx(2e-3)
    assert sample.algbw_GBps == pytest.approx(0.5)  # 1e6 B / 2e-3 s = 0.5 GB/s
    assert sample.busbw_GBps == pytest.approx(0.5 * 2 * 3 / 4)


def test_records_round_trip_through_json() -> None:
    samples = [_sample(c, b) for c in COLLECTIVES for b in (KiB, MiB)]
    samples.append(
        _sample("reduce_scatter", 0, time_s=(), status="unsupported", reason="RuntimeError: no")
    )
    run = CommRun(
        backend="gloo",
        device_type="cpu",
        world_size=2,
        status="ok",
        wall_s=3.0,
        launch_overhead_s=2.0,
        init_process_group_s=0.1,
        stopped_by="budget",
        max_bytes_measured=MiB,
        num_samples=len(samples),
    )
    profile = CommProfile(samples=tuple(samples), fits=fit_alpha_beta(samples), runs=(run,))
    data = json.loads(json.dumps(profile.to_dict()))
    assert set(data) == {"samples", "fits", "runs"}
    assert set(data["samples"][0]) >= {
        "backend",
        "collective",
        "world_size",
        "bytes",
        "time_s",
        "time_median_s",
        "algbw_GBps",
        "busbw_GBps",
        "status",
        "reason",
    }
    assert set(data["fits"][0]) >= {"alpha_s", "beta_s_per_byte", "bandwidth_GBps"}
    assert CommProfile.from_dict(data) == profile


def test_records_reject_bad_status() -> None:
    with pytest.raises(ValueError, match="status"):
        _sample(status="fine")
    with pytest.raises(ValueError, match="at least one time"):
        _sample(time_s=())


def test_alpha_beta_fit_recovers_synthetic_latency_and_bandwidth() -> None:
    alpha, bandwidth = 50e-6, 10e9  # 50 us, 10 GB/s
    sizes = [4 * KiB * 4**i for i in range(8)]
    samples = [
        _sample("all_gather", b, time_s=(alpha + b / bandwidth,) * 3, world_size=4) for b in sizes
    ]
    samples.append(_sample("broadcast", MiB))  # one size only: no fit for broadcast
    (fit,) = fit_alpha_beta(samples)
    assert (fit.collective, fit.world_size, fit.num_points) == ("all_gather", 4, len(sizes))
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.bandwidth_GBps == pytest.approx(10.0, rel=1e-6)
    assert fit.max_relative_residual < 1e-9
    assert predict_collective_time(fit, 100 * MiB) == pytest.approx(alpha + 100 * MiB / bandwidth)
    assert CommFit.from_dict(fit.to_dict()) == fit


def test_prediction_is_floored_at_the_fastest_measurement() -> None:
    fit = CommFit(
        backend="gloo",
        device_type="cpu",
        collective="all_reduce",
        world_size=2,
        alpha_s=-1e-3,  # what OLS gives when the largest sizes dominate
        beta_s_per_byte=1e-9,
        min_bytes=4 * KiB,
        max_bytes=64 * MiB,
        min_time_s=2e-4,
        num_points=15,
        max_relative_residual=0.5,
    )
    assert predict_collective_time(fit, 0) == 2e-4
    assert predict_collective_time(fit, 10**8) == pytest.approx(0.099)
    with pytest.raises(ValueError, match="non-negative"):
        predict_collective_time(fit, -1)


def test_message_sizes_grow_and_split_evenly() -> None:
    assert len(message_sizes(4 * KiB, 64 * MiB, 3, growth=2)) == 15
    sizes = message_sizes(4 * KiB, 64 * MiB, 3)
    assert sizes[0] <= 4 * KiB and sizes[-1] <= 64 * MiB and len(sizes) == 8
    assert all(s % (4 * 3) == 0 for s in sizes)
    assert all(b > a for a, b in itertools.pairwise(sizes))


def test_available_world_sizes() -> None:
    assert available_world_sizes("cpu", max_world_size=6) == (2, 4, 6)
    assert available_world_sizes("cpu", max_world_size=1) == ()
    assert set(available_world_sizes("cpu")) <= {2}


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(ValueError, match="device_type='cuda'"):
        probe_communication(world_sizes=[2], backend="nccl", device_type="cpu")
    with pytest.raises(ValueError, match="at least 2"):
        probe_communication(world_sizes=[1])
    with pytest.raises(ValueError, match="collectives"):
        probe_communication(world_sizes=[2], collectives=["all_to_all"])
    if not available_world_sizes("cuda"):
        with pytest.raises(ValueError, match="one GPU per rank"):
            probe_communication(world_sizes=[2], device_type="cuda")


# --- real launches: gloo, 2 CPU ranks -------------------------------------------------------


def test_small_gloo_run_measures_every_collective() -> None:
    lines: list[str] = []
    profile = probe_communication(
        world_sizes=[2],
        min_bytes=4 * KiB,
        max_bytes=64 * KiB,
        budget_s=30.0,
        num_samples=2,
        progress=lines.append,
    )
    (run,) = profile.runs
    assert run.status == "ok", run.reason
    assert run.stopped_by == "max_bytes" and run.max_bytes_measured == 64 * KiB
    assert run.launch_overhead_s is not None and run.launch_overhead_s > 0
    for collective in COLLECTIVES:
        measured = [s for s in profile.samples if s.collective == collective]
        assert [s.bytes for s in measured] == [4 * KiB, 16 * KiB, 64 * KiB]
        for sample in measured:
            assert sample.status == "ok" and len(sample.time_s) == 2
            assert sample.busbw_GBps is not None and sample.busbw_GBps > 0
        fit = profile.fit_for(collective, 2)
        assert fit is not None and math.isfinite(fit.alpha_s)
    rs = next(s for s in profile.samples if s.collective == "reduce_scatter")
    assert "all_reduce" in rs.implementation  # gloo's emulation is labelled
    assert any("busbw" in line for line in lines) and any("ready" in line for line in lines)


def test_budget_stops_growing_sizes() -> None:
    started = time.monotonic()
    profile = probe_communication(
        world_sizes=[2],
        collectives=["all_reduce", "broadcast"],
        min_bytes=4 * KiB,
        max_bytes=1024 * MiB,  # far beyond what a 1 s budget reaches
        budget_s=1.0,
        num_samples=1,
    )
    (run,) = profile.runs
    assert run.status == "ok", run.reason
    assert run.stopped_by == "budget"
    assert 8 * KiB <= run.max_bytes_measured < 64 * MiB  # two sizes at least, far from the cap
    assert time.monotonic() - started < 30


def test_a_rank_that_raises_is_an_error_with_its_reason() -> None:
    started = time.monotonic()
    run, samples = _launch_world(
        backend="gloo",
        device_type="cpu",
        world_size=2,
        collectives=("all_reduce", "all_gather"),
        sizes=(4 * KiB, 8 * KiB),
        budget_s=10.0,
        timeout_s=5.0,
        num_samples=1,
        fault=("raise", 1),
    )
    assert run.status == "error"
    assert "rank 1" in run.reason and "injected fault" in run.reason
    assert len(samples) >= 1 and all(s.status == "ok" for s in samples)  # kept what was measured
    assert time.monotonic() - started < 30


def test_a_hung_rank_times_out_instead_of_hanging() -> None:
    started = time.monotonic()
    run, _samples = _launch_world(
        backend="gloo",
        device_type="cpu",
        world_size=2,
        collectives=("all_reduce", "all_gather"),
        sizes=(4 * KiB, 8 * KiB),
        budget_s=10.0,
        timeout_s=3.0,
        num_samples=1,
        fault=("hang", 1),
    )
    assert run.status == "timeout"
    assert "time" in run.reason.lower()  # gloo: "Timed out waiting..." or "Application timeout..."
    assert time.monotonic() - started < 30


@pytest.mark.gpu
def test_nccl_run_on_local_gpus() -> None:
    sizes = available_world_sizes("cuda")
    if not sizes:
        pytest.skip("needs at least two CUDA devices")
    profile = probe_communication(
        world_sizes=sizes[:1], device_type="cuda", max_bytes=64 * MiB, budget_s=60.0
    )
    (run,) = profile.runs
    assert run.status == "ok", run.reason
    assert {f.collective for f in profile.fits} == set(COLLECTIVES)
    assert all((f.bandwidth_GBps or 0) > 1 for f in profile.fits)  # NVLink/PCIe, not loopback
