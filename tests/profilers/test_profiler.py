"""run_profile end to end on the toy workload: the profile's shape, its fits, probes.csv, the
files' round trip, and a workload whose real steps crash or hang for some precisions.

Each profile costs its budget in wall time (the probes fill their shares), so the module runs
two: one healthy, one faulty, each shared by several tests. No wall-clock assertions beyond a
generous "roughly within budget".
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from profilers.memory_model import MemoryModel
from profilers.memory_records import CpuStepMemory
from profilers.profile_record import PROBE_STATUSES, ProbeRow, Profile, load_profile
from profilers.profiler import ProfileOptions, run_profile
from profilers.workload import CHECKPOINTING, PRECISIONS
from tests.profilers.faulty_workload import CRASH_MESSAGE, FaultyWorkload
from tests.profilers.toy_workload import ToyWorkload

slow = pytest.mark.slow  # a test on a profile below waits for its budget (40-60 s) once

SEQ_LEN = 32
BUDGET_S = 40.0
DESIGN_KEYS = ("device", "model", "memory", "throughput", "communication", "input", "fits")
PROBES = ("device", "model", "flops", "memory", "memory_check", "throughput", "communication")


def within_budget(profile: Profile) -> bool:
    """Roughly: the probes may overrun by a child's timeout, never by much more."""
    assert profile.budget_s is not None
    return profile.elapsed_s <= profile.budget_s * 1.5 + 20


@pytest.fixture(scope="module")
def progress_calls() -> list[tuple[str, float]]:
    return []


@pytest.fixture(scope="module")
def toy_profile(progress_calls: list[tuple[str, float]]) -> Profile:
    options = ProfileOptions(seq_len=SEQ_LEN, budget_s=BUDGET_S, comm=False)
    return run_profile(
        ToyWorkload(), options, lambda message, spent: progress_calls.append((message, spent))
    )


@pytest.fixture(scope="module")
def faulty_profile() -> Profile:
    # bf16 steps raise, fp16 steps hang; fp32 works. One checkpointing mode keeps it short.
    options = ProfileOptions(
        seq_len=SEQ_LEN, budget_s=60.0, comm=False, checkpointing=("none",), input_workers=(0,)
    )
    return run_profile(FaultyWorkload(), options)


def rows(profile: Profile, probe: str, precision: str | None = None) -> list[ProbeRow]:
    return [
        r
        for r in profile.probes
        if r.probe == probe and (precision is None or r.precision == precision)
    ]


def budget_skipped(profile: Profile, precision: str, checkpointing: str) -> bool:
    """Whether a memory row of this group says it was skipped for the time budget."""
    return any(
        r.status == "skipped" and "budget" in r.reason
        for r in rows(profile, "memory", precision)
        if r.activation_checkpointing == checkpointing
    )


# -- the healthy profile -------------------------------------------------------------------------


@slow
def test_profile_has_every_design_key_and_is_json(toy_profile: Profile) -> None:
    data = json.loads(json.dumps(toy_profile.to_dict()))  # JSON-ready all the way down
    assert set(DESIGN_KEYS) <= set(data)
    assert set(data["fits"]) == {"memory", "time", "communication"}
    assert data["model"]["name"] == "toy" and data["model"]["num_params"] > 0
    assert data["model"]["flops"]["flops_per_token"]["none"] > 0
    assert data["device"]["kind"] == "cpu"
    assert data["workload"]["seq_len"] == SEQ_LEN
    assert data["tool"]["torch"] and data["tool"]["python"]
    assert data["communication"] == [] and data["fits"]["communication"] == []  # comm=False
    assert within_budget(toy_profile)


@slow
def test_memory_fits_cover_every_precision_and_checkpointing(toy_profile: Profile) -> None:
    # The toy's traces are cheap, so on a quiet host every group is traced before any timing
    # (phases_core). On a loaded one (CI) the last groups may lose their traces to the budget:
    # then each says so in a row. The baseline group is always traced.
    groups = {(m.precision, m.activation_checkpointing) for m in toy_profile.fits.memory}
    assert ("fp32", "none") in groups
    for group in set(itertools.product(PRECISIONS, CHECKPOINTING)) - groups:
        assert budget_skipped(toy_profile, *group), group
    for model in toy_profile.fits.memory:
        traced = [
            t
            for t in toy_profile.memory
            if (t.spec.precision, t.spec.activation_checkpointing)
            == (model.precision, model.activation_checkpointing)
            and t.spec.grad_accum_steps == 1
        ]
        assert len({t.spec.micro_batch_size for t in traced}) >= 2
        for trace in traced:  # a two-point fit per phase goes through its traces
            assert model.predict(trace.spec.micro_batch_size) == pytest.approx(
                trace.peak_bytes, rel=1e-9
            )
        sizes = [model.predict(b) for b in (1, 2, 4, 8, 16)]
        assert sizes == sorted(sizes)  # more sequences never need less memory
        assert model.predict(4, grad_accum_steps=2) >= model.predict(4)
        assert model.parameter_bytes > 0 and model.optimizer_state_bytes > 0


