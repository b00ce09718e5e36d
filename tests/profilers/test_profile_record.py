"""profile.json's reader: a field of the wrong JSON type is refused when the profile is read,
naming the field (``memory[0].peak_bytes``), not a traceback or a nonsense plan later."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from advisor.cli import main
from profilers.comm_records import CommRun, CommSample
from profilers.compile_records import CompileMeasurement
from profilers.device import GpuInfo, PeerLink
from profilers.hardware import match_device
from profilers.memory_records import CpuStepMemory, CudaStepMemory, MemoryBreakdown, MemoryTrace
from profilers.profile_record import InputSample, ProbeRow, Profile, load_profile
from profilers.throughput import StepTiming
from profilers.workload import StepSpec
from tests.strategies.profiles import SEQ_LEN, hand_profile, line

REPO = Path(__file__).resolve().parents[2]


def full_profile() -> Profile:
    """A hand profile with a row of every kind profile.json holds (both kinds of measured
    memory, a GPU with a peer and a datasheet, windows of a memory fit)."""
    profile = hand_profile(
        kind="cuda",
        parallel_bytes={"ddp": 1000},
        inputs=(
            InputSample(num_workers=0, micro_batch_size=4, seq_len=SEQ_LEN, batches_per_s=50.0),
        ),
    )
    spec = StepSpec(seq_len=SEQ_LEN, micro_batch_size=2)
    breakdown = MemoryBreakdown(parameters=4_000_000, activations=1_000_000)
    trace = MemoryTrace(
        spec=spec,
        target_device_type="cuda",
        peak_bytes=20_000_000,
        forward_backward_peak_bytes=20_000_000,
        optimizer_step_peak_bytes=18_000_000,
        forward_backward_breakdown=breakdown,
        optimizer_step_breakdown=breakdown,
        parameter_bytes=4_000_000,
        gradient_bytes=4_000_000,
        optimizer_state_bytes=8_000_000,
        resident_bytes=12_000_000,
        trace_seconds=0.5,
        scaled_from_blocks=(1, 2),
        reshard_windows=((1, 2),),
        window_peaks=(("forward", 10),),
    )
    cuda = CudaStepMemory(
        spec=spec,
        device_name="NVIDIA H100 80GB HBM3",
        total_bytes=80 * 2**30,
        peak_allocated_bytes=21_000_000,
        peak_reserved_bytes=22_000_000,
        forward_backward_peak_allocated_bytes=21_000_000,
        optimizer_step_peak_allocated_bytes=19_000_000,
        context_bytes=500_000_000,
        workspace_bytes=8_000_000,
    )
    cpu = CpuStepMemory(
        spec=spec,
        peak_bytes=20_000_000,
        forward_backward_peak_bytes=20_000_000,
        optimizer_step_peak_bytes=18_000_000,
        step_seconds=0.25,
    )
    timing = StepTiming(
        spec=spec,
        device="cuda",
        num_warmup=2,
        forward_backward_s=(0.1, 0.11),
        optimizer_s=(0.01, 0.01),
    )
    sample = CommSample(
        backend="nccl",
        device_type="cuda",
        collective="all_reduce",
        world_size=2,
        bytes=1024,
        time_s=(1e-4, 2e-4),
    )
    compiled = CompileMeasurement(
        precision="bf16",
        activation_checkpointing="none",
        status="ok",
        speedup=1.2,
        compile_s=30.0,
        micro_batch_sizes=(2, 8),
        speedup_by_size=(1.3, 1.1),
        extra_bytes_by_size=(1000, 4000),
    )
    gpu = GpuInfo(
        compute_capability="9.0",
        num_sms=132,
        num_visible_gpus=2,
        power_limit_w=700.0,
        peers=(PeerLink(index=1, path="NODE", nvlink=True),),
    )
    fits = profile.fits
    windowed = dataclasses.replace(
        fits.memory[0], windows=(("forward", line(1.0, 2.0)),), reshard_points=((2, ((3, 4),)),)
    )
    assert profile.flops is not None
    return dataclasses.replace(
        profile,
        device=dataclasses.replace(
            profile.device,
            cpu=dataclasses.replace(profile.device.cpu, isa_flags=("avx2", "fma")),
            gpu=gpu,
            datasheet=match_device("NVIDIA H100 80GB HBM3"),
        ),
        flops=dataclasses.replace(profile.flops, scaled_from_blocks=(1, 2)),
        memory=(trace,),
        memory_measured=(cpu, cuda),
        throughput=(timing,),
        communication=(sample,),
        communication_runs=(
            CommRun(backend="nccl", device_type="cuda", world_size=2, status="ok"),
        ),
        compile=(compiled,),
        fits=dataclasses.replace(fits, memory=(windowed, *fits.memory[1:])),
        probes=(ProbeRow(probe="memory", name="fp32/none/b=2", status="ok", value=1.5),),
        budget_s=60.0,
        elapsed_s=12.5,
        precisions=("fp32", "bf16"),
    )


@pytest.fixture
def profile_data() -> dict[str, Any]:
    return full_profile().to_dict()


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def replaced(data: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``data`` with the value at ``where`` (``memory[0].spec.seq_len``)
    replaced."""
    keys: list[Any] = [
        int(index) if index else key for key, index in re.findall(r"(\w+)|\[(\d+)\]", where)
    ]
    copy = json.loads(json.dumps(data))
    holder = copy
    for key in keys[:-1]:
        holder = holder[key]
    holder[keys[-1]] = value
    return copy


