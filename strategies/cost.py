"""The cost model: predicted peak memory and step time of one candidate, from a profile.

Pure arithmetic over profile records (no device, no torch): milliseconds for a whole search.
Every formula cites where it comes from. One :class:`CostModel` answers for one profiled device
(:func:`cost_model_from_profile`) or, with estimated sources, for hardware the user does not
have (:mod:`strategies.whatif`); the measured time and communication sources it reads are in
:mod:`strategies.sources`. Its parts:

* memory per rank = the profile's fitted peak(precision, checkpointing)(micro-batch, accum)
  (phase maxima, :class:`profilers.memory_model.MemoryModel`), reshaped for the parallelism
  (DDP's gradient buckets, FSDP's shards), plus the measured fixed overhead and fragmentation;
* time per optimizer step = accum × t_fb(micro) + t_opt + exposed communication (+ input);
* tokens/s = global tokens per step / step time.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from profilers.checkpointing import block_fraction, parse_checkpointing
from profilers.checkpointing_fits import blocks_memory_model, blocks_memory_span
from profilers.compile_records import CompileMeasurement, find_compile
from profilers.fit import AffineFit
from profilers.flops import FlopCount
from profilers.memory_model import MemoryModel
from profilers.memory_records import PREDICTED_NOT_TO_FIT, REAL_STEP_ROW, MemoryTrace
from profilers.profile_record import Profile, interrupted_probes
from profilers.throughput import largest_host_share
from profilers.workload import ModelFacts
from strategies.config import DEFAULT_STEPS, TrainConfig
from strategies.errors import Unpredictable
from strategies.prediction import (
    MEASURED_COMMUNICATION,
    Breakdown,
    Communication,
    DdpCommunication,
    FsdpCommunication,
    FsdpMemory,
    GiB,
    Machine,
    MemoryTerms,
    MiB,
    Prediction,
    TimeTerms,
)
from strategies.sources import (
    CommSource,
    ComputeTime,
    MeasuredComm,
    MeasuredTime,
    TimeSource,
    affine_seconds,
)
from strategies.space import Candidate, precision_flag
from strategies.uncertainty import (
    Uncertainty,
    busy_term,
    compile_term,
    delta_term,
    drift_term,
    extrapolation_term,
    fit_terms,
    host_term,
    source_term,
)

__all__ = [
    "CommSource",
    "ComputeTime",
    "CostModel",
    "GiB",
    "Machine",
    "MeasuredComm",
    "MeasuredTime",
    "MiB",
    "Prediction",
    "TimeSource",
    "affine_seconds",
    "cost_model_from_profile",
]

# torch DDP: bucket_cap_mb=25 (the trainer's ParallelOptions.ddp_bucket_cap_mb) and a first
# bucket of 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), filled in reverse
# registration order so the first bucket holds the last layers' gradients (Li et al., "PyTorch
# Distributed", VLDB 2020, §3.2.3).
DDP_BUCKET_CAP_BYTES = 25 * MiB
DDP_FIRST_BUCKET_BYTES = 1 * MiB

# FSDP2 as advisor/trainer/step.py wraps it: MixedPrecisionPolicy(param_dtype=the autocast
# dtype or fp32, reduce_dtype=fp32); every block resharded after forward, the root not.
COMPUTE_BYTES_PER_PARAM: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
REDUCE_BYTES_PER_PARAM = 4
# FsdpCommunication.collectives with the blocks kept gathered (fsdp_reshard_after_forward False).
KEPT_GATHERED_COLLECTIVES = (
    "all_gather (forward only: blocks kept gathered) + reduce_scatter per micro-batch"
)

# FSDP2's own work on a CPU host, beyond its collectives' wire time (which the comm probe's
# alpha-beta fits give): per collective, the copy into the flat buffer and out to the unsharded
# parameters, the unit's hooks and DTensor bookkeeping; per step, the sharded optimizer step and
# gradient clipping over DTensors. The ranks run it on their compute cores, so none overlaps.
# Fitted on the TUNING models only (gpt-tiny, llama-tiny: the 12 fp32 fsdp×2 configs of
# benchmarks/results/regret_grid.csv, each an `advisor train` run): measured minus predicted step
# time = 32.3 ms + 1.48 ms per collective (least squares; 14-56 collectives a step). Their
# |error| after it: median 6%, max 9.5% (was 13-33%, all under-predicted). Held out: the regret
# sessions' bert-tiny, hf-gpt2 and parallel-lm (benchmarks/README.md). A GPU rank issues the same
# work from its CPU while the device computes: not charged there (no GPU run has measured it).
FSDP_CPU_STEP_S = 0.032
FSDP_CPU_COLLECTIVE_S = 0.0015


def fsdp_collectives_per_micro_batch(num_layers: int, reshard_after_forward: bool) -> int:
    """Collectives an FSDP2 rank issues per micro-batch (advisor/trainer/step.py's wrapping:
    every block a unit, the root one more): an all-gather of every unit before forward, of
    every block again before backward when resharded after forward, and a reduce-scatter of
    every unit's gradients."""
    again = num_layers if reshard_after_forward else 0
    return (1 + num_layers + again) + (1 + num_layers)


# Share of a micro-batch's forward+backward spent in backward when no FLOP count says better:
# backward costs twice the forward (one matmul for the input's gradient, one for the weight's;
# PaLM, Chowdhery et al. 2022, App. B; Kaplan et al. 2020, §2.1) -> 2/3; full checkpointing
# recomputes the forward inside backward -> (2 + 1) / (1 + 2 + 1) = 3/4.
DEFAULT_BACKWARD_SHARE: Mapping[str, float] = {"none": 2 / 3, "full": 3 / 4}


# -- formulas ---------------------------------------------------------------------------------


def backward_share(checkpointing: str, flops: FlopCount | None, num_layers: int = 0) -> float:
    """Fraction of forward+backward time spent in backward, where communication can hide.

    From counted FLOPs when the profile has them: the forward is a third of the step without
    recompute (backward = 2 × forward, PaLM App. B), so share = (F_mode − F_none / 3) / F_mode
    (``blocks:K``: F_mode interpolated in K, FlopCount.per_token); otherwise
    :data:`DEFAULT_BACKWARD_SHARE`, and for the selective settings its formula with a fraction
    f of the forward recomputed, (2 + f) / (3 + f): f = K/L for blocks:K, 0 for ops (its
    recompute holds no matmul).
    """
    total = flops.per_token(checkpointing, num_layers) if flops else None
    plain = flops.flops_per_token.get("none") if flops else None
    if total and plain:
        return (total - plain / 3) / total
    if checkpointing in DEFAULT_BACKWARD_SHARE:
        return DEFAULT_BACKWARD_SHARE[checkpointing]
    f = block_fraction(checkpointing, num_layers) or 0.0
    return (2 + f) / (3 + f)


def ddp_buckets(
    gradient_bytes: int,
    cap_bytes: int = DDP_BUCKET_CAP_BYTES,
    first_bytes: int = DDP_FIRST_BUCKET_BYTES,
) -> list[int]:
    """Sizes of DDP's gradient buckets in the order they fill (Li et al. 2020, §3.2.3).

    A bucket closes at the cap, parameters are not split; this ignores parameter boundaries,
    which only moves a few bytes between neighbouring buckets.
    """
    sizes: list[int] = []
    left = gradient_bytes
    if left > 0:
        sizes.append(min(first_bytes, left))
        left -= sizes[-1]
    while left > 0:
        sizes.append(min(cap_bytes, left))
        left -= sizes[-1]
    return sizes


def exposed_bucketed_allreduce_s(
    bucket_bytes: Sequence[int], bucket_times_s: Sequence[float], backward_s: float
) -> float:
    """Communication left over after backward ends, DDP-style.

    Bucket i becomes ready once backward has produced its gradients, at a uniform rate through
    backward: ready_i = backward_s × (bytes of buckets 0..i) / total. All-reduces run one at a
    time, in order (one communication stream): end_i = max(ready_i, end_{i−1}) + t_i. What
    runs past the end of backward is exposed: max(0, end_last − backward_s). The last bucket is
    ready only when backward ends, so at least its all-reduce is always exposed.
    """
    total = sum(bucket_bytes)
    if total <= 0:
        return 0.0
    end, filled = 0.0, 0
    for size, seconds in zip(bucket_bytes, bucket_times_s, strict=True):
        filled += size
        end = max(end, backward_s * filled / total) + seconds
    return max(0.0, end - backward_s)


def overlapped_exposure_s(
    first_s: float, overlappable_s: float, compute_s: float, last_s: float = 0.0
) -> float:
    """Exposed time of a prefetched collective sequence: the first transfer (nothing to hide
    behind yet), the last one (nothing left to compute), and whatever the rest exceed the
    compute they overlap with (Zhao et al., "PyTorch FSDP", VLDB 2023, §3.3)."""
    return first_s + last_s + max(0.0, overlappable_s - compute_s)