@slow
def test_traced_memory_matches_the_real_step(toy_profile: Profile) -> None:
    """The memory check measured the fp32 step for real: the trace must agree (DESIGN: <0.01%)."""
    assert toy_profile.memory_measured, "the first memory check always runs"
    for measured in toy_profile.memory_measured:
        spec = measured.spec
        model = toy_profile.fits.memory_model(spec.precision, spec.activation_checkpointing)
        assert isinstance(model, MemoryModel)
        assert isinstance(measured, CpuStepMemory)
        assert model.predict(spec.micro_batch_size) == pytest.approx(measured.peak_bytes, rel=0.02)
    assert 0 <= toy_profile.memory_overhead.trace_error_fraction < 0.02
    assert toy_profile.memory_overhead.fixed_bytes > 0  # process RSS beyond the allocator's peak
    extra = toy_profile.memory_overhead.parallel_bytes  # measured once, in the first check
    assert set(extra) == {"ddp", "fsdp"} and 0 <= extra["ddp"] <= extra["fsdp"]


@slow
def test_time_fit_for_fp32(toy_profile: Profile) -> None:
    model = toy_profile.fits.time_model("fp32", "none")
    assert model is not None, "fp32 without checkpointing is always timed first"
    assert len(set(model.forward_backward.xs)) >= 2
    assert model.optimizer_s > 0 and model.seq_len == SEQ_LEN and model.device == "cpu"
    for b in set(model.forward_backward.xs):  # at the measured sizes the fit is a mean: positive
        assert model.predict(int(b)) > 0
    timed = [t for t in toy_profile.throughput if t.spec.precision == "fp32"]
    assert all(t.forward_backward_s and t.num_warmup >= 1 for t in timed)
    # Every time fit comes from timings in the profile, one per (precision, checkpointing).
    fitted = {(t.precision, t.activation_checkpointing) for t in toy_profile.fits.time}
    timed_groups = {
        (t.spec.precision, t.spec.activation_checkpointing) for t in toy_profile.throughput
    }
    assert fitted == timed_groups


@slow
def test_probe_rows_record_every_probe_with_a_status(toy_profile: Profile) -> None:
    probes = {r.probe for r in toy_profile.probes}
    assert set(PROBES) <= probes
    for row in toy_profile.probes:
        assert row.status in PROBE_STATUSES, row
        if row.status != "ok":
            assert row.reason, row  # every skip, failure or refusal says why
    for precision, checkpointing in itertools.product(PRECISIONS, CHECKPOINTING):
        traced = [
            r
            for r in rows(toy_profile, "memory", precision)
            if r.activation_checkpointing == checkpointing and r.grad_accum_steps == 1
        ]
        # The two largest sizes in the core; the smallest (the hinge of the fit) after, as a
        # refinement while the budget lasts.
        sizes = ProfileOptions(seq_len=SEQ_LEN).trace_micro_batch_sizes
        status = {r.micro_batch_size: r.status for r in traced}
        if budget_skipped(toy_profile, precision, checkpointing):  # a loaded host: see above
            assert {status.get(b, "skipped") for b in sizes[-2:]} <= {"ok", "skipped"}
        else:
            assert [status[b] for b in sizes[-2:]] == ["ok", "ok"]
        assert status[sizes[0]] in ("ok", "skipped")
        assert all(r.value and r.unit == "bytes" for r in traced if r.status == "ok")
        # Each throughput group has a row: timed, skipped for the budget, or failed.
        assert [
            r
            for r in rows(toy_profile, "throughput", precision)
            if r.activation_checkpointing == checkpointing
        ]
    (comm,) = rows(toy_profile, "communication")
    assert (comm.status, comm.reason) == ("skipped", "disabled")
    (inputs,) = rows(toy_profile, "input")  # the toy has no data loader
    assert inputs.status == "skipped"