def test_a_profile_with_every_kind_of_row_reads_back(
    profile_data: dict[str, Any], tmp_path: Path
) -> None:
    assert load_profile(write(tmp_path, profile_data)) == full_profile()


@pytest.mark.parametrize(
    "path",
    sorted(str(p.relative_to(REPO)) for p in REPO.glob("benchmarks/results/**/profile.json")),
)
def test_every_committed_profile_still_loads(path: str) -> None:
    profile = load_profile(REPO / path)
    assert profile.schema_version == 1
    # In memory too: to_dict keeps tuples and from_dict (an API) reads them back.
    assert Profile.from_dict(profile.to_dict()) == profile


WRONG = [
    # (the field as the message names it, the value written there, what the message says)
    ("memory[0].peak_bytes", "12", "a whole number, got a string"),
    ("memory[0].spec.seq_len", "32", "a whole number, got a string"),
    ("memory[0].window_peaks", [["forward", 10]], "an object, got an array"),
    ("memory[0].window_peaks.forward", 1.5, "a whole number, got 1.5"),
    (
        "memory[0].scaled_from_blocks",
        [1, 2, 3],
        "an array of 2 items or null, got an array of 3 items",
    ),
    ("memory[0]", "trace", "an object, got a string"),
    ("memory_measured[0].step_seconds", "0.25", "a number, got a string"),
    ("memory_measured[1].total_bytes", 1e9, "a whole number, got 1000000000.0"),
    ("memory_overhead.fixed_bytes", "12", "a whole number, got a string"),
    ("memory_overhead.parallel_bytes.ddp", "1", "a whole number, got a string"),
    ("input[0].batches_per_s", None, "a number, got null"),
    ("input[0].seq_len", 32.5, "a whole number, got 32.5"),
    ("throughput[0].forward_backward_s", 0.1, "an array, got a number"),
    ("throughput[0].optimizer_s[0]", True, "a number, got a boolean"),
    ("communication[0].bytes", "1024", "a whole number, got a string"),
    ("communication_runs[0].launch_overhead_s", "0.1", "a number or null, got a string"),
    ("compile[0].micro_batch_sizes[1]", "8", "a whole number, got a string"),
    ("model.num_layers", True, "a whole number, got a boolean"),
    ("model.tied_embeddings", "false", "true or false, got a string"),
    ("model.flops.seq_len", "64", "a whole number, got a string"),
    ("model.flops.flops_per_token.none", None, "a number, got null"),
    ("model.flops", [], "an object or null, got an array"),
    ("device.total_memory_bytes", "17179869184", "a whole number, got a string"),
    ("device.cpu.isa_flags[1]", 3, "a string, got a number"),
    ("device.gpu.peers[0].nvlink", 1, "true or false, got a number"),
    ("device.datasheet.memory_gib", "80", "a number, got a string"),
    ("device.precisions.fp32.tokens", None, "a whole number, got null"),
    ("fits.memory[0].parameter_bytes", "x", "a whole number, got a string"),
    ("fits.memory[0].fsdp_reshard_after_forward", "false", "true or false, got a string"),
    ("fits.memory[0].forward_backward.xs[1]", "4", "a number, got a string"),
    ("fits.memory[0].windows.forward.slope", None, "a number, got null"),
    ("fits.memory[0].reshard_points[0][1][0][1]", "4", "a whole number, got a string"),
    ("fits.time[0].optimizer_s", None, "a number, got null"),
    ("fits.communication[0].alpha_s", False, "a number, got a boolean"),
    ("probes[0].value", "1.5", "a number or null, got a string"),
    ("tool", ["advisor"], "an object, got an array"),
    ("elapsed_s", "1", "a number, got a string"),
    ("budget_s", True, "a number or null, got a boolean"),
    ("precisions", "fp32", "an array or null, got a string"),
    ("workload.seq_len", True, "a whole number, got a boolean"),
]


