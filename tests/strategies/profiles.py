"""Hand-made profiles: a Profile built from a few round numbers, so each cost-model formula can
be checked by hand. Nothing here runs a probe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from profilers.comm_records import CommFit
from profilers.device import CpuInfo, DeviceInfo, GpuInfo, PrecisionCheck
from profilers.fit import AffineFit
from profilers.flops import FlopCount
from profilers.memory_model import MemoryModel
from profilers.profile_record import Fits, InputSample, MemoryOverhead, Profile
from profilers.throughput import TimeModel
from profilers.workload import ModelFacts
from strategies.prediction import Prediction
from strategies.search import Evaluation, SearchResult
from strategies.space import Candidate
from strategies.uncertainty import Uncertainty

MB = 10**6
GiB = 2**30
SEQ_LEN = 64
NUM_PARAMS = 1_000_000
PARAM_BYTES = 4 * NUM_PARAMS  # fp32 master weights
GRAD_BYTES = 4 * NUM_PARAMS
ADAM_BYTES = 8 * NUM_PARAMS
# Activation bytes per sequence at the forward/backward peak.
ACTIVATIONS = {
    ("fp32", "none"): 10 * MB,
    ("fp32", "full"): 2.5 * MB,
    ("bf16", "none"): 6 * MB,
    ("bf16", "full"): 1.5 * MB,
}
# One micro-batch's forward+backward: t0 + k*b seconds.
FB_TIME = {
    ("fp32", "none"): (0.01, 0.02),
    ("fp32", "full"): (0.0125, 0.027),
    ("bf16", "none"): (0.005, 0.01),
    ("bf16", "full"): (0.00625, 0.0135),
}
OPTIMIZER_S = 0.005


def line(intercept: float, slope: float, xs: Sequence[float] = (1.0, 4.0)) -> AffineFit:
    return AffineFit(
        intercept=intercept,
        slope=slope,
        xs=tuple(xs),
        ys=tuple(intercept + slope * x for x in xs),
    )


def memory_model(precision: str, checkpointing: str, target: str = "cpu") -> MemoryModel:
    activations = ACTIVATIONS[(precision, checkpointing)]
    state = PARAM_BYTES + ADAM_BYTES
    return MemoryModel(
        precision=precision,
        activation_checkpointing=checkpointing,
        seq_len=SEQ_LEN,
        target_device_type=target,
        forward_backward=line(state, activations),
        forward_backward_accumulating=line(state + GRAD_BYTES, activations),
        optimizer_step=line(state + GRAD_BYTES + 4 * NUM_PARAMS, 1000.0),
        accumulation_source="gradient_bytes",
        parameter_bytes=PARAM_BYTES,
        gradient_bytes=GRAD_BYTES,
        optimizer_state_bytes=ADAM_BYTES,
        resident_bytes=state,
    )


def time_model(
    precision: str,
    checkpointing: str,
    *,
    parallelism: str = "single",
    world_size: int = 1,
    scale: float = 1.0,
    split: tuple[int, int, float] | None = None,
) -> TimeModel:
    t0, k = FB_TIME[(precision, checkpointing)]
    threads, split_threads, ratio = split or (0, 0, None)
    return TimeModel(
        precision=precision,
        activation_checkpointing=checkpointing,
        seq_len=SEQ_LEN,
        parallelism=parallelism,
        world_size=world_size,
        device="cpu",
        forward_backward=line(t0 * scale, k * scale, xs=(2.0, 8.0)),
        optimizer_s=OPTIMIZER_S,
        threads=threads,
        split_threads=split_threads,
        split_ratio=ratio,
    )


def comm_fit(
    collective: str, world_size: int, *, gbps: float = 1.0, alpha_s: float = 1e-4
) -> CommFit:
    return CommFit(
        backend="gloo",
        device_type="cpu",
        collective=collective,
        world_size=world_size,
        alpha_s=alpha_s,
        beta_s_per_byte=1.0 / (gbps * 1e9),
        min_bytes=1024,
        max_bytes=64 * 2**20,
        min_time_s=alpha_s,
        num_points=6,
        max_relative_residual=0.0,
    )


def facts(num_layers: int = 4) -> ModelFacts:
    return ModelFacts(
        name="gpt-tiny",
        family="gpt",
        objective="causal_lm",
        num_params=NUM_PARAMS,
        num_trainable_params=NUM_PARAMS,
        num_embedding_params=200_000,
        num_layers=num_layers,
        hidden_size=128,
        num_heads=4,
        vocab_size=256,
        max_seq_len=512,
        block_class="Block",
        tied_embeddings=True,
    )


def device(
    kind: str = "cpu", memory_bytes: int = 16 * GiB, precisions: Sequence[str] = ("fp32", "bf16")
) -> DeviceInfo:
    checks = {
        p: PrecisionCheck(precision=p, reason=None if p in precisions else f"{p} is not run here")
        for p in ("fp32", "bf16", "fp16")
    }
    return DeviceInfo(
        kind=kind,
        name="test CPU" if kind == "cpu" else "NVIDIA H100 80GB HBM3",
        index=None if kind == "cpu" else 0,
        total_memory_bytes=memory_bytes,
        free_memory_bytes=memory_bytes,
        torch_version="2.13.0",
        cpu=CpuInfo(
            model_name="test CPU",
            num_logical_cores=2,
            num_usable_cores=2,
            torch_num_threads=2,
            torch_cpu_capability="AVX2",
        ),
        gpu=GpuInfo(compute_capability="9.0", num_sms=132, num_visible_gpus=8)
        if kind == "cuda"
        else None,
        precisions=checks,
    )


def flop_count() -> FlopCount:
    per_token = 6.0 * NUM_PARAMS
    return FlopCount(
        seq_len=SEQ_LEN,
        micro_batch_size=1,
        tokens=SEQ_LEN,
        flops_per_token={"none": per_token, "full": per_token * 4 / 3},
        flops_by_op={},
        formula_flops_per_token=per_token,
        method="fake",
    )


def hand_profile(
    *,
    kind: str = "cpu",
    memory_bytes: int = 16 * GiB,
    precisions: Sequence[str] = ("fp32", "bf16"),
    checkpointing: Sequence[str] = ("none", "full"),
    timed_checkpointing: Sequence[str] = ("none", "full"),
    comm_world_sizes: Sequence[int] = (2,),
    extra_time: Sequence[TimeModel] = (),
    fixed_bytes: int = 0,
    parallel_bytes: Mapping[str, int] | None = None,
    fragmentation: float = 0.0,
    inputs: Sequence[InputSample] = (),
    with_flops: bool = True,
    model: str = "gpt-tiny",
) -> Profile:
    memory = tuple(memory_model(p, c) for p in precisions for c in checkpointing)
    time = tuple(time_model(p, c) for p in precisions for c in timed_checkpointing)
    comm = tuple(
        comm_fit(collective, w)
        for w in comm_world_sizes
        for collective in ("all_reduce", "all_gather", "reduce_scatter")
    )
    return Profile(
        workload={
            "model": model,
            "model_args": {},
            "data": "synthetic",
            "tokenizer": None,
            "seq_len": SEQ_LEN,
        },
        device=device(kind, memory_bytes, precisions),
        model=facts(),
        flops=flop_count() if with_flops else None,
        memory_overhead=MemoryOverhead(
            fixed_bytes=fixed_bytes,
            fragmentation_fraction=fragmentation,
            parallel_bytes=dict(parallel_bytes or {}),
        ),
        input=tuple(inputs),
        fits=Fits(memory=memory, time=time + tuple(extra_time), communication=comm),
    )


def priced(
    parallelism: str, micro: int, tokens_per_s: float, *, uncertainty: Uncertainty | None = None
) -> Evaluation:
    """A hand-priced candidate at global batch 8 (world size 2 unless single)."""
    world = 1 if parallelism == "single" else 2
    candidate = Candidate(
        precision="bf16",
        activation_checkpointing="none",
        parallelism=parallelism,
        world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=8 // (micro * world),
    )
    prediction = Prediction(
        peak_memory_bytes=1, budgeted_bytes=1, budget_bytes=2, step_time_s=1.0,
        tokens_per_s=tokens_per_s, uncertainty=uncertainty,
    )  # fmt: skip
    return Evaluation(candidate=candidate, prediction=prediction)


def searched(*evaluations: Evaluation) -> SearchResult:
    """An enumerated search that priced exactly ``evaluations``."""
    return SearchResult(
        mode="enumerate", space_size=len(evaluations), trial_budget=len(evaluations),
        evaluations=evaluations, study_name="s", storage="sqlite:///x.db", trials_before=0,
        trials_told=len(evaluations), wall_s=0.0,
    )  # fmt: skip