@slow
def test_progress_reports_each_phase_and_finishes(
    toy_profile: Profile, progress_calls: list[tuple[str, float]]
) -> None:
    messages = [m for m, _ in progress_calls]
    for phase in ("device", "model", "memory", "throughput"):
        assert any(m.startswith(f"{phase}:") for m in messages), phase
    assert messages[-1] == "done"
    spent = [f for _, f in progress_calls]
    assert spent == sorted(spent) and all(0 <= f <= 1 for f in spent)


@slow
def test_save_then_load_round_trips(toy_profile: Profile, tmp_path: Path) -> None:
    json_path, csv_path = toy_profile.save(tmp_path / "run")
    assert (json_path.name, csv_path.name) == ("profile.json", "probes.csv")
    loaded = load_profile(tmp_path / "run")  # the directory or the file itself
    assert loaded.to_dict() == json.loads(json_path.read_text())
    assert load_profile(json_path).to_dict() == loaded.to_dict()
    assert loaded.fits.memory_model("bf16", "full") == toy_profile.fits.memory_model("bf16", "full")
    assert loaded.fits.time == toy_profile.fits.time
    assert loaded.probes == toy_profile.probes

    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        table = list(reader)
    assert reader.fieldnames == [f.name for f in dataclasses.fields(ProbeRow)]
    assert len(table) == len(toy_profile.probes)
    for line, row in zip(table, toy_profile.probes, strict=True):
        assert (line["probe"], line["name"], line["status"]) == (row.probe, row.name, row.status)
        assert line["reason"] == row.reason
    assert not list(tmp_path.glob("run/*.tmp"))  # written atomically


@slow
def test_unreadable_profiles_are_clear_value_errors(toy_profile: Profile, tmp_path: Path) -> None:
    data = toy_profile.to_dict()
    path = tmp_path / "profile.json"

    path.write_text(json.dumps({**data, "schema_version": 999}))
    with pytest.raises(ValueError, match=r"schema version 999 is not 1: re-run 'advisor profile'"):
        load_profile(path)

    path.write_text(json.dumps({k: v for k, v in data.items() if k != "device"}))
    with pytest.raises(ValueError, match=r"incomplete \(missing 'device'\)"):
        load_profile(path)

    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_profile(path)

    with pytest.raises(ValueError, match="does not exist: run 'advisor profile' first"):
        load_profile(tmp_path / "nowhere")


def test_a_non_positive_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="budget_s must be positive"):
        run_profile(ToyWorkload(), ProfileOptions(seq_len=SEQ_LEN, budget_s=0, comm=False))


# -- a workload that crashes and hangs -----------------------------------------------------------


@slow
def test_crashing_and_hanging_groups_are_recorded_and_the_rest_completes(
    faulty_profile: Profile,
) -> None:
    # Tracing runs no real step: every group still has its memory fit.
    assert {m.precision for m in faulty_profile.fits.memory} == set(PRECISIONS)

    fp32 = rows(faulty_profile, "throughput", "fp32")
    assert {r.status for r in fp32} == {"ok"}
    # Two sizes timed; on a multi-thread CPU the larger once more on half the threads.
    assert len({r.micro_batch_size for r in fp32}) == 2 and len(fp32) in (2, 3)
    assert faulty_profile.fits.time_model("fp32", "none") is not None

    (crashed,) = rows(faulty_profile, "throughput", "bf16")
    assert crashed.status == "error"
    assert crashed.reason == f"RuntimeError: {CRASH_MESSAGE} (bf16)"
    (hung,) = rows(faulty_profile, "throughput", "fp16")
    assert hung.status == "timeout"
    assert hung.reason.startswith("no result after")
    assert {t.precision for t in faulty_profile.fits.time} == {"fp32"}

    # Real memory checks of the broken groups fail the same way, or were skipped for the budget.
    for precision, failed in (("bf16", "error"), ("fp16", "timeout")):
        for row in rows(faulty_profile, "memory_check", precision):
            assert row.status in (failed, "skipped"), row
    assert within_budget(faulty_profile)
    json.dumps(faulty_profile.to_dict())  # failures serialise like successes