@pytest.mark.parametrize(("name", "value", "says"), WRONG)
def test_a_field_of_the_wrong_json_type_is_named(
    profile_data: dict[str, Any], tmp_path: Path, name: str, value: Any, says: str
) -> None:
    path = write(tmp_path, replaced(profile_data, name, value))
    with pytest.raises(ValueError) as caught:
        load_profile(path)
    assert str(caught.value) == (
        f"profile {path} is not a profile ({name}: expected {says}): re-run 'advisor profile'"
    )


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("elapsed_s", 3),  # an integer where a float belongs
        ("fits.time[0].optimizer_s", 1),
        ("budget_s", None),  # null where null is allowed
        ("probes[0].micro_batch_size", None),
        ("model.flops", None),
        ("device.gpu", None),
        ("memory[0].scaled_from_blocks", None),
        ("fits.time[0].optimizer_s", math.nan),  # NaN and infinities: as before
        ("memory_measured[0].step_seconds", math.inf),
        ("workload.model_args", {"n_layer": "4"}),  # a free-form object: not checked
        ("tool.python", 3.11),
        ("throughput[0].tokens_per_s", None),  # derived: recomputed, never read
        ("input[0].tokens_per_s", "many"),
        ("newer_section", [1, 2]),  # keys this advisor does not know: a newer one's
        ("memory[0].newer_field", "x"),
        ("device.matmul.fp32", {"name": "matmul_fp32", "size": 64, "work": 5e5}),
    ],
)
def test_what_a_field_allows_still_loads(
    profile_data: dict[str, Any], tmp_path: Path, where: str, value: Any
) -> None:
    load_profile(write(tmp_path, replaced(profile_data, where, value)))


def test_a_cuda_row_is_checked_as_one(profile_data: dict[str, Any], tmp_path: Path) -> None:
    # A CUDA row's own fields are checked only against CudaStepMemory, by its "kind".
    data = replaced(profile_data, "memory_measured[1].context_bytes", "500")
    assert data["memory_measured"][1]["kind"] == "cuda"
    with pytest.raises(ValueError, match=r"\(memory_measured\[1\]\.context_bytes: expected a"):
        load_profile(write(tmp_path, data))


def test_the_schema_version_is_checked_first(profile_data: dict[str, Any], tmp_path: Path) -> None:
    # A newer schema may type its fields differently: its version is what the user must hear.
    data = {**profile_data, "schema_version": 2, "elapsed_s": "1"}
    with pytest.raises(ValueError, match=r"^profile schema version 2 is not 1: re-run"):
        load_profile(write(tmp_path, data))
    with pytest.raises(ValueError, match=r"\(schema_version: expected a whole number, got a bool"):
        load_profile(write(tmp_path, {**profile_data, "schema_version": True}))


def test_profile_from_dict_names_the_field_too(profile_data: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"^memory\[0\]\.peak_bytes: expected a whole number"):
        Profile.from_dict(replaced(profile_data, "memory[0].peak_bytes", "12"))


def test_recommend_refuses_the_profile_in_one_line(tmp_path: Path) -> None:
    data = replaced(hand_profile().to_dict(), "model.num_layers", "4")
    bad = write(tmp_path, data)
    result = CliRunner().invoke(
        main, ["recommend", "--profile", str(bad), "--global-batch-size", "8"]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: profile {bad} is not a profile (model.num_layers: expected a whole number, "
        "got a string): re-run 'advisor profile'\n"
    )
