"""The chunked loss (``loss_chunks``), after the core: its memory traced, its time measured.

Runs after :mod:`profilers.phases_core` and its refinements (a new knob comes after the
search's core in priority) and only for models whose logits are worth chunking
(:func:`chosen_loss_chunks`). It measures one precision (:func:`chunked_precision`: the one
whose plain step the core timed fastest without checkpointing; when none was timed, bf16 before
fp16 before fp32 among those traced), in
this order while its part of the budget lasts:

1. memory without checkpointing (:func:`first_setting`: with full checkpointing when the core
   fitted full and not none, as a what-if profile of a model too large for this device may):
   the step traced with the knob on at the core's two traced sizes (the same fake-tensor
   traces as every group), so its fit holds what the chunks keep and what the head's
   recompute and the summed weight gradient add;
2. time: a measured *delta*. The recompute of the head's forward is real cost, but on a shared
   CPU host a step's time drifts up to 35% between children (DESIGN.md): two groups timed in
   different children would compare the host's moods. So one child times the plain and the
   chunked step round-robin at the same sizes, and the chunked group's time model is the core's
   plain fit plus that same-child difference, affine in the micro-batch size. The delta is a
   cost of the head alone, so the cost model adds it to every checkpointing setting's time;
3. memory with each other checkpointing setting the core and its refinements traced for that
   precision (full first, then the selective ones in their order), within a part of the budget
   left after the timing (:data:`EXTRA_SHARE_OF_REMAINING`). A peak is not a sum: under
   full checkpointing the backward's recompute of a block can hold the peak the chunks no
   longer do, so a setting's chunked memory is traced, never the plain one minus a saving.
   A setting left out by the budget says so in a row; its chunked candidates are unpredictable.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from profilers import probe_rows
from profilers.budget import covering_budget_s
from profilers.memory_records import MemoryTrace, fitted_groups
from profilers.phases_time import plain_steps, time_side_by_side
from profilers.probe_run import CHILD_START_S, MIN_CHILD_SHARE_S, ProbeRun
from profilers.throughput import StepTiming, TimeModel, delta_time_model
from profilers.workload import ModelFacts, StepSpec

# Bytes per token the loss holds at its peak without chunks: the fp32 log-softmax kept for
# backward and, in backward, the gradients of the log-probabilities and of the logits
# (3 fp32 vocab-sized rows; measured on gpt-tiny with a 32000 vocabulary: 3.0 T·V·4 at b=8).
LOSS_BYTES_PER_TOKEN_PER_VOCAB = 12
# Bytes per token one block keeps for backward, per unit of width, fp32 (a GPT block saves
# ~16 width-sized tensors per token: norms' outputs, q/k/v, attention output, projection input,
# the MLP's 4x-wide input and activation); the chunk count that makes one chunk of the loss
# about one block's activations is the loss's bytes over these.
BLOCK_BYTES_PER_TOKEN_PER_WIDTH = 64
# The part of the budget left after the core and its refinements that the phase may use (the
# phases after it weigh 0.39 of profilers.budget.SHARES; this is about 0.04 of the whole).
SHARE_OF_REMAINING = 0.1
# Fewest tokens per chunk worth measuring: each chunk reads the head's whole weight (V·C) for
# its forward, its recompute and both gradient matmuls, so small chunks turn the head into
# memory traffic. gpt-tiny with V=32000, micro-batch 8 x 128 tokens, forward+backward against
# the plain loss, interleaved on this host: 4 chunks (256 tokens each) +11%, 8 (128) +35%,
# 32 (32) +126%; the traced peak 339 / 290 / 253 MB against 600 MB plain.
MIN_CHUNK_TOKENS = 256
# The part of the budget left after the timing that the other checkpointing settings' chunked
# traces may use (each pair started only when it ends within it). Each one makes the chunked
# loss predictable beside one more checkpointing setting, the memory-bound end of the search
# (full) first; the phases after keep at least 0.85 of what was left. Under the default 120 s
# budget on a 2-vCPU host nothing is left for them (hf-gpt2 with a 32,000 vocabulary: the
# timing ends ~45 s before the budget); at 300 s the full pair (~10-15 s) is traced.
EXTRA_SHARE_OF_REMAINING = 0.15
# Rounds of the interleaved timing (each: a plain and a chunked step at both sizes).
MAX_ROUNDS = 3
# Planning only: a chunked step's time over the plain one's, before it is measured (the
# head's forward runs twice; gpt-tiny with a 32000 vocabulary spends most of a step there).
CHUNKED_STEP_FACTOR = 1.5


def chosen_loss_chunks(facts: ModelFacts, tokens: int) -> int:
    """The chunk count the profile measures, for micro-batches of ``tokens`` tokens (the largest
    traced): the power of two that makes one chunk of the loss's fp32 logits about one block's
    activations (12·V vs 64·C bytes per token), but no more than leaves each chunk
    :data:`MIN_CHUNK_TOKENS`; 1 (not measured) when that is 1, or the model has no output head.

    gpt-tiny (C=256) at 8 x 128 tokens: its byte vocabulary (V=256): 1; V=32000: 32 by memory,
    4 by the chunk size. GPT-2 124M (V=50257, C=768) at 8 x 1024 tokens: 16.
    """
    if not facts.output_head or not facts.hidden_size:
        return 1
    ratio = (LOSS_BYTES_PER_TOKEN_PER_VOCAB * facts.vocab_size) / (
        BLOCK_BYTES_PER_TOKEN_PER_WIDTH * facts.hidden_size
    )
    by_memory = 1 if ratio <= 1 else 2 ** math.ceil(math.log2(ratio))
    by_size = 2 ** int(math.log2(max(1, tokens // MIN_CHUNK_TOKENS)))
    return min(by_memory, by_size)


@dataclass
class ChunkedResult:
    traces: list[MemoryTrace] = field(default_factory=list)
    timings: list[StepTiming] = field(default_factory=list)
    time_models: list[TimeModel] = field(default_factory=list)


def chunked_precision(
    core_models: Sequence[TimeModel], micro_batch_size: int, traced: Sequence[str] = ()
) -> str:
    """The precision the chunked loss is measured at: the one whose plain single-device step
    without checkpointing the core timed fastest at ``micro_batch_size`` (bf16 on a GPU, fp32
    on most CPUs), the one the search most likely keeps. When none was timed (a model that
    fits no device here: its profile serves a what-if), the first of the ``traced`` precisions
    in the what-if's order (bf16, fp16, fp32: profilers.phases_distributed), fp32 without any.
    Until 2026-12-05 that was always fp32: a 46.7B Mixtral profiled with ``--precision bf16``
    traced its chunked loss in fp32 only, a precision it was asked not to plan."""
    from profilers.phases_distributed import WHAT_IF_PRECISION_ORDER

    timed = {
        m.precision: m.forward_backward.predict(micro_batch_size)
        for m in core_models
        if (m.activation_checkpointing, m.parallelism, m.loss_chunks) == ("none", "single", 1)
    }
    if timed:
        return min(timed, key=lambda p: timed[p])
    return next((p for p in WHAT_IF_PRECISION_ORDER if p in traced), "fp32")


def checkpointed_settings(traced: Sequence[MemoryTrace], precision: str) -> list[str]:
    """The checkpointing settings other than ``none`` that ``traced`` (the core's and the
    refinements' single-device traces) fitted for ``precision`` (two sizes), full first, then
    the others in the order they were traced."""
    fitted = [c for p, c in fitted_groups(traced) if p == precision and c != "none"]
    return sorted(fitted, key=lambda setting: setting != "full")


def first_setting(traced: Sequence[MemoryTrace], precision: str) -> str:
    """The checkpointing setting the chunked loss is traced with first: none, unless ``traced``
    fitted another setting for ``precision`` and not none; then the first of
    :func:`checkpointed_settings` (full). A what-if profile traces full before none
    (profilers.phases_core.ordered_groups) and on a slow host may trace full alone: until
    2026-12-06 its chunked loss was traced without checkpointing, a fit beside none's that
    no plan of it could use."""
    fitted = [c for p, c in fitted_groups(traced) if p == precision]
    if "none" in fitted or not fitted:
        return "none"
    return checkpointed_settings(traced, precision)[0]


def chunked_loss_phase(
    run: ProbeRun,
    facts: ModelFacts,
    target: str,
    core_timings: Sequence[StepTiming],
    core_models: Sequence[TimeModel],
    traced: Sequence[MemoryTrace] = (),
    trace_seconds: Callable[[str], float] | None = None,
) -> ChunkedResult:
    """Trace and time ``loss_chunks`` = :func:`chosen_loss_chunks` within its part of the budget.

    Both traces of a setting are needed for a memory fit. The first setting's pair starts only
    when the budget has room for both (each the core's time per trace of that setting), and
    the second runs past the phase's share while the whole budget still has room for it; the
    timing runs when the budget has room for its least plan (one warm-up and one
    timed round of the four steps, their time estimated from the core's plain steps). The other
    checkpointing settings of ``traced`` follow within :data:`EXTRA_SHARE_OF_REMAINING` of what
    is left then, each pair started when ``trace_seconds`` (the core's seconds per trace of
    that setting) says it ends in time.
    Whatever is left out gets a row that says so.
    """
    out = ChunkedResult()
    sizes = run.options.trace_micro_batch_sizes[-2:]
    largest = sizes[-1]
    chunks = chosen_loss_chunks(facts, largest * run.options.seq_len)
    if chunks == 1:
        why = facts.loss_chunking_unavailable() or (
            f"the logits (vocabulary {facts.vocab_size}) are no larger than one block's "
            f"activations (width {facts.hidden_size}), or a micro-batch of {largest} x "
            f"{run.options.seq_len} tokens makes chunks of fewer than {MIN_CHUNK_TOKENS}: "
            "nothing measured"
        )
        run.rows.append(probe_rows.skipped("memory", None, why, name="loss_chunks"))
        return out
    # Not a share of its own in profilers.budget.SHARES: a model that gains nothing (gpt-tiny's
    # byte vocabulary) leaves every other phase exactly the time it had; one that gains takes
    # its part from the phases after it (memory checks, communication, input).
    deadline = time.perf_counter() + run.clock.remaining() * SHARE_OF_REMAINING
    timed_size = max(
        (t.spec.micro_batch_size for t in core_timings if t.spec.loss_chunks == 1), default=1
    )
    precision = chunked_precision(
        core_models, timed_size, traced=sorted({t.spec.precision for t in traced})
    )
    first = first_setting(traced, precision)
    cut = _Cut()  # traces not started or stopped at the profile's fake-trace deadline
    last_s = 0.0
    for i, b in enumerate(sizes):
        spec = dataclasses.replace(run.spec(precision, first, b), loss_chunks=chunks)
        plain_s = trace_seconds(first) if trace_seconds is not None else 0.0
        expected_s = max(last_s, plain_s)
        if i > 0 and time.perf_counter() > deadline and run.clock.remaining() < expected_s:
            suggested = _covering_budget_s(run, len(sizes) * expected_s, SHARE_OF_REMAINING)
            why = f"time budget spent; --budget-s {suggested} would cover it"
            run.rows.append(probe_rows.skipped("memory", spec, why))
            continue
        # The first size only with time for them all: one size fits nothing (Qwen3.5-9B's
        # what-if profile started its first chunked trace 13 s before the end: 19 s spent,
        # the budget overrun, no fit).
        together = len(sizes) if i == 0 else 1
        if cut.too_late(run, spec, expected_s, traces=together):
            if together > 1:
                for later in sizes[1:]:
                    spec = dataclasses.replace(spec, micro_batch_size=later)
                    cut.too_late(run, spec, expected_s, traces=together)
                break
            continue
        if together > 1 and run.clock.remaining() < together * expected_s:
            # ... and within the budget, not only before the fake traces' deadline past it:
            # until 2026-12-06 the second size waited on twice the first one's time left, so
            # a first trace could start with too little left for the second (Qwen3.5-9B at
            # --budget-s 240: 29 s on one chunked trace, no fit).
            suggested = _covering_budget_s(run, together * expected_s, SHARE_OF_REMAINING)
            why = f"time budget spent; --budget-s {suggested} would cover it"
            run.rows += [
                probe_rows.skipped("memory", dataclasses.replace(spec, micro_batch_size=n), why)
                for n in sizes
            ]
            break
        run.clock.say(f"memory: tracing {probe_rows.label(spec)} ({chunks} loss chunks)")
        t0 = time.perf_counter()
        trace = cut.trace(run, spec, target, expected_s)
        last_s = time.perf_counter() - t0
        if trace is not None:
            out.traces.append(trace)
    _time_delta(run, out, precision, chunks, deadline, core_timings, core_models)
    deadline = max(deadline, time.perf_counter() + run.clock.remaining() * EXTRA_SHARE_OF_REMAINING)
    left_out: list[tuple[range, float]] = []  # (its rows, seconds) of each pair left out
    for setting in checkpointed_settings(traced, precision):
        if setting == first:
            continue
        pair_s = 2 * (trace_seconds(setting) if trace_seconds is not None else last_s)
        specs = [
            dataclasses.replace(run.spec(precision, setting, b), loss_chunks=chunks) for b in sizes
        ]
        if time.perf_counter() + pair_s > deadline or run.clock.remaining() < pair_s:
            why = (
                f"time budget spent (the chunked loss's part of it; ~{pair_s:.0f} s for both "
                "sizes), else its chunked candidates are unpredictable"
            )
            left_out.append((range(len(run.rows), len(run.rows) + len(specs)), pair_s))
            run.rows += [probe_rows.skipped("memory", spec, why) for spec in specs]
            continue
        for spec in specs:
            if cut.too_late(run, spec, pair_s / 2):
                continue
            run.clock.say(f"memory: tracing {probe_rows.label(spec)} ({chunks} loss chunks)")
            trace = cut.trace(run, spec, target, pair_s / 2)
            if trace is not None:
                out.traces.append(trace)
    if left_out:
        # Every pair left out names the budget whose part covers them all.
        need = sum(seconds for _, seconds in left_out)
        suggested = _covering_budget_s(run, need, EXTRA_SHARE_OF_REMAINING)
        probe_rows.name_covering_budget(
            run.rows,
            (i for rows, _ in left_out for i in rows),
            suggested,
            f"{len(left_out)} chunked-loss pairs",
        )
    cut.name_covering_budget(run)
    return out


@dataclass
class _Cut:
    """The chunked traces the profile's fake-trace deadline cut (not started: it would have
    stopped them; or stopped), and what each takes, so that their rows name the budget that
    covers them all (until 2026-12-05 they said only "a larger --budget-s gives it more")."""

    rows: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    stopped: bool = False  # one was stopped: its time is only a lower bound

    def too_late(
        self, run: ProbeRun, spec: StepSpec, expected_s: float, *, traces: int = 1
    ) -> bool:
        from profilers.phases_core import too_late_to_trace

        index = len(run.rows)
        if not too_late_to_trace(run, spec, expected_s, traces=traces):
            return False
        self.rows.append(index)
        self.seconds.append(expected_s)
        return True

    def trace(
        self, run: ProbeRun, spec: StepSpec, target: str, expected_s: float
    ) -> MemoryTrace | None:
        from profilers.fake_kernels import BACKWARD_OVER_FORWARD
        from profilers.phases_core import _trace

        index, t0 = len(run.rows), time.perf_counter()
        trace = _trace(run, spec, target)
        if trace is None and len(run.rows) > index:
            row = run.rows[-1]
            if row.status == "skipped" and (row.reason or "").startswith(probe_rows.TIME_SPENT):
                wall_s = time.perf_counter() - t0
                self.rows.append(len(run.rows) - 1)
                # at least what it ran and that part's backward (as the core counts one)
                self.seconds.append(max(expected_s, (1 + BACKWARD_OVER_FORWARD) * wall_s))
                self.stopped = True
        return trace

    def name_covering_budget(self, run: ProbeRun) -> None:
        if not self.rows:
            return
        # The smaller of the phase's two parts of the later phases' share: covers either.
        part = min(SHARE_OF_REMAINING, EXTRA_SHARE_OF_REMAINING)
        probe_rows.name_covering_budget(
            run.rows,
            self.rows,
            _covering_budget_s(run, sum(self.seconds), part),
            f"{len(self.rows)} chunked-loss traces",
            at_least=self.stopped,
        )


# The chunked loss has no share of its own: it takes a part (SHARE_OF_REMAINING, then
# EXTRA_SHARE_OF_REMAINING) of what is left for the phases after it.
_LATER_PHASES = ("compile", "communication", "memory_check", "memory_distributed", "input")


def _covering_budget_s(run: ProbeRun, need_s: float, part: float) -> int:
    """The --budget-s whose later phases' shares, of which the chunked loss takes ``part``,
    cover ``need_s`` more seconds."""
    return covering_budget_s(run.options.budget_s, _LATER_PHASES, need_s / part, run.clock.dropped)


def _time_delta(
    run: ProbeRun,
    out: ChunkedResult,
    precision: str,
    chunks: int,
    deadline: float,
    core_timings: Sequence[StepTiming],
    core_models: Sequence[TimeModel],
) -> None:
    """Time the chunked step against the plain one in one child (round-robin, at the core's
    two timed sizes of ``precision`` without checkpointing); add its timings and time model to
    ``out``, or a row that says why not."""
    found = plain_steps(core_models, core_timings, precision)
    plain, steps = found if found is not None else (None, {})
    name = f"{precision}/none/lc{chunks}"
    if plain is None or len(steps) < 2:
        run.rows.append(
            probe_rows.skipped(
                "throughput",
                None,
                f"{precision} without checkpointing was not timed at two sizes: the chunked "
                "loss's time delta has no base",
                name=name,
            )
        )
        return
    small, large = min(steps), max(steps)
    # The least plan: the four steps built, warmed up and timed once each (the build's first
    # step costs about another one); the chunked step is taken as up to CHUNKED_STEP_FACTOR
    # times the plain one.
    least = max(
        MIN_CHILD_SHARE_S,
        CHILD_START_S + 3 * (1 + CHUNKED_STEP_FACTOR) * (steps[small] + steps[large]),
    )
    left = max(deadline - time.perf_counter(), least)
    if run.clock.remaining() < least:
        run.rows.append(
            probe_rows.skipped(
                "throughput",
                None,
                f"time budget spent (timing it needs ~{least:.0f} s more)",
                name=name,
            )
        )
        return
    specs = [
        dataclasses.replace(run.spec(precision, "none", b), loss_chunks=n)
        for b in (small, large)
        for n in (1, chunks)
    ]
    run.clock.say(f"throughput: timing {chunks} loss chunks against the plain loss")
    timings = time_side_by_side(
        run, specs, left, MAX_ROUNDS, "interleaved with the plain loss (loss_chunks delta)"
    )
    if timings is None:
        return
    out.timings = list(timings)  # the plain steps too: the delta re-derivable from the file
    out.time_models.append(chunked_time_model(plain, timings))


def chunked_time_model(plain: TimeModel, timings: Sequence[StepTiming]) -> TimeModel:
    """``plain`` (the core's fit without checkpointing) plus the chunked steps'
    forward+backward excess over the plain ones timed beside them, through the two sizes
    (medians per size)."""
    chunked = [t for t in timings if t.spec.loss_chunks > 1]
    base = [t for t in timings if t.spec.loss_chunks == 1]
    chunks = max(t.spec.loss_chunks for t in chunked)
    return dataclasses.replace(delta_time_model(plain, base, chunked), loss_chunks=chunks)