def test_a_group_cut_short_by_the_budget_is_a_skipped_fit_and_a_broken_one_an_error() -> None:
    from types import SimpleNamespace

    from profilers.profiler import _fit_groups
    from profilers.workload import StepSpec

    def record(precision: str, b: int) -> SimpleNamespace:
        spec = StepSpec(precision=precision, micro_batch_size=b, seq_len=8)
        return SimpleNamespace(spec=spec, ok=precision != "fp16")

    def fit(records: list[SimpleNamespace]) -> list[str]:
        if len({r.spec.micro_batch_size for r in records}) < 2 or not all(r.ok for r in records):
            raise ValueError("cannot fit this")
        return [records[0].spec.precision]

    rows: list = []
    records = [record("fp32", 1), record("fp32", 4), record("bf16", 1)]
    records += [record("fp16", 1), record("fp16", 4)]
    assert _fit_groups(fit, records, rows, "memory") == ["fp32"]
    by_name = {r.name: r for r in rows}
    assert by_name["bf16/none"].status == "skipped"
    assert "only micro-batch size 1 was measured" in by_name["bf16/none"].reason
    assert by_name["fp16/none"].status == "error"
    assert by_name["fp16/none"].reason == "ValueError: cannot fit this"


def test_the_half_thread_timing_takes_the_largest_size_whose_steps_fit() -> None:
    from profilers.profiler import _split_target

    # three more steps at up to twice the time each: 6x a step must fit in what is left
    assert _split_target([0.1, 0.4], left_s=3.0) == 1
    assert _split_target([0.1, 0.4], left_s=2.0) == 0  # the larger does not fit: the smaller
    assert _split_target([0.1, 0.4], left_s=0.5) is None
    assert _split_target([], left_s=10.0) is None