def fsdp_units(facts: ModelFacts) -> tuple[int, int]:
    """(root parameters, parameters per block) as the trainer wraps FSDP2.

    Each repeated block is one unit; the root unit holds the rest: the embeddings, the final
    norm and an untied output head. The parameters per block are their mean (every
    transformer block's own count; where blocks differ, ``ModelFacts.largest_block_params``
    is the gathered unit the memory prices).
    """
    head = 0 if facts.tied_embeddings else facts.vocab_size * facts.hidden_size
    body = facts.num_params - facts.num_embedding_params - head
    per_block = max(body // max(facts.num_layers, 1), 0)
    return facts.num_params - per_block * facts.num_layers, per_block


# -- the model ------------------------------------------------------------------------------------


def step_windows(model: MemoryModel) -> dict[str, AffineFit]:
    """The single-device fit's window fits (``MemoryModel.windows``: "F", "A", "B") when they
    agree with its whole peak (the largest window within 1% of it at every traced size), else
    none: windows carried over from a shallow copy unextended (a benchmark's trace-only
    profiles kept a 1-layer copy's: 10 GiB where the model's peak is 84) describe another
    step."""
    windows = dict(getattr(model, "windows", ()) or ())
    if not windows:
        return {}
    whole = model.forward_backward
    for x in whole.xs or (1.0,):
        peak = whole.predict(x)
        if abs(max(w.predict(x) for w in windows.values()) - peak) > 0.01 * max(peak, 1.0):
            return {}
    return windows


def single_growth(single: MemoryModel, b0: int, b: int) -> float:
    """What the single-device fit's forward/backward grows by from micro-batch ``b0`` to
    ``b``: the most any of its windows grows (``MemoryModel.windows``), or its whole peak's
    growth without them; never negative. A bound from above on what a rank of the same step
    grows by (the same activations per sequence; one device keeps a 16-bit step's norm
    inputs in fp32), whichever moment holds the rank's peak: the whole peak's growth alone is
    not, when one device peaks at the end of backward on its gradients (full checkpointing:
    a 70.55B Llama grew 2.5 GiB from micro-batch 4 to 8 there, its window A 32.1 GiB and its
    FSDP rank 21.9 GiB)."""
    fits = [single.forward_backward, *step_windows(single).values()]
    return max(0.0, *(fit.predict(b) - fit.predict(b0) for fit in fits))


def missing_fit_group(precision: str, checkpointing: str) -> str:
    """How an unpredictable candidate's reason names its (precision, checkpointing) group:
    strategies.plan_reasons finds it there to list the groups of one missing measurement."""
    return f"for {precision} with {checkpointing} checkpointing"


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Predicts a :class:`Prediction` for every candidate of one workload on one machine.

    Pure and deterministic: the same inputs give the same prediction in any process (several
    search workers, a resumed study). ``memory_budget`` is the fraction of
    ``machine.memory_bytes`` a rank (GPU) or the job (CPU host) may use.
    """

    machine: Machine
    facts: ModelFacts
    workload: Mapping[str, Any]
    memory_models: tuple[MemoryModel, ...]
    time: TimeSource
    comm: CommSource
    memory_budget: float
    flops: FlopCount | None = None
    input_tokens_per_s: Mapping[int, float] = field(default_factory=dict)
    # Said where no loader speed prices a step (input 0 s): why none was measured.
    input_unmeasured: str = ""
    rounding_allowance_bytes: int = 0
    ddp_bucket_cap_bytes: int = DDP_BUCKET_CAP_BYTES
    assumptions: tuple[str, ...] = ()
    # How busy the host was when profiled (load average, CPUs): said with the interval.
    host_load_1m: float | None = None
    host_cpus: int | None = None
    # Others' largest share of the host's CPU time while the profile timed steps (None when
    # not measured): its step times may read slow (strategies.uncertainty.busy_term).
    host_others_share: float | None = None
    # The run's length: a compiled candidate's compile time is amortised over these steps.
    run_steps: int = DEFAULT_STEPS
    # The profile's torch.compile records: what a compiled step holds beyond the eager trace.
    compiled: tuple[CompileMeasurement, ...] = ()
    # (precision, checkpointing) -> the first error of the group's single-device memory traces,
    # for the groups none of whose traces succeeded (failed_memory_traces): a budget would not
    # bring their fit, so the reason says what failed instead.
    failed_traces: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # The precisions the profile was restricted to (``advisor profile --precision``); None: all.
    profiled_precisions: tuple[str, ...] | None = None
    # How many of the profile's probes a Ctrl-C cut short (profilers.stopping): what it lacks
    # then wants the profile finished, not a larger budget.
    interrupted_probes: int = 0
    # FSDP per-rank traces without accumulation of the groups that have no per-rank fit (one
    # micro-batch size was traced before the budget ran out; unfitted_rank_traces): a rank's
    # memory is anchored on them (one_rank_trace).
    rank_traces: tuple[MemoryTrace, ...] = ()
    # The profile's single-device traces without accumulation: the gradients live at each
    # one's forward/backward peak price a DDP rank without a trace of its own
    # (_ddp_forward_backward).
    single_traces: tuple[MemoryTrace, ...] = ()

    @property
    def seq_len(self) -> int:
        return int(self.workload["seq_len"])

    @property
    def budget_bytes(self) -> int:
        return math.floor(self.memory_budget * self.machine.memory_bytes)

    def memory_model(
        self,
        precision: str,
        checkpointing: str,
        *,
        parallelism: str = "single",
        world_size: int = 1,
        loss_chunks: int = 1,
    ) -> MemoryModel:
        """The fit for (precision, checkpointing), single-device unless asked otherwise (a
        per-rank fit traced for a parallel layout, when the profile has one)."""
        found = self._find_memory_model(
            precision, checkpointing, parallelism, world_size, loss_chunks
        )
        if found is not None:
            return found
        if loss_chunks > 1:
            raise Unpredictable(
                f"the profile has no memory fit {missing_fit_group(precision, checkpointing)} "
                f"and the loss in {loss_chunks} chunks (the profiler traces the "
                "chunked loss at one precision, for the checkpointing settings its budget "
                "covers): use --loss-chunks 1, or re-run 'advisor profile' with a larger "
                "--budget-s"
            )
        failed = self.failed_traces.get((precision, checkpointing))
        if failed is not None and parallelism == "single" and failed.startswith(REAL_STEP_ROW):
            raise Unpredictable(
                f"the profile has no memory fit {missing_fit_group(precision, checkpointing)}: "
                f"{failed} (each in probes.csv); a model no fake trace can run is measured on "
                "real steps, which must run on the profiled device: profile it where it fits "
                "(or with fewer layers), or route its tokens without reading tensor values on "
                "the host (.tolist(), .item(), nonzero)"
            )
        if failed is not None and parallelism == "single":
            raise Unpredictable(
                f"the profile has no memory fit {missing_fit_group(precision, checkpointing)}: "
                f"its memory traces failed with '{failed}' (each in probes.csv), which a "
                "larger --budget-s would not change: the fake-tensor tracer cannot run this "
                "model at this setting; please report the error"
            )
        narrower = (
            # that precision had the whole budget already: fewer settings is what is left
            "--checkpointing naming only the settings you need, to give them the whole budget"
            if self.profiled_precisions == (precision,)
            else f"{precision_flag(precision)} to give that precision the whole budget"
        )
        raise Unpredictable(
            f"the profile has no memory fit {missing_fit_group(precision, checkpointing)}: "
            "re-run 'advisor profile' with a larger --budget-s (its probes.csv says why each "
            f"trace was skipped, and names the budget that covers them where it can), or with "
            f"{narrower}"
        )

    def _find_memory_model(
        self,
        precision: str,
        checkpointing: str,
        parallelism: str,
        world_size: int,
        loss_chunks: int = 1,
        *,
        derive: bool = True,
        reshard: bool = True,
    ) -> MemoryModel | None:
        for model in self.memory_models:
            # Profiles written before parallel layouts were traced have single-device fits only.
            layout = (getattr(model, "parallelism", "single"), getattr(model, "world_size", 1))
            if (
                (model.precision, model.activation_checkpointing) == (precision, checkpointing)
                and (*layout, model.loss_chunks) == (parallelism, world_size, loss_chunks)
                and model.fsdp_reshard_after_forward == reshard
            ):
                return model
        if not derive:
            return None
        # blocks:K without a trace of its own: from the measured settings' windows, else the
        # line in K between them (profilers.checkpointing_fits).
        return blocks_memory_model(
            lambda setting: self._find_memory_model(
                precision,
                setting,
                parallelism,
                world_size,
                loss_chunks,
                derive=False,
                reshard=reshard,
            ),
            checkpointing,
            self.facts.num_layers,
        )

    def check_config(self, config: TrainConfig) -> None:
        """The profile measured one model at one sequence length: refuse any other."""
        for key in ("model", "seq_len"):
            profiled = self.workload.get(key)
            if profiled is not None and getattr(config, key) != profiled:
                raise Unpredictable(
                    f"the profile measured {key}={profiled!r}, not {getattr(config, key)!r}: "
                    f"re-run 'advisor profile --{key.replace('_', '-')} "
                    f"{getattr(config, key)}' first"
                )
        profiled_args = dict(self.workload.get("model_args") or {})
        if dict(config.model_args) != profiled_args:
            raise Unpredictable(
                f"the profile measured model_args {profiled_args}, not "
                f"{dict(config.model_args)}: re-run 'advisor profile' with these --model-arg"
            )

    def predict_config(self, config: TrainConfig) -> Prediction:
        self.check_config(config)
        return self.predict(Candidate.from_config(config))

    def predict(self, candidate: Candidate) -> Prediction:
        """Memory and time of ``candidate``; :class:`Unpredictable` if the profile can't say."""
        assumptions = list(self.assumptions)
        memory = self._memory(candidate, assumptions)
        compute = self.time.compute(candidate)
        time = self._time(candidate, compute, assumptions)
        tokens = candidate.global_batch_size * self.seq_len
        return Prediction(
            peak_memory_bytes=memory.per_rank_bytes,
            budgeted_bytes=memory.budgeted_bytes,
            budget_bytes=self.budget_bytes,
            step_time_s=time.step_s,
            tokens_per_s=tokens / time.step_s,
            estimate=self.machine.estimate,
            breakdown=Breakdown(memory=memory, time=time, assumptions=tuple(assumptions)),
            uncertainty=self._uncertainty(candidate, compute, time),
            compile_s=compute.compile_s,
            run_steps=self.run_steps if compute.compile_s else 0,
        )

    def _uncertainty(self, c: Candidate, compute: ComputeTime, time: TimeTerms) -> Uncertainty:
        """The parts of the step time's error (strategies.uncertainty)."""
        terms = []
        # The micro-batches' share of the step (the optimizer step is timed apart): what the
        # fit's, the delta's and the compile's parts are weighted by.
        timed = time.step_s > 0
        share = time.micro_batches * time.forward_backward_s / time.step_s if timed else 0.0
        weight = min(share, 1.0)
        if compute.fit is not None and timed:
            terms += fit_terms(compute.fit, c.micro_batch_size, weight)
        elif compute.anchors and timed:  # blocks:K: its anchors' farthest distance
            outside = [extrapolation_term(f, c.micro_batch_size, weight) for f in compute.anchors]
            far = max((t for t in outside if t is not None), key=lambda t: t[1], default=None)
            if far is not None:
                terms.append(far)
        shared = self.machine.shared_host and not self.machine.estimate
        terms.append(host_term(shared, self.host_load_1m, self.host_cpus))
        if shared:
            terms.append(drift_term())
        # The step runs on the host's CPUs: others' share of them slowed the profile's timing.
        busy = busy_term(self.host_others_share or 0.0) if shared else None
        if busy is not None:
            terms.append(busy)
        if self.machine.estimate:
            terms.append(source_term("what_if_fp32" if c.precision == "fp32" else "what_if"))
        if compute.derived:
            terms.append(source_term("derived_checkpointing"))
        if compute.delta_se_s > 0 and compute.forward_backward_s > 0 and timed:
            # Relative to the forward+backward it was measured on, weighted like the fit's
            # terms (a rank's slowdown scales the delta with the rest of its micro-batch).
            terms.append(delta_term(weight * compute.delta_se_s / compute.forward_backward_s))
        if c.parallelism != "single" and not compute.parallel_measured:
            kind = f"cpu_{c.parallelism}" if shared else "gpu_collectives"
            terms.append(source_term(kind))
        measured = compute.compiled
        if measured is not None and timed:
            speedup = measured.speedup_at(c.micro_batch_size)
            terms.append(
                compile_term(weight, measured.speedup_log_sd, measured.pairs_per_size, speedup)
            )
            if c.parallelism != "single":
                terms.append(source_term("compile_ranks"))
        return Uncertainty(terms=tuple(terms))

    # -- memory ----------------------------------------------------------------------------
    def _traced_rank_model(self, c: Candidate) -> tuple[MemoryModel | None, int | None]:
        """The per-rank fit of the candidate's very layout, else (FSDP) one traced at another
        world size resharded to the candidate's: (fit, the world size it was traced at when
        resharded). (None, None) on one device or when the profile traced no rank of it."""
        if c.parallelism == "single":
            return None, None
        traced_rank = self._find_memory_model(
            c.precision,
            c.activation_checkpointing,
            c.parallelism,
            c.world_size,
            c.loss_chunks,
            reshard=c.fsdp_reshard_after_forward,
        )
        if traced_rank is None and c.parallelism == "fsdp":
            return self._resharded_fsdp_model(c)
        return traced_rank, None

    def _memory_models(self, c: Candidate) -> tuple[MemoryModel | None, MemoryModel, int | None]:
        """(the per-rank fit of the candidate's layout or None, the fit the model's state and
        phases are read from, the world size a resharded rank fit was traced at). That fit is
        the single-device one of (precision, checkpointing, loss chunks) when the profile has
        it, else the per-rank fit alone (a budget that traced a parallel layout's ranks but not
        that setting on one device); :class:`Unpredictable` (saying what to re-profile) when
        it has neither."""
        traced_rank, resharded_from = self._traced_rank_model(c)
        single = self._find_memory_model(
            c.precision, c.activation_checkpointing, "single", 1, c.loss_chunks
        )
        if single is not None:
            return traced_rank, single, resharded_from
        if traced_rank is not None:
            return traced_rank, traced_rank, resharded_from
        model = self.memory_model(
            c.precision, c.activation_checkpointing, loss_chunks=c.loss_chunks
        )
        return None, model, None

    def _memory(self, c: Candidate, assumptions: list[str]) -> MemoryTerms:
        traced_rank, model, resharded_from = self._memory_models(c)
        b, accum, world = c.micro_batch_size, c.grad_accum_steps, c.world_size
        fb_fit = model.forward_backward if accum == 1 else model.forward_backward_accumulating
        forward_backward = fb_fit.predict(b)
        optimizer = model.optimizer_step.predict(b)
        source: str | None = None
        buckets: int | None = None
        fsdp: FsdpMemory | None = None
        # The whole model's state: a rank fit holds 1/N of it under FSDP (N: the fit's world,
        # the candidate's once resharded).
        shards = model.world_size if model.parallelism == "fsdp" else 1
        derived = self._blocks_memory_note(
            c,
            model if traced_rank is None else traced_rank,
            ("single", 1) if traced_rank is None else (c.parallelism, resharded_from or world),
        )
        if derived:
            assumptions.append(derived)
        if traced_rank is not None:
            # A per-rank trace of this very layout (DDP buckets / FSDP shards, gathered units
            # and communication buffers included) beats the analytic reshaping below.
            traced = float(traced_rank.predict(b, accum))
            above = self._above_traced_sizes(
                traced_rank, None if model is traced_rank else model, c
            )
            if above is not None:
                traced = above
                assumptions.append(
                    f"micro-batch {b} is above the per-rank traces' largest size "
                    f"({int(max(traced_rank.forward_backward.xs))}): the rank's peak there "
                    "plus what the single-device fit grows by from it (an upper bound: a rank's "
                    "line extrapolated read 18% under its own trace, a 70.55B Llama's fp16/full "
                    "fitted at micro-batches 1 and 4 predicting 8)"
                )
            fitted = int(traced)
            source = f"traced {c.parallelism}×{world} per-rank fit"
            if not c.fsdp_reshard_after_forward:
                source += " (blocks kept gathered)"
            if resharded_from is not None:
                kept = "" if c.fsdp_reshard_after_forward else " (blocks kept gathered)"
                source = (
                    f"traced fsdp×{resharded_from} per-rank fit{kept}, its sharded state "
                    f"resharded to {world} ranks"
                )
        elif c.parallelism == "single":
            # MemoryModel.predict: max of the phase fits; the accumulating fit already holds
            # the gradient copy that is live while later micro-batches run.
            traced = float(model.predict(b, accum))
            fitted = int(traced)
        elif c.parallelism == "ddp":
            # gradient_as_bucket_view=True: the buckets ARE the gradients and persist across
            # steps, so a gradient copy is live at the forward peak even right after
            # zero_grad(set_to_none=True), where single-device training has none. With
            # accumulation the fitted peak already holds that copy.
            buckets = model.gradient_bytes if accum == 1 else 0
            fb = (
                self._ddp_forward_backward(model, c, forward_backward, assumptions)
                if buckets
                else None
            )
            traced = max(forward_backward + buckets if fb is None else fb, optimizer)
            fitted = int(max(forward_backward, optimizer))
        else:
            traced, fsdp = self._fsdp_memory(model, c, optimizer)
            fitted = int(max(forward_backward, optimizer))
            assumptions.append(
                "FSDP: the gradients of every micro-batch are reduce-scattered (no no_sync), so "
                "only sharded gradients accumulate"
            )
            anchor = self.one_rank_trace(c, model.target_device_type)
            if anchor is not None:
                traced, fsdp = self._anchored_fsdp_memory(anchor, model, c, optimizer, traced, fsdp)
                assumptions.append(
                    f"FSDP memory from one traced rank (fsdp×{anchor.spec.world_size} at "
                    f"micro-batch {anchor.spec.micro_batch_size}: the profile's budget left no "
                    f"second size for a per-rank fit), its sharded state resharded to {world} "
                    "ranks, its growth per micro-batch the single device's (which keeps a "
                    "16-bit step's norm inputs in fp32: on the high side)"
                )
            elif (windowed := {"A", "B"} <= step_windows(model).keys()) or c.precision in (
                "bf16",
                "fp16",
            ):
                assumptions.append(self._single_device_activations_note(c, windowed))
            if anchor is None:
                traced, fsdp = self._from_traced_sibling(c, model, traced, fsdp, assumptions)
            traced, fsdp = self._within_anchors(c, traced, fsdp, assumptions)
        compile_extra = self._compile_extra_bytes(c, assumptions) if c.compile else None
        traced += self.rounding_allowance_bytes + (compile_extra or 0)
        fragmentation = traced * self.machine.fragmentation_fraction
        rank_extra = self.machine.parallel_overhead_bytes.get(c.parallelism, 0)  # none: single
        per_rank = math.ceil(traced + fragmentation) + self.machine.fixed_overhead_bytes
        per_rank += rank_extra
        ranks_sharing = world if self.machine.shared_host else 1
        if ranks_sharing > 1:
            assumptions.append(
                f"CPU host: the {world} ranks are processes sharing its RAM, so the budget "
                "holds all of them"
            )
        return MemoryTerms(
            fitted_peak_bytes=fitted,
            source=source,
            ddp_gradient_buckets_bytes=buckets,
            fsdp=fsdp,
            phase="forward_backward" if forward_backward >= optimizer else "optimizer_step",
            traced_bytes=int(traced),
            rounding_allowance_bytes=self.rounding_allowance_bytes,
            fragmentation_bytes=int(fragmentation),
            fixed_overhead_bytes=self.machine.fixed_overhead_bytes,
            parallel_overhead_bytes=rank_extra,
            per_rank_bytes=per_rank,
            ranks_sharing_memory=ranks_sharing,
            budgeted_bytes=per_rank * ranks_sharing,
            budget_bytes=self.budget_bytes,
            model_parameter_bytes=model.parameter_bytes * shards,
            model_gradient_bytes=model.gradient_bytes * shards,
            model_optimizer_state_bytes=model.optimizer_state_bytes * shards,
            state_shards=world if c.parallelism == "fsdp" else 1,
            compile_extra_bytes=compile_extra,
        )

    def _ddp_forward_backward(
        self, model: MemoryModel, c: Candidate, forward_backward: float, assumptions: list[str]
    ) -> float | None:
        """A DDP rank's forward/backward peak from the single-device fit ``model`` without a
        trace of its own, no accumulation. Its buckets hold every gradient from the first step
        on (gradient_as_bucket_view) and replace those the single device holds: at the
        single-device peak, the buckets less the gradients live there; in the forward (window
        F) and through the last block's backward (A), all of them on top. None (the caller
        adds the whole buckets to the peak, an upper bound) without the step's windows or the
        gradients live at its traced peaks. Against fake-PG DDP×2 rank traces (gpt-tiny,
        llama-tiny, a 6-layer gpt-tiny; fp32/bf16, none/full, micro-batch 1 and 4: 24 cases)
        this read +0.0% to +1.1% where the whole buckets on top read up to +18.7%."""
        windows = step_windows(model)
        live = self._gradients_at_peak(model, c)
        if not windows or live is None:
            return None
        b, buckets = c.micro_batch_size, model.gradient_bytes
        parts = [forward_backward - live + buckets]
        parts += [windows[w].predict(b) + buckets for w in ("F", "A") if w in windows]
        assumptions.append(
            f"DDP memory from the single-device fit: its gradient buckets "
            f"({buckets / GiB:.2f} GiB) replace the {live / GiB:.2f} GiB of gradients live at "
            "its forward/backward peak, and come on top of its forward and its last block's "
            "backward (gradient_as_bucket_view: they exist from the first step)"
        )
        return max(parts)

    def _gradients_at_peak(self, model: MemoryModel, c: Candidate) -> float | None:
        """The gradient bytes live at the single-device forward/backward peak of ``model``'s
        setting at the candidate's micro-batch: a traced size's, else the fewer of the two
        nearest traced sizes' (where the peak moves, fewer live gradients price the rank
        higher). None when no trace of the setting says."""
        points: dict[int, float] = {}
        for t in self.single_traces:  # single device, no accumulation (single_device_traces)
            spec = t.spec
            if (
                spec.micro_batch_size > 0
                and spec.precision == c.precision
                and spec.activation_checkpointing == c.activation_checkpointing
                and spec.loss_chunks == c.loss_chunks
                and spec.seq_len == self.seq_len
                and t.target_device_type == model.target_device_type
            ):
                points[spec.micro_batch_size] = float(t.forward_backward_breakdown.gradients)
        b = c.micro_batch_size
        if b in points:
            return points[b]
        nearest = sorted(points, key=lambda x: (abs(x - b), x))[:2]
        return min(points[x] for x in nearest) if nearest else None

    def _from_traced_sibling(
        self,
        c: Candidate,
        model: MemoryModel,
        traced: float,
        fsdp: FsdpMemory,
        assumptions: list[str],
    ) -> tuple[float, FsdpMemory]:
        """An FSDP rank with the loss in chunks, or in fp16, that the profile did not trace,
        while it traced the same rank with the plain loss (bf16 for fp16): that rank's price
        plus what one device's peak differs by between the two settings (the logits the chunks
        save are not sharded; fp16 adds its loss scaler), not the formula from one device,
        which reads high beside the traced sibling (a 7B over 64 GPUs, ops at micro-batch 4:
        the 2-chunk rank 70.3 GiB beside the plain loss's traced 65.9). Unchanged otherwise."""
        if c.loss_chunks > 1:
            sibling = dataclasses.replace(c, loss_chunks=1)
            what = f"the loss in {c.loss_chunks} chunks"
        elif c.precision == "fp16":
            sibling = dataclasses.replace(c, precision="bf16")
            what = "fp16"
        else:
            return traced, fsdp
        if self._traced_rank_model(sibling)[0] is None and self.one_rank_trace(sibling) is None:
            return traced, fsdp
        single = self._find_memory_model(
            sibling.precision, sibling.activation_checkpointing, "single", 1, sibling.loss_chunks
        )
        if single is None or model.parallelism != "single":
            return traced, fsdp
        try:
            priced = self._memory(sibling, [])
        except Unpredictable:
            return traced, fsdp
        b, accum = c.micro_batch_size, c.grad_accum_steps
        delta = float(model.predict(b, accum) - single.predict(b, accum))
        rank = priced.traced_bytes - self.rounding_allowance_bytes + delta
        assumptions.append(
            f"FSDP memory of {what}: no rank of it was traced; the traced rank of "
            f"{'the plain loss' if c.loss_chunks > 1 else 'bf16'} "
            f"({(rank - delta) / GiB:.2f} GiB) plus what one device's peak differs by "
            f"({delta / GiB:+.2f} GiB), in place of the formula from one device "
            f"({traced / GiB:.2f} GiB)"
        )
        rest = fsdp.sharded_state_bytes + fsdp.gathered_units_bytes
        rest += fsdp.reduce_scatter_buffer_bytes
        terms = dataclasses.replace(fsdp, activation_bytes=int(max(rank - rest, 0.0)))
        return rank, terms

    def _within_anchors(
        self, c: Candidate, traced: float, fsdp: FsdpMemory, assumptions: list[str]
    ) -> tuple[float, FsdpMemory]:
        """A ``blocks:K`` FSDP rank priced by the formula (``traced``, terms ``fsdp``) held
        between ``full``'s and ``none``'s ranks of the same candidate, as each of them is
        priced: checkpointing more blocks never holds more, and a rank of none or full may be
        priced from its own traces (a per-rank fit, one traced rank) where blocks:K has only
        the formula, which need not agree with them. Where it moves, the activations take up
        the difference, and the assumptions say so. Unchanged for any other setting, or when
        an anchor cannot be priced."""
        spec = parse_checkpointing(c.activation_checkpointing)
        if spec.kind != "blocks":
            return traced, fsdp
        bounds: dict[str, float] = {}
        rank_traced: list[str] = []
        for setting in ("none", "full"):
            anchor = dataclasses.replace(c, activation_checkpointing=setting, compile=False)
            try:
                priced = self._memory(anchor, [])
            except Unpredictable:
                continue
            bounds[setting] = priced.traced_bytes - self.rounding_allowance_bytes
            if self._traced_rank_model(anchor)[0] is not None or (
                self.one_rank_trace(anchor) is not None
            ):
                rank_traced.append(setting)
        low, high = bounds.get("full"), bounds.get("none")
        if low is not None and high is not None and low > high:
            return traced, fsdp  # no order to keep
        bounded, said = traced, None
        if high is not None and traced > high:
            bounded, said = high, "above none's: taken as none's"
        elif low is not None and traced < low:
            bounded, said = low, "below full's: taken as full's"
        if low is not None and high is not None and rank_traced and self.facts.num_layers > 0:
            # An end priced from the profile's own rank traces where blocks:K has only the
            # formula from one device (a 70B Llama, mb 8 over 64 GPUs: full traced 60.7 GiB a
            # rank, blocks:79 by the formula 100.2, though it keeps one block more than full).
            # Identical blocks: each un-checkpointed block adds what none holds beyond full
            # per block, and while any block is checkpointed its recompute holds one block's
            # activations more than the line between the ends counts, (1 - K/L) of a block.
            layers = self.facts.num_layers
            per_block = (high - low) / layers
            k = min(spec.blocks, layers)
            line = high - k * per_block + (1 - k / layers) * per_block
            if line < bounded:
                ends = " and ".join(rank_traced)
                bounded, said = (
                    line,
                    (
                        f"above the line in K between full's and none's ranks ({ends} from the "
                        "profile's rank traces) plus one block's recompute: taken on that line"
                    ),
                )
        if said is None:
            return traced, fsdp
        rest = fsdp.sharded_state_bytes + fsdp.gathered_units_bytes
        rest += fsdp.reduce_scatter_buffer_bytes
        assumptions.append(
            f"FSDP memory of {c.activation_checkpointing}: the formula from one device read "
            f"{traced / GiB:.2f} GiB a rank, {said} ({bounded / GiB:.2f} GiB; none and full "
            "are priced from the profile's own per-rank traces where it has them, and "
            "checkpointing blocks never holds more than none or less than full)"
        )
        terms = dataclasses.replace(fsdp, activation_bytes=int(max(bounded - rest, 0.0)))
        return bounded, terms

    def _blocks_memory_note(
        self, c: Candidate, model: MemoryModel, layout: tuple[str, int]
    ) -> str | None:
        """How a blocks:K that was not traced itself in ``layout`` (parallelism, world size) is
        priced, ``model`` being its fit (profilers.checkpointing_fits); None otherwise."""
        if parse_checkpointing(c.activation_checkpointing).kind != "blocks":
            return None
        traced = self._find_memory_model(
            c.precision,
            c.activation_checkpointing,
            *layout,
            c.loss_chunks,
            derive=False,
            reshard=c.fsdp_reshard_after_forward if layout[0] == "fsdp" else True,
        )
        if traced is not None:
            return None
        what = f"memory of {c.activation_checkpointing} (of {self.facts.num_layers} blocks)"
        if model.forward_backward.pieces:
            return (
                f"{what}: not traced itself; from the windows of the traced {c.precision} none, "
                "middle blocks:K and full (exact where traced against whole traces)"
            )
        return (
            f"{what}: not traced itself; on the line in K between the traced {c.precision} "
            "settings (never below the truth; up to 15-20% above it where measured)"
        )

    def _compile_extra_bytes(self, c: Candidate, assumptions: list[str]) -> int | None:
        """What the compiled forward+backward held beyond the eager one where the compile probe
        measured it (profilers.phases_compile: both steps' allocator peaks in one child, per
        micro-batch size; a line in b, never below zero), added to the eager trace; None where
        it was not measured (fake tensors cannot trace inductor's kernels), said so."""
        measured = find_compile(self.compiled, c.precision, c.activation_checkpointing)
        extra = measured.extra_bytes_at(c.micro_batch_size) if measured is not None else None
        if extra is None:
            assumptions.append(
                "torch.compile: memory as the eager step's trace (fake tensors cannot trace "
                "inductor's kernels and this profile did not measure the compiled step's "
                "peak; its partitioner saves no more activations than eager)"
            )
            return None
        assert measured is not None
        sizes = ", ".join(
            f"{e / 2**20:+.1f} MiB at b={b}"
            for b, e in zip(measured.micro_batch_sizes, measured.extra_bytes_by_size, strict=False)
        )
        assumptions.append(
            "torch.compile: the eager step's trace plus what the compiled forward+backward "
            f"measured beyond the eager one ({sizes}; a saving is not counted on)"
        )
        return extra

    @staticmethod
    def _above_traced_sizes(
        rank: MemoryModel, single: MemoryModel | None, c: Candidate
    ) -> float | None:
        """A rank's forward/backward peak at a micro-batch above its fit's largest traced size
        (no accumulation, a single-device fit at hand): the fit at that size plus the single
        device's growth from it (:func:`single_growth`), which bounds a rank's from above when
        the fit keeps the step's windows (the same activations per sequence, a 16-bit step's
        norm inputs kept in fp32 on one device); without them the larger of that and the
        rank's own line; its optimizer phase as fitted. None within the traced sizes. The
        line through a rank's traced sizes need not hold above them: the unsharded bytes of a
        window can grow faster with the micro-batch once another moment of the step holds its
        peak."""
        b = c.micro_batch_size
        largest = int(max(rank.forward_backward.xs, default=0))
        if single is None or c.grad_accum_steps != 1 or not largest or b <= largest:
            return None
        forward_backward = rank.forward_backward.predict(largest) + single_growth(
            single, largest, b
        )
        if not step_windows(single):
            # Without the step's windows the single device's growth is its whole peak's,
            # no bound where that peak holds every gradient (full checkpointing: an MPT-30B
            # rank traced at micro-batches 1-3 read 76 GiB at 63 by it): the larger of that
            # and the rank's own line.
            forward_backward = max(forward_backward, rank.forward_backward.predict(b))
        return max(forward_backward, rank.optimizer_step.predict(b))

    def _resharded_fsdp_model(self, c: Candidate) -> tuple[MemoryModel | None, int | None]:
        """An FSDP per-rank fit of the candidate's (precision, checkpointing) traced at another
        world size, resharded to the candidate's (:meth:`MemoryModel.resharded`): what a rank
        gathers, its activations and temporaries are traced, not derived from one device.
        The largest traced world size is taken (the least state to reshard upward); at that
        world size ``blocks:K`` may be the line between its traced anchors (none, full), as on
        one device, before it is resharded."""
        worlds = {
            m.world_size
            for m in self.memory_models
            if getattr(m, "parallelism", "single") == "fsdp"
        }
        for world in sorted(worlds, reverse=True):

            def traced(
                setting: str, world: int = world, derive: bool = False
            ) -> MemoryModel | None:
                return self._find_memory_model(
                    c.precision,
                    setting,
                    "fsdp",
                    world,
                    c.loss_chunks,
                    derive=derive,
                    reshard=c.fsdp_reshard_after_forward,
                )

            source = traced(c.activation_checkpointing)
            if source is not None:
                return source.resharded(c.world_size), world
            if c.world_size != world:
                # A blocks:K not traced at this world: the line in K between the traced
                # settings, each resharded window by window first. Derived at the traced
                # world, it had no windows to reshard by and took the bound that keeps that
                # world's sharded gradients: a 46.7B Mixtral's blocks:14 at 64 ranks, micro-
                # batch 1, read 99 GiB against none's 66 GiB and blocks:16's traced 45 GiB.
                derived = blocks_memory_model(
                    lambda s: m.resharded(c.world_size) if (m := traced(s)) else None,
                    c.activation_checkpointing,
                    self.facts.num_layers,
                    windowed=False,
                )
            else:
                derived = traced(c.activation_checkpointing, derive=True)
            if derived is not None:
                return derived, world
        return None, None

    def one_rank_trace(self, c: Candidate, target: str | None = None) -> MemoryTrace | None:
        """The profile's one FSDP per-rank trace of the candidate's setting (precision,
        checkpointing, loss chunks, resharding, no accumulation; traced for ``target``'s
        device type when given), at the largest traced world size, when its group has no
        per-rank fit; None when there is none or the candidate accumulates (the traced step
        holds no gradients of earlier micro-batches)."""
        if c.grad_accum_steps != 1:
            return None
        found = [
            t
            for t in self.rank_traces
            if (target is None or t.target_device_type == target)
            and t.spec.precision == c.precision
            and t.spec.activation_checkpointing == c.activation_checkpointing
            and t.spec.loss_chunks == c.loss_chunks
            and t.spec.fsdp_reshard_after_forward == c.fsdp_reshard_after_forward
            and t.spec.seq_len == self.seq_len
        ]
        return max(found, key=lambda t: t.spec.world_size, default=None)

    def _anchored_fsdp_memory(
        self,
        anchor: MemoryTrace,
        model: MemoryModel,
        c: Candidate,
        optimizer: float,
        formula_bytes: float,
        formula: FsdpMemory,
    ) -> tuple[float, FsdpMemory]:
        """An FSDP rank's forward/backward peak from one traced rank: per window of its step
        the bytes not sharded as traced and the sharded ones (parameter shards, sharded
        gradients, optimizer state) × W/N, the largest window (as MemoryModel.resharded does
        with a fit; without windows, the shards of parameters and optimizer state scaled),
        plus what the single-device fit grows by from the traced micro-batch to the
        candidate's: an upper bound, one device growing faster than a rank in 16 bits (its
        norm inputs stay fp32). Below the traced micro-batch the single device's drop is not
        a bound (Qwen3.5-9B, traced at 8, read 49% under the rank's own fit at 1:
        benchmarks/fsdp_one_rank.py), so there the smaller of the traced size's peak and the
        formula from one device (``formula_bytes``), both bounds. The optimizer phase as in
        :meth:`_fsdp_memory`."""
        keep = anchor.spec.world_size / c.world_size
        if anchor.reshard_windows:
            at_world = max(rest + sharded * keep for rest, sharded in anchor.reshard_windows)
        else:
            state = anchor.parameter_bytes + anchor.optimizer_state_bytes
            at_world = anchor.forward_backward_peak_bytes - state * (1 - keep)
        b0 = anchor.spec.micro_batch_size
        if c.micro_batch_size >= b0:
            fb = at_world + single_growth(model, b0, c.micro_batch_size)
        else:
            fb = min(at_world, formula_bytes)
        opt = optimizer / c.world_size
        rest = formula.sharded_state_bytes + formula.gathered_units_bytes
        rest += formula.reduce_scatter_buffer_bytes
        terms = dataclasses.replace(formula, activation_bytes=int(max(fb - rest, 0.0)))
        return max(fb, opt), terms

    def _autocast_copies_bytes(self, precision: str) -> int:
        """Autocast's copies of the weights the matmuls read, in ``precision``'s compute
        dtype: every weight outside the embeddings, plus a tied head (0 in fp32)."""
        if precision not in ("bf16", "fp16"):
            return 0
        f = self.facts
        cast = f.num_params - f.num_embedding_params
        if f.tied_embeddings:
            cast += f.vocab_size * f.hidden_size
        return max(cast, 0) * COMPUTE_BYTES_PER_PARAM[precision]

    def _single_device_activations_note(self, c: Candidate, windowed: bool = False) -> str:
        """What an FSDP rank's memory derived from the single-device fit over-counts in 16
        bits: autocast's copies of the weights the matmuls read, which a rank with a bf16
        parameter policy gathers one unit at a time instead (``windowed``: the activations
        came from the fit's windows, where the copies were left out)."""
        if windowed:
            return (
                f"FSDP memory from the single-device fit (the profile has no per-rank fit of "
                f"{c.precision}/{c.activation_checkpointing}: its probes.csv says why): its "
                "activations are the larger of the single-device step's peak before the last "
                "block's backward ends and after it less every gradient (which FSDP shards), "
                "less the parameters and optimizer state, autocast's 16-bit weight copies "
                "left out (those the forward cached and the blocks saved for backward); an "
                "upper bound (a single device keeps a 16-bit step's norm inputs in fp32); a "
                "profile with a larger --budget-s traces the rank itself"
            )
        size = self._autocast_copies_bytes(c.precision)
        amount = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"
        return (
            f"FSDP memory from the single-device fit (the profile has no per-rank fit of "
            f"{c.precision}/{c.activation_checkpointing}: its probes.csv says why): its "
            f"activations hold autocast's 16-bit copies of the weights (~{amount}), which an "
            "FSDP rank with a bf16 parameter policy does not keep, so this peak is on the high "
            "side; a profile with a larger --budget-s traces the rank itself"
        )

    def _fsdp_memory(
        self, model: MemoryModel, c: Candidate, optimizer: float
    ) -> tuple[float, FsdpMemory]:
        """Per-rank peak under FSDP2 (ZeRO-3-like sharding; Rajbhandari et al., "ZeRO", SC 2020,
        §5: parameters, gradients and optimizer state each divided by N), and its terms.

        forward/backward peak = (params + grads + optimizer state) / N
            + gathered units: the root (never resharded) + two blocks (the running one and the
              prefetched next one; the largest, where blocks differ in size: Jamba's MoE
              layers), in the compute dtype; every block when they are kept gathered
              (``fsdp_reshard_after_forward`` False: none is freed after forward)
            + one (the largest) block's unsharded fp32 gradients awaiting their reduce-scatter
            + activations as on one device: the single-device peak minus its persistent state;
              where the fit keeps the step's windows (:func:`step_windows`), the largest of
              window A's (until the last block's backward ends: every block's activations
              live, no gradient but the root's and the last block's) less the 16-bit weight
              copies the blocks not checkpointed saved for backward, window B's (the rest of
              backward) less every gradient, and window F's (the forward) less every weight
              copy, each less the parameters and optimizer state. Window B's peak
              is at one of its ends: at its end every gradient is live, which a rank holds
              1/N of (the whole peak counted them all: DeepSeek-V3 with full checkpointing
              read 2.5 TB of fp32 gradients as activations, 2,962 GiB a rank at 1,024 ranks);
              at its start, the moment that ends window A, which A's peak covers. In 16 bits
              window F holds autocast's copy of every weight (a rank with a bf16 parameter
              policy gathers one unit at a time), dropped when the forward ends.
        optimizer-step peak = the single-device optimizer-phase peak / N: everything live then
            (parameters, gradients, state, foreach temporaries) is per-parameter, so sharded.
        """
        world = c.world_size
        state = model.parameter_bytes + model.gradient_bytes + model.optimizer_state_bytes
        root, block = fsdp_units(self.facts)
        compute_bytes = COMPUTE_BYTES_PER_PARAM[c.precision]
        largest = max(self.facts.largest_block_params, block)
        if c.fsdp_reshard_after_forward:
            gathered = (root + 2 * largest) * compute_bytes
        else:
            gathered = (root + max(self.facts.num_layers, 2) * block) * compute_bytes
        grad_buffer = largest * REDUCE_BYTES_PER_PARAM
        activations = self.single_device_activations(model, c)
        fb = state / world + gathered + grad_buffer + activations
        opt = optimizer / world
        terms = FsdpMemory(
            sharded_state_bytes=int(state / world),
            gathered_units_bytes=int(gathered),
            reduce_scatter_buffer_bytes=int(grad_buffer),
            activation_bytes=int(activations),
            optimizer_phase_bytes=int(opt),
            root_params=root,
            params_per_block=block,
        )
        return max(fb, opt), terms

    def single_device_activations(self, model: MemoryModel, c: Candidate) -> float:
        """What a rank holds beyond its state, from the single-device fit (:meth:`_fsdp_memory`
        says how: the fit's windows when it keeps them, else its whole peak)."""
        b = c.micro_batch_size
        persistent = model.parameter_bytes + model.optimizer_state_bytes
        windows = step_windows(model)
        if not windows:
            between = self._blocks_activations_line(c)
            if between is not None:
                return between
        if not {"A", "B"} <= windows.keys():
            return max(model.forward_backward.predict(b) - persistent, 0.0)
        parts = [
            windows["A"].predict(b) - persistent,
            windows["B"].predict(b) - persistent - model.gradient_bytes,
        ]
        copies = self._autocast_copies_bytes(c.precision)
        if copies:
            # Window A holds the copies that the blocks not checkpointed saved for their
            # matmuls' backward (every block's without checkpointing: a 70.55B Llama's 139
            # GiB, which read its FSDP rank at 8 ranks, micro-batch 1, 103% over the rank's
            # own fit); a checkpointed block casts its weights again when it recomputes, and
            # the per-op policies recompute the casts, which are not among what they save.
            recomputed = block_fraction(c.activation_checkpointing, self.facts.num_layers)
            parts[0] -= copies * (1.0 - (1.0 if recomputed is None else recomputed))
        if "F" in windows:
            parts.append(windows["F"].predict(b) - persistent - copies)
        return max(*parts, 0.0)

    def _blocks_activations_line(self, c: Candidate) -> float | None:
        """A ``blocks:K`` rank's activations when its single-device fit is derived from the
        measured settings around K (profilers.checkpointing_fits: the line in K, or the
        envelope of the windows' model, neither of which keeps windows): the line in K
        between those settings' own activations, each from its windows as
        :meth:`single_device_activations` reads a measured setting. None when K was measured
        itself or has no anchors on both sides. The derived fit's whole peak less the
        parameters and optimizer state counted every gradient and autocast's copy of every
        weight that the anchors' windows leave out, so K between them read above both: a
        Llama-3-8B shape at sequence 8192 without per-rank traces, 8 H100s, micro-batch 1,
        bf16 blocks:1 116.1 GiB against none's 102.3 (fp32, with a floor read at micro-batch
        4: 1,631.8 against 441.6)."""
        span = blocks_memory_span(
            lambda setting: self._find_memory_model(
                c.precision, setting, "single", 1, c.loss_chunks, derive=False
            ),
            c.activation_checkpointing,
            self.facts.num_layers,
        )
        if span is None or span[0].activation_checkpointing == c.activation_checkpointing:
            return None
        low, high, w = span
        at_low, at_high = (
            self.single_device_activations(
                m, dataclasses.replace(c, activation_checkpointing=m.activation_checkpointing)
            )
            for m in (low, high)
        )
        return at_low + w * (at_high - at_low)

    # -- time --------------------------------------------------------------------------------
    def _time(self, c: Candidate, compute: ComputeTime, assumptions: list[str]) -> TimeTerms:
        world, accum = c.world_size, c.grad_accum_steps
        shared = self.machine.shared_host and world > 1 and not compute.parallel_measured
        sharing = world if shared else 1
        scale = float(sharing)
        if shared and compute.rank_slowdown is not None:
            # The launcher gives each rank cores // ranks threads; the profile timed a step on
            # that many. Threads do not scale perfectly (fp16 kernels on a CPU hardly at all),
            # so this beats "× world", which assumes they do.
            scale = compute.rank_slowdown
            where = (
                f" (for {compute.rank_slowdown_from}: this group's was not timed)"
                if compute.rank_slowdown_from
                else ""
            )
            assumptions.append(
                f"CPU host: each of the {world} ranks runs on its 1/{world} share of the "
                f"threads; its compute is the single-process time × {scale:.2f}, measured at "
                f"that thread count{where}"
            )
        elif shared:
            assumptions.append(
                f"CPU host: no {c.parallelism}×{world} time was measured, so each rank's compute "
                f"is the single-process time × {world} (the ranks share the host's cores)"
            )
        fb = compute.forward_backward_s * scale
        optimizer = compute.optimizer_s * scale
        if c.parallelism == "fsdp" and not compute.parallel_measured:
            optimizer /= world  # each rank steps its 1/N shard (ZeRO §5)
        communication, exposed = 0.0, 0.0
        detail: Communication = None
        if c.parallelism != "single" and not compute.parallel_measured:
            communication, exposed, terms = self._communication(c, fb)
            if self.machine.shared_host:
                # CPU ranks: gloo's copies, reductions and loopback TCP run on the cores the
                # ranks compute on (one thread per rank, every core busy), so a collective
                # cannot hide behind compute as it does on a GPU's separate stream. Measured
                # here (benchmarks/results/regret.md, gpt-tiny fp32 b=4): FSDP×2 steps took
                # 0.09 s longer than DDP×2, more than FSDP's whole 0.045 s of collectives.
                exposed = communication
                terms = dataclasses.replace(
                    terms, overlap="none: CPU ranks communicate on their compute cores"
                )
                assumptions.append(
                    "CPU host: collectives run on the cores the ranks compute on, so none of "
                    "their time overlaps compute"
                )
                if isinstance(terms, FsdpCommunication):
                    count = accum * fsdp_collectives_per_micro_batch(
                        self.facts.num_layers, c.fsdp_reshard_after_forward
                    )
                    overhead = FSDP_CPU_STEP_S + count * FSDP_CPU_COLLECTIVE_S
                    exposed += overhead
                    terms = dataclasses.replace(terms, cpu_overhead_s=overhead)
                    assumptions.append(
                        f"CPU host: FSDP2's own work (buffer copies, hooks, DTensor "
                        f"bookkeeping) adds {overhead * 1e3:.0f} ms a step: "
                        f"{FSDP_CPU_STEP_S * 1e3:.0f} ms + {FSDP_CPU_COLLECTIVE_S * 1e3:.1f} ms "
                        f"× {count} collectives, fitted on the tuning models' fsdp×2 runs"
                    )
            detail = terms
        elif compute.parallel_measured:
            detail = MEASURED_COMMUNICATION
        compute_s = accum * fb + optimizer + exposed
        input_s, step = self._input(c, compute_s, sharing, assumptions)
        return TimeTerms(
            forward_backward_s=fb,
            micro_batches=accum,
            optimizer_s=optimizer,
            communication_s=communication,
            exposed_communication_s=exposed,
            communication=detail,
            input_s=input_s,
            compute_source=compute.source,
            step_s=step,
            forward_backward_parts={k: v * scale for k, v in compute.parts},
        )

    def _communication(
        self, c: Candidate, fb_s: float
    ) -> tuple[float, float, DdpCommunication | FsdpCommunication]:
        """(total collective seconds per step, exposed seconds per step, their terms)."""
        world, accum = c.world_size, c.grad_accum_steps
        share = backward_share(c.activation_checkpointing, self.flops, self.facts.num_layers)
        backward_s = share * fb_s
        if c.parallelism == "ddp":
            # One all-reduce of the gradients per optimizer step: no_sync() on every micro-
            # batch but the last; it overlaps that micro-batch's backward. (A DDP rank holds
            # the whole model's gradients, as one device does.)
            gradient_bytes = self._memory_models(c)[1].gradient_bytes
            sizes = ddp_buckets(gradient_bytes, self.ddp_bucket_cap_bytes)
            times = [self.comm.collective_s("all_reduce", world, s) for s in sizes]
            exposed = exposed_bucketed_allreduce_s(sizes, times, backward_s)
            ddp = DdpCommunication(
                buckets=len(sizes),
                bytes=sum(sizes),
                backward_s=backward_s,
                source=self.comm.describe("all_reduce", world),
            )
            return sum(times), exposed, ddp
        root, block = fsdp_units(self.facts)
        layers = self.facts.num_layers
        cb = COMPUTE_BYTES_PER_PARAM[c.precision]
        # Per micro-batch: all-gather every unit for forward, every block again for backward
        # (resharded after forward; the root is not; none kept gathered:
        # fsdp_reshard_after_forward False), reduce-scatter every unit's gradients.
        again = layers if c.fsdp_reshard_after_forward else 0
        ag_root = self.comm.collective_s("all_gather", world, root * cb)
        ag_block = self.comm.collective_s("all_gather", world, block * cb)
        rs_root = self.comm.collective_s("reduce_scatter", world, root * REDUCE_BYTES_PER_PARAM)
        rs_block = self.comm.collective_s("reduce_scatter", world, block * REDUCE_BYTES_PER_PARAM)
        forward_s = fb_s - backward_s
        exposed_fwd = overlapped_exposure_s(ag_root, layers * ag_block, forward_s)
        if again:
            exposed_bwd = overlapped_exposure_s(
                ag_block, (layers - 1) * ag_block + layers * rs_block, backward_s, last_s=rs_root
            )
        else:  # nothing to gather before the first block's backward
            exposed_bwd = overlapped_exposure_s(0.0, layers * rs_block, backward_s, last_s=rs_root)
        per_micro = ag_root + (layers + again) * ag_block + rs_root + layers * rs_block
        fsdp = FsdpCommunication(
            all_gather_bytes=(root + (layers + again) * block) * cb,
            reduce_scatter_bytes=(root + layers * block) * REDUCE_BYTES_PER_PARAM,
            exposed_forward_s=exposed_fwd,
            exposed_backward_s=exposed_bwd,
            source=self.comm.describe("all_gather", world),
        )
        if not again:
            fsdp = dataclasses.replace(fsdp, collectives=KEPT_GATHERED_COLLECTIVES)
        return accum * per_micro, accum * (exposed_fwd + exposed_bwd), fsdp

    def _input(
        self, c: Candidate, compute_s: float, share: int, assumptions: list[str]
    ) -> tuple[float, float]:
        """(loading seconds per step, step seconds). Loading in the training process adds to
        the step; worker processes on a GPU host overlap it (the step waits only for the
        excess); on a CPU host loading uses the same cores, so it adds either way."""
        rate = self.input_tokens_per_s.get(c.num_workers)
        if not rate:
            if self.input_tokens_per_s:
                assumptions.append(f"input speed with {c.num_workers} workers not measured: 0 s")
            elif self.input_unmeasured:
                assumptions.append(self.input_unmeasured)
            return 0.0, compute_s
        tokens = c.micro_batch_size * c.grad_accum_steps * self.seq_len
        input_s = tokens / rate * share
        if c.num_workers == 0 or self.machine.shared_host:
            return input_s, compute_s + input_s
        return input_s, max(compute_s, input_s)


# -- from a profile ----------------------------------------------------------------------------


def input_rates(profile: Profile) -> dict[int, float]:
    """Tokens/s the data loader delivered per worker count (mean over its ok samples)."""
    rates: dict[int, list[float]] = {}
    for sample in profile.input:
        if sample.status == "ok" and sample.batches_per_s > 0:
            rates.setdefault(sample.num_workers, []).append(sample.tokens_per_s)
    return {w: statistics.fmean(v) for w, v in rates.items()}


# profilers.probe_rows.TIME_SPENT, the reason of a probe the budget left out (the strategies
# package reads records, not probe code: tests/test_layout.py)
BUDGET_SPENT = "time budget spent"


def input_unmeasured(profile: Profile) -> str:
    """Why the profile holds no data-loader speed ("" when it holds one): each step is then
    priced with no loading time, which the prediction says."""
    if input_rates(profile):
        return ""
    reasons = sorted({row.reason for row in profile.probes if row.probe == "input" and row.reason})
    why = f" ({'; '.join(reasons)})" if reasons else ""
    said = f"data loading not measured{why}: priced at 0 s a step"
    # only a budget that ran out is fixed by a longer one (not "no data loader", a failure)
    if not reasons or any(r.startswith(BUDGET_SPENT) for r in reasons):
        said += "; a longer 'advisor profile' (--budget-s) times the loader"
    return said


# The start of the assumption a prediction carries when the profile has no measured process
# overhead (overhead_unmeasured); plan reasons and the console's note look for it.
OVERHEAD_UNMEASURED = "the process's memory beyond its tensors was not measured"


def overhead_unmeasured(profile: Profile) -> str:
    """Why every peak of ``profile`` counts its tensors only ("" when it does not): the
    profile's real-step memory checks ran and none succeeded (a timeout on a busy host, a
    budget spent), so its fixed overhead reads 0 though a training process carries one
    (on CPU the interpreter, torch and what building a step loads: ~430 MiB with torch 2.13
    on the 2-vCPU dev host; on a GPU the CUDA context and library workspaces). A profile
    without memory_check rows (hand-made, or older) says nothing."""
    if profile.memory_overhead.fixed_bytes:
        return ""
    checks = [row for row in profile.probes if row.probe == "memory_check"]
    if not checks or any(row.status == "ok" for row in checks):
        return ""
    reasons = sorted(
        {f"{row.status}: {row.reason}" if row.reason else row.status for row in checks}
    )
    what = (
        "the interpreter, torch and what building a step loads: a few hundred MiB"
        if profile.device.kind == "cpu"
        else "the CUDA context and library workspaces"
    )
    # A check left out because its step was predicted not to fit is not measured by a longer
    # or quieter profile: nothing of this model runs here.
    unfit = all(row.reason == PREDICTED_NOT_TO_FIT for row in checks)
    fix = (
        "no real step of this model fits here to measure it"
        if unfit
        else "re-run 'advisor profile' on a quiet host or with a larger --budget-s to measure it"
    )
    return (
        f"{OVERHEAD_UNMEASURED} (the profile's real-step memory checks: {'; '.join(reasons)}): "
        f"each peak counts the step's tensors only, without {what}; {fix}"
    )


def machine_from_profile(profile: Profile) -> Machine:
    """The profiled device. A CPU job is budgeted against the RAM that was available when
    profiled (not the total: other processes hold the rest); a GPU against its memory."""
    device = profile.device
    cpu = device.kind == "cpu"
    # The reverse of how the profiler sizes its probes (profilers/profiler.py run_profile): a
    # probe runs isolated, so an oom there is recorded and profiling goes on. The plan is for
    # the training run, where an OOM is fatal: on a CPU host the RAM other processes held when
    # profiled stays theirs, so only what was available counts; a GPU is taken to be the job's
    # own when it trains, its context and workspaces being the measured fixed overhead that
    # every prediction adds.
    return Machine(
        kind=device.kind,
        name=device.name,
        memory_bytes=device.free_memory_bytes if cpu else device.total_memory_bytes,
        fixed_overhead_bytes=profile.memory_overhead.fixed_bytes,
        parallel_overhead_bytes=dict(profile.memory_overhead.parallel_bytes),
        fragmentation_fraction=profile.memory_overhead.fragmentation_fraction,
        shared_host=cpu,
    )


def failed_memory_traces(profile: Profile) -> dict[tuple[str, str], str]:
    """(precision, checkpointing) -> the first error of the single-device memory traces of
    each group that has an error row (or a real step that did not run) and no successful
    trace."""
    failed: dict[tuple[str, str], str] = {}
    traced: set[tuple[str, str]] = set()
    for row in profile.probes:
        if row.probe != "memory" or not row.precision or not row.activation_checkpointing:
            continue
        group = (row.precision, row.activation_checkpointing)
        if row.status == "ok":
            traced.add(group)
        elif row.status == "error" or row.reason.startswith(REAL_STEP_ROW):
            # A real step that could not run (oom, a step too large for the device, an error)
            # is not given a fit by a larger budget either.
            first = row.reason.splitlines()[0].rstrip(". ") if row.reason else ""
            failed.setdefault(group, first or "an error")
    return {g: why for g, why in failed.items() if g not in traced}


def cost_model_from_profile(
    profile: Profile, memory_budget: float, *, run_steps: int = DEFAULT_STEPS
) -> CostModel:
    """The measured cost model of ``profile``'s device, for a run of ``run_steps`` steps."""
    target = profile.device.kind
    models = tuple(m for m in profile.fits.memory if m.target_device_type == target) or tuple(
        profile.fits.memory
    )
    return CostModel(
        machine=machine_from_profile(profile),
        facts=profile.model,
        workload=profile.workload,
        memory_models=models,
        time=MeasuredTime.from_profile(profile),
        comm=MeasuredComm(fits=profile.fits.communication),
        memory_budget=memory_budget,
        flops=profile.flops,
        input_tokens_per_s=input_rates(profile),
        input_unmeasured=input_unmeasured(profile),
        assumptions=tuple(a for a in (overhead_unmeasured(profile),) if a),
        host_load_1m=profile.device.host_load_1m,
        host_cpus=profile.device.cpu.num_usable_cores,
        host_others_share=largest_host_share(profile.throughput),
        run_steps=run_steps,
        compiled=tuple(profile.compile),
        failed_traces=failed_memory_traces(profile),
        profiled_precisions=profile.precisions,
        interrupted_probes=interrupted_probes(profile.probes),
        rank_traces=unfitted_rank_traces(profile),
        single_traces=single_device_traces(profile),
    )


def single_device_traces(profile: Profile) -> tuple[MemoryTrace, ...]:
    """The profile's single-device memory traces without accumulation (CostModel.single_traces)."""
    return tuple(
        t
        for t in profile.memory
        if t.spec.parallelism == "single" and t.spec.grad_accum_steps == 1 and t.method == "trace"
    )


def unfitted_rank_traces(profile: Profile) -> tuple[MemoryTrace, ...]:
    """The profile's FSDP per-rank traces (no accumulation) of the groups without a per-rank
    fit: one micro-batch size was traced, a fit needs two."""
    fitted = {
        (
            m.precision,
            m.activation_checkpointing,
            m.world_size,
            m.loss_chunks,
            m.fsdp_reshard_after_forward,
        )
        for m in profile.fits.memory
        if m.parallelism == "fsdp"
    }
    return tuple(
        t
        for t in profile.memory
        if t.spec.parallelism == "fsdp"
        and t.spec.grad_accum_steps == 1
        and (
            t.spec.precision,
            t.spec.activation_checkpointing,
            t.spec.world_size,
            t.spec.loss_chunks,
            t.spec.fsdp_reshard_after_forward,
        )
        not in fitted
    )