def test_timing_child_also_times_the_larger_size_on_half_the_cpu_threads() -> None:
    import torch

    from profilers.profiler import _timing_child
    from profilers.throughput import StepTiming, fit_step_time
    from profilers.workload import StepSpec

    workload = ToyWorkload(d=16, layers=1, heads=2, max_len=16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        data = _timing_child(workload, StepSpec(seq_len=8, micro_batch_size=1), 4, "cpu", 30.0)
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(before)
    timings = [StepTiming.from_dict(d) for d in data]
    assert [t.threads for t in timings] == [2, 2, 1]
    assert timings[2].spec == timings[1].spec  # the larger size again
    model = fit_step_time(timings)
    assert (model.threads, model.split_threads) == (2, 1)
    assert model.split_ratio is not None and model.split_ratio > 0


# -- the pieces: probe rows, memory-check evidence, timed sizes ----------------------------------


def test_rows_about_a_step_carry_its_knobs_and_its_label() -> None:
    from profilers import probe_rows
    from profilers.workload import StepSpec

    spec = StepSpec(seq_len=8, precision="bf16", micro_batch_size=4, grad_accum_steps=2)
    row = probe_rows.skipped("memory", spec, "time budget spent")
    assert (row.probe, row.name, row.status, row.reason) == (
        "memory",
        "bf16/none/b=4x2",
        "skipped",
        "time budget spent",
    )
    assert (row.precision, row.micro_batch_size, row.grad_accum_steps) == ("bf16", 4, 2)
    # Without a step or a name, a row is named after its probe and carries no knobs.
    plain = probe_rows.skipped("communication", None, "disabled")
    assert (plain.name, plain.precision, plain.micro_batch_size) == ("communication", None, None)
    assert probe_rows.skipped("input", spec, "x", name="loader").name == "loader"


def test_failed_raised_and_measured_rows() -> None:
    from profilers import probe_rows
    from profilers.isolate import Outcome
    from profilers.workload import StepSpec

    spec = StepSpec(seq_len=8)
    hung = Outcome(status="timeout", reason="no result after 8 s", wall_s=9.5)
    row = probe_rows.failed("throughput", spec, hung)
    assert (row.status, row.reason, row.wall_s, row.name) == (
        "timeout",
        "no result after 8 s",
        9.5,
        "fp32/none/b=1",
    )
    error = probe_rows.raised("flops", None, RuntimeError("bad\n   shape"), wall_s=0.5)
    assert (error.status, error.reason, error.wall_s) == ("error", "RuntimeError: bad shape", 0.5)
    ok = probe_rows.measured("memory", spec, value=123, unit="bytes", wall_s=0.1)
    assert (ok.status, ok.value, ok.unit, ok.reason) == ("ok", 123, "bytes", "")


def test_memory_check_evidence_becomes_the_overhead_the_traces_miss() -> None:
    from profilers.phases_memory import _Evidence
    from profilers.workload import StepSpec

    def cpu(peak: int) -> dict:
        record = CpuStepMemory(
            spec=StepSpec(seq_len=8),
            peak_bytes=peak,
            forward_backward_peak_bytes=peak,
            optimizer_step_peak_bytes=peak // 2,
            step_seconds=0.1,
        )
        return record.to_dict()

    evidence = _Evidence()
    extra = {"ddp": 10, "fsdp": 30}
    assert evidence.add(cpu(1000), 1500, extra, predicted=900) == 1000
    assert evidence.add(cpu(2000), 2100, {"ddp": 99, "fsdp": 99}, predicted=2000) == 2000
    overhead = evidence.overhead(on_gpu=False)
    # The resident memory beyond the allocator's peak (read before the rank's extras load).
    assert overhead.fixed_bytes == 1500 - 1000
    assert overhead.parallel_bytes == extra  # measured once, in the first check
    assert overhead.trace_error_fraction == pytest.approx(0.1)  # the worst check
    assert overhead.method.startswith("CPU")
    assert [m.peak_bytes for m in evidence.measured] == [1000, 2000]


def test_the_larger_timed_size_halves_until_the_memory_model_says_it_fits() -> None:
    from types import SimpleNamespace

    from profilers.phases_time import CPU_MAX_TIMED_MICRO_BATCH, timed_sizes
    from profilers.probe_run import ProbeRun

    run = ProbeRun(ToyWorkload(), ProfileOptions(seq_len=SEQ_LEN, memory_budget=0.5), None)
    per_sequence = SimpleNamespace(predict=lambda b: 100 * b)  # bytes
    small, largest = timed_sizes(run, per_sequence, capacity=1000, slowdown=1.0)
    assert 100 * largest <= 0.5 * 1000 < 100 * 2 * largest
    assert small <= largest
    assert timed_sizes(run, None, capacity=1000, slowdown=1.0)[1] == CPU_MAX_TIMED_MICRO_BATCH
    slow = timed_sizes(run, None, capacity=1000, slowdown=20.0)  # e.g. fp16 on this CPU
    assert slow[1] < CPU_MAX_TIMED_MICRO_BATCH
    asked = ProbeRun(
        ToyWorkload(), ProfileOptions(seq_len=SEQ_LEN, time_micro_batch_sizes=(3, 5)), None
    )
    assert timed_sizes(asked, per_sequence, capacity=1, slowdown=20.0) == (3, 5)


def test_one_device_still_traces_fsdp_ranks_for_the_what_if(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import profilers.comm
    from profilers.profiler import _traced_layouts

    options = ProfileOptions(seq_len=16)
    monkeypatch.setattr(profilers.comm, "available_world_sizes", lambda target: ())
    assert _traced_layouts(options, "cuda") == ((2,), ("fsdp",))
    monkeypatch.setattr(profilers.comm, "available_world_sizes", lambda target: (2, 4))
    assert _traced_layouts(options, "cuda") == ((2, 4), ("fsdp", "ddp"))
    # Explicit world sizes are taken as they are, none included.
    explicit = dataclasses.replace(options, comm_world_sizes=())
    assert _traced_layouts(explicit, "cuda") == ((), ("fsdp", "ddp"))


@slow
def test_a_model_whose_training_state_exceeds_the_device_profiles_for_a_what_if(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its state alone beyond the device (here: a toy model on a 64 KiB "host"): nothing is
    timed, and the phases that measure this device (collectives, loader, compile, real-step
    checks) give their time to the traces from the start, 16-bit first (the what-if's plans
    are 16-bit)."""
    import profilers.profiler as profiler

    real = profiler.device_phase

    def tiny_device(run: object) -> object:
        info = real(run)  # type: ignore[arg-type]
        return dataclasses.replace(info, total_memory_bytes=64 * 1024, free_memory_bytes=64 * 1024)

    monkeypatch.setattr(profiler, "device_phase", tiny_device)
    options = ProfileOptions(seq_len=SEQ_LEN, budget_s=12.0, checkpointing=("none", "full"))
    profile = run_profile(ToyWorkload(), options)
    assert not profile.throughput and not profile.communication and not profile.input
    traced = [t.spec.precision for t in profile.memory if t.spec.parallelism == "single"]
    assert traced and traced[0] == "bf16", traced
    (row,) = rows(profile, "communication")  # (the toy workload has no loader to measure)
    assert row.status == "skipped" and row.reason == profiler.NOTHING_TO_MEASURE_HERE
    assert not [r for r in rows(profile, "memory_check") if r.status == "ok"]
    assert not [r for r in rows(profile, "compile") if r.status == "ok"]
    state = rows(profile, "throughput")
    assert state and all("alone need" in r.reason and "--target" in r.reason for r in state)
    assert within_budget(profile)
