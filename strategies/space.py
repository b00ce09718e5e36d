"""The search space: every config that keeps the global batch, on the devices a profile saw.

A candidate is one choice of the knobs the search turns (precision, activation checkpointing,
parallelism × world size, micro-batch size × gradient accumulation, data-loader workers); every
other TrainConfig key (model, data, learning rate ...) is the same for all of them and comes
from the profile's workload and the request. The global batch is the user's training semantics
and is held FIXED: ``micro_batch_size * grad_accum_steps * world_size == global_batch_size``
for every candidate, so micro-batch sizes are exactly the divisors of global_batch / world_size
(DESIGN.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from profilers.checkpointing import parse_checkpointing
from profilers.hardware import HardwareSpec
from profilers.profile_record import Profile
from profilers.workload import PRECISIONS
from strategies.config import DEFAULT_STEPS, TrainConfig
from strategies.errors import StrategyError
from strategies.restrict import narrow, normalize_only, reasons_by_value

# Knobs a candidate sets; every other TrainConfig key comes from the base config.
KNOBS: tuple[str, ...] = (
    "precision",
    "activation_checkpointing",
    "parallelism",
    "world_size",
    "micro_batch_size",
    "grad_accum_steps",
    "num_workers",
    "loss_chunks",
    "fsdp_reshard_after_forward",
    "compile",
)


# torch.compile on a target: its speed-up is measured on the profiled device only
# (profilers.phases_compile); torchtitan's published Llama-3.1-8B table (8 H100s, FSDP, bf16:
# +16% tokens/s from compile) is one data point of one model, stack and kernel set, so the
# what-if assumes none rather than carrying it over to every model.
COMPILE_UNAVAILABLE = (
    "torch.compile has no measured speed-up on a what-if target (torchtitan's +16% on "
    "Llama-3.1-8B is one published data point, not assumed here): plan without --compile, "
    "then measure it on the target with 'advisor profile'"
)


# --network prices the links between nodes: on one node no collective crosses it.
NETWORK_NEEDS_NODES = (
    "--network prices the links between nodes, and with --nodes 1 no collective crosses one: "
    "add --nodes N (the world size split over N nodes) or drop --network"
)


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class Candidate:
    """One point of the search space (a slice of TrainConfig)."""

    precision: str
    activation_checkpointing: str
    parallelism: str
    world_size: int
    micro_batch_size: int
    grad_accum_steps: int
    num_workers: int = 0
    loss_chunks: int = 1
    fsdp_reshard_after_forward: bool = True  # False (fsdp only): blocks kept gathered
    compile: bool = False  # torch.compile of each block (its speed-up measured per group)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.world_size

    @property
    def layout(self) -> str:
        """``single``, ``ddp×2``, ``fsdp×4``: parallelism and world size in one word."""
        return "single" if self.parallelism == "single" else f"{self.parallelism}×{self.world_size}"

    @property
    def key(self) -> str:
        """A stable identity, e.g. ``bf16/full/ddp2/mb4xga8/nw0`` (study de-duplication)."""
        return (
            f"{self.precision}/{self.activation_checkpointing}/{self.parallelism}"
            f"{self.world_size}/mb{self.micro_batch_size}xga{self.grad_accum_steps}"
            f"/nw{self.num_workers}"
            + (f"/lc{self.loss_chunks}" if self.loss_chunks > 1 else "")
            + ("" if self.fsdp_reshard_after_forward else "/kg")
            + ("/tc" if self.compile else "")
        )

    def label(self) -> str:
        """Human-readable: ``bf16, checkpointing, ddp×2, 4×8 accumulation``."""
        parts = [self.precision]
        if self.activation_checkpointing != "none":
            parts.append(f"{self.activation_checkpointing} checkpointing")
        parts.append(self.layout)
        parts.append(f"micro-batch {self.micro_batch_size} × {self.grad_accum_steps} accumulation")
        if self.num_workers:
            parts.append(f"{self.num_workers} loader workers")
        if self.loss_chunks > 1:
            parts.append(f"loss in {self.loss_chunks} chunks")
        if not self.fsdp_reshard_after_forward:
            parts.append("blocks kept gathered (no reshard after forward)")
        if self.compile:
            parts.append("torch.compile")
        return ", ".join(parts)

    def short_label(self) -> str:
        """For a chart axis: ``fp32 · full ckpt · ddp×2 · 8×1`` (layout and workers only when
        not the default). The checkpointing setting is named: ``full``, ``blocks:2``, ``ops``
        and ``ops-half`` all read "ckpt" until 2026-12-07, two bars of one chart alike."""
        parts = [self.precision]
        if self.activation_checkpointing != "none":
            parts.append(f"{self.activation_checkpointing} ckpt")
        if self.parallelism != "single":
            parts.append(self.layout)
        parts.append(f"{self.micro_batch_size}×{self.grad_accum_steps}")
        return " · ".join([*parts, *self.extras()])

    def extras(self) -> list[str]:
        """The knobs beyond precision, checkpointing, layout and batch split that are not at
        their defaults, one short word each: ``2w`` (loader workers), ``16ch`` (loss chunks),
        ``kept`` (FSDP blocks kept gathered), ``compiled``."""
        parts = []
        if self.num_workers:
            parts.append(f"{self.num_workers}w")
        if self.loss_chunks > 1:
            parts.append(f"{self.loss_chunks}ch")
        if not self.fsdp_reshard_after_forward:
            parts.append("kept")
        if self.compile:
            parts.append("compiled")
        return parts

    def apply(self, base: TrainConfig) -> TrainConfig:
        """``base`` with this candidate's knobs (and the matching global batch)."""
        return base.replace(global_batch_size=self.global_batch_size, **self.to_dict())

    @classmethod
    def from_config(cls, config: TrainConfig) -> Candidate:
        return cls(**{k: getattr(config, k) for k in KNOBS})

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in KNOBS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(**{k: data[k] for k in KNOBS if k in data})


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchRequest:
    """What the user asks of ``advisor recommend`` (CLI flags, validated here once).

    ``world_size``: the most ranks to consider (None: the devices the profile saw; 1 on a CPU
    host). With a what-if ``target`` it is exactly the ranks planned for, over ``nodes``
    machines (``network`` between them, a :data:`profilers.hardware.NETWORKS` key).
    ``config_overrides``: TrainConfig keys the plan carries unchanged (lr, data, seed ...).
    """

    global_batch_size: int
    memory_budget: float = 0.9
    world_size: int | None = None
    trials: int | None = None
    target: str | None = None
    nodes: int = 1
    network: str | None = None
    seed: int = 0
    study_name: str | None = None
    config_overrides: Mapping[str, Any] = field(default_factory=dict)
    # The run's optimizer steps: a compiled candidate's compile time is amortised over them.
    run_steps: int = DEFAULT_STEPS
    # --only: per knob, the values the search may turn (strategies.restrict); empty: all.
    only: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "only", normalize_only(self.only))
        for name in ("global_batch_size", "nodes", "seed", "run_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise StrategyError(f"{name} must be a non-negative integer, got {value!r}")
        if self.global_batch_size < 1:
            raise StrategyError(
                f"global batch size must be at least 1, got {self.global_batch_size}: pass "
                "--global-batch-size N (sequences per optimizer step)"
            )
        if not 0 < self.memory_budget <= 1:
            raise StrategyError(
                f"memory budget must be a fraction in (0, 1], got {self.memory_budget}: e.g. "
                "--memory-budget 0.9"
            )
        for name in ("world_size", "trials"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise StrategyError(f"{name} must be a positive integer, got {value!r}")
        if self.nodes < 1:
            raise StrategyError(f"nodes must be at least 1, got {self.nodes}")
        if self.target is None and (self.nodes != 1 or self.network is not None):
            raise StrategyError(
                "--nodes and --network plan for hardware you don't have: they need --target "
                "(e.g. --target h100-80gb --world-size 16 --nodes 2)"
            )
        if self.target is not None and self.nodes == 1 and self.network is not None:
            raise StrategyError(NETWORK_NEEDS_NODES)
        if self.target is not None:
            world = self.world_size or 1
            if self.world_size is None and self.nodes > 1:
                raise StrategyError(
                    f"--nodes {self.nodes} needs --world-size, the GPUs in all (e.g. "
                    f"--world-size {8 * self.nodes} for 8 a node)"
                )
            if world % self.nodes:
                raise StrategyError(
                    f"world size {world} does not split evenly over {self.nodes} nodes: pick a "
                    f"--world-size that is a multiple of --nodes (e.g. {8 * self.nodes} for 8 a "
                    "node)"
                )
        unknown = sorted(
            set(self.config_overrides) - {f.name for f in dataclasses.fields(TrainConfig)}
        )
        if unknown:
            raise StrategyError(f"unknown TrainConfig key(s) {', '.join(unknown)}")
        clash = sorted(set(self.config_overrides) & {*KNOBS, "global_batch_size"})
        if clash:
            raise StrategyError(
                f"{', '.join(clash)} are chosen by the search: use 'advisor predict' to cost a "
                "fixed config"
            )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["config_overrides"] = dict(self.config_overrides)
        data.pop("only")
        if self.only:  # plans of unrestricted searches read as they did before --only
            data["only"] = {k: list(v) for k, v in self.only.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchRequest:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """The knobs' values; :meth:`candidates` is their product under the fixed global batch.

    ``excluded`` names values left out and why (a precision the device cannot run ...), for the
    plan's reasons.
    """

    global_batch_size: int
    precisions: tuple[str, ...]
    checkpointing: tuple[str, ...]
    layouts: tuple[tuple[str, int], ...]  # (parallelism, world_size)
    num_workers: tuple[int, ...] = (0,)
    excluded: tuple[str, ...] = ()
    loss_chunks: tuple[int, ...] = (1,)  # 1: the plain loss; more: the profile measured them
    # FSDP layouts only: True reshards every block after forward; False (when the profile
    # traced it) keeps them gathered until backward.
    fsdp_reshard_after_forward: tuple[bool, ...] = (True,)
    # torch.compile off, and on where the profile measured its speed-up (compile_settings).
    compile: tuple[bool, ...] = (False,)
    # The only micro-batch sizes allowed (--only micro_batch_size=...); empty: every divisor.
    micro_batch_only: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.precisions:
            raise StrategyError(
                "no training precision is both supported by the device and profiled: re-run "
                "'advisor profile' on this device"
            )
        if not self.layouts:
            raise StrategyError(
                f"global batch size {self.global_batch_size} cannot be split over the world "
                "sizes asked for: pick a multiple of --world-size, or a smaller --world-size"
            )

    def micro_batch_sizes(self, world_size: int) -> tuple[int, ...]:
        """Divisors of the per-rank batch: micro × accum × world = global exactly."""
        if self.global_batch_size % world_size:
            return ()
        sizes = divisors(self.global_batch_size // world_size)
        if not self.micro_batch_only:
            return sizes
        return tuple(d for d in sizes if d in self.micro_batch_only)

    def candidates(self) -> list[Candidate]:
        """Every candidate, in a fixed order (so enumeration and resumption are deterministic)."""
        out: list[Candidate] = []
        for precision in self.precisions:
            for checkpointing in self.checkpointing:
                for parallelism, world in self.layouts:
                    per_rank = self.global_batch_size // world
                    for micro in self.micro_batch_sizes(world):
                        for workers in self.num_workers:
                            out.extend(
                                Candidate(
                                    precision=precision,
                                    activation_checkpointing=checkpointing,
                                    parallelism=parallelism,
                                    world_size=world,
                                    micro_batch_size=micro,
                                    grad_accum_steps=per_rank // micro,
                                    num_workers=workers,
                                    loss_chunks=chunks,
                                    fsdp_reshard_after_forward=reshard,
                                    compile=compiled,
                                )
                                for chunks in self.loss_chunks
                                for reshard in self._reshard_values(parallelism)
                                for compiled in self.compile
                            )
        return out

    def _reshard_values(self, parallelism: str) -> tuple[bool, ...]:
        return self.fsdp_reshard_after_forward if parallelism == "fsdp" else (True,)

    @property
    def size(self) -> int:
        per_layout = sum(
            len(self.micro_batch_sizes(w)) * len(self._reshard_values(p)) for p, w in self.layouts
        )
        return (
            len(self.precisions)
            * len(self.checkpointing)
            * per_layout
            * len(self.num_workers)
            * len(self.loss_chunks)
            * len(self.compile)
        )

    def contains(self, candidate: Candidate) -> bool:
        return (
            candidate.precision in self.precisions
            and candidate.activation_checkpointing in self.checkpointing
            and (candidate.parallelism, candidate.world_size) in self.layouts
            and candidate.global_batch_size == self.global_batch_size
            and candidate.num_workers in self.num_workers
            and candidate.loss_chunks in self.loss_chunks
            and candidate.fsdp_reshard_after_forward in self._reshard_values(candidate.parallelism)
            and candidate.compile in self.compile
            and candidate.micro_batch_size in self.micro_batch_sizes(candidate.world_size)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "global_batch_size": self.global_batch_size,
            "precisions": list(self.precisions),
            "checkpointing": list(self.checkpointing),
            "layouts": [f"{p}/{w}" for p, w in self.layouts],
            "num_workers": list(self.num_workers),
            "loss_chunks": list(self.loss_chunks),
            "fsdp_reshard_after_forward": list(self.fsdp_reshard_after_forward),
            # Only when searched: an eager space keeps the study name it had before the knob.
            **({"compile": list(self.compile)} if True in self.compile else {}),
            **({"micro_batch_only": list(self.micro_batch_only)} if self.micro_batch_only else {}),
            "excluded": list(self.excluded),
            "size": self.size,
        }


def layouts_for(global_batch_size: int, world_sizes: Sequence[int]) -> tuple[tuple[str, int], ...]:
    """(parallelism, world size) pairs whose world size divides the global batch."""
    out: list[tuple[str, int]] = []
    for world in world_sizes:
        if global_batch_size % world:
            continue
        out.extend([("single", 1)] if world == 1 else [("ddp", world), ("fsdp", world)])
    return tuple(out)


def device_precisions(profile: Profile) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(precisions the profiled device runs, why the others are left out).

    The device probe tried an autocast step per precision; a profile without that record (an
    older or hand-made one) falls back to the precisions its memory fits cover.
    """
    checks = profile.device.precisions
    if not checks:
        fitted = {m.precision for m in profile.fits.memory}
        kept = tuple(p for p in PRECISIONS if p in fitted)
        return kept, tuple(f"{p}: not profiled" for p in PRECISIONS if p not in fitted)
    kept = tuple(p for p in PRECISIONS if p in checks and checks[p].supported)
    dropped = tuple(
        f"{p}: {checks[p].reason if p in checks else 'not checked by the device probe'}"
        for p in PRECISIONS
        if p not in kept
    )
    return kept, dropped


def target_precisions(target: HardwareSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Precisions with a datasheet peak on ``target`` (V100 has no bf16 units, ...)."""
    kept = tuple(p for p in PRECISIONS if target.peak_flops(p) is not None)
    dropped = tuple(
        f"{p}: {target.name} has no {p} figure on its datasheet"
        for p in PRECISIONS
        if p not in kept
    )
    return kept, dropped


def available_devices(profile: Profile) -> int:
    """Ranks the profiled machine can host without being told: its visible GPUs, or 1 on CPU
    (CPU ranks share one host's cores; ask for more with --world-size)."""
    gpu = profile.device.gpu
    if profile.device.kind == "cuda" and gpu is not None:
        return max(gpu.num_visible_gpus, 1)
    return 1


def precision_flag(precision: str) -> str:
    """The ``advisor profile`` flag that measures one precision (reasons name it)."""
    return f"--precision {precision}"


def searched_checkpointing(
    profile: Profile,
    settings: Sequence[str],
    *,
    keep: Sequence[str] = (),
    whatif: bool = False,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the checkpointing settings the search prices, why the others are left out).

    ``ops`` and ``ops-half`` need their own traces and timings (no other setting predicts
    their recompute), so each is searched only when the profile measured it (ops-half only
    when asked: ``advisor profile --checkpointing``). A what-if (``whatif``) times them by the
    roofline over the profile's FLOP count, so their traces suffice: a profile of a model that
    fits no device here times nothing, and a 46.7B Mixtral's traced ``ops`` was left out of its
    64-GPU what-if. ``blocks:K`` is priced from the measured
    settings (profilers.checkpointing_fits: memory from their windows, time on the line in
    K); a deep model's K are thinned
    to :data:`MAX_BLOCK_SETTINGS` evenly spaced values (always K = 1, the least recompute), so
    an 80-layer model does not multiply the space by 79; a K named in ``keep`` (asked for by
    ``--only``) is priced whether or not the thinning picks it.
    """
    measured = {m.activation_checkpointing for m in profile.fits.memory}
    if not whatif:
        measured &= {t.activation_checkpointing for t in profile.fits.time}
    kept: list[str] = []
    left_out: list[str] = []
    layers = profile.model.num_layers
    ks = _block_choices(layers)
    for setting in settings:
        parsed = parse_checkpointing(setting)
        if parsed.kind == "ops" and setting not in measured:
            left_out.append(
                "ops checkpointing: the profile did not trace and time it (profiles written "
                "before it existed, or its budget ran out): re-run 'advisor profile' with a "
                "larger --budget-s"
            )
        elif parsed.kind == "ops-half" and setting not in measured:
            left_out.append(
                "ops-half checkpointing (torchtitan's 'op'): not measured by this profile; "
                "'advisor profile --checkpointing ops-half' (with the other settings wanted) "
                "measures it"
            )
        elif parsed.kind != "blocks" or parsed.blocks in ks or setting in keep:
            kept.append(setting)
    return tuple(kept), tuple(left_out)


# blocks:K values a search prices at most (see searched_checkpointing).
MAX_BLOCK_SETTINGS = 8


def _block_choices(num_layers: int) -> set[int]:
    if num_layers - 1 <= MAX_BLOCK_SETTINGS:
        return set(range(1, num_layers))
    steps = MAX_BLOCK_SETTINGS - 1
    return {1 + round(i * (num_layers - 2) / steps) for i in range(MAX_BLOCK_SETTINGS)}


def build_space(
    profile: Profile, request: SearchRequest, *, target: HardwareSpec | None = None
) -> SearchSpace:
    """The search space for ``request`` on the profiled device (or on a what-if ``target``).

    World sizes: 1 .. ``request.world_size`` (default: the devices available); a what-if plans
    for exactly ``request.world_size`` ranks. Data-loader workers: the counts the profile's
    input probe measured, on a GPU host only: on a CPU host the loader's workers and the step
    share the same cores, so there is no overlap to buy (0 workers). Activation checkpointing:
    the modes the model can run (none only, without repeated blocks; the reason is in
    ``excluded``, hence in the plan's reasons).
    """
    only = request.only
    if target is not None:
        precisions, excluded = target_precisions(target)
        world = request.world_size or 1
        worlds: Sequence[int] = (world,)
    else:
        precisions, excluded = device_precisions(profile)
        worlds = range(1, (request.world_size or available_devices(profile)) + 1)
    if profile.precisions is not None:
        asked = " ".join(precision_flag(p) for p in profile.precisions)
        excluded = (
            *excluded,
            *(
                f"{p}: not profiled (the profile was limited to {asked})"
                for p in precisions
                if p not in profile.precisions
            ),
        )
        precisions = tuple(p for p in precisions if p in profile.precisions)
    precisions, restricted = narrow(
        "precision", precisions, only, reasons=reasons_by_value(excluded)
    )
    layouts = layouts_for(request.global_batch_size, worlds)
    if not layouts:
        raise StrategyError(
            f"global batch size {request.global_batch_size} cannot be split over "
            f"{worlds[-1]} ranks: pick a multiple of {worlds[-1]} for --global-batch-size or "
            "a world size that divides it"
        )
    parallelisms, lines = narrow(
        "parallelism",
        tuple(dict.fromkeys(p for p, _ in layouts)),
        only,
        reasons=_layout_reasons(request, worlds, target is not None),
    )
    layouts = tuple(layout for layout in layouts if layout[0] in parallelisms)
    restricted += lines
    # Checkpointing per block needs repeated blocks (ModelFacts.checkpointing_modes).
    checkpointing, no_blocks = profile.model.checkpointing_modes()
    checkpointing, unmeasured = searched_checkpointing(
        profile,
        checkpointing,
        keep=only.get("activation_checkpointing", ()),
        whatif=target is not None,
    )
    excluded = (*excluded, *no_blocks, *unmeasured)
    checkpointing, lines = narrow(
        "activation_checkpointing",
        checkpointing,
        only,
        reasons={
            **{
                v: why
                for v in only.get("activation_checkpointing", ())
                if (why := profile.model.checkpointing_problem(v))
            },
            **reasons_by_value((*no_blocks, *unmeasured)),
        },
    )
    restricted += lines
    on_gpu = (target is not None) or profile.device.kind == "cuda"
    workers: tuple[int, ...] = (0,)
    if on_gpu and target is None:
        measured = sorted({s.num_workers for s in profile.input if s.status == "ok"})
        workers = tuple(measured) or (0,)
    workers, lines = narrow(
        "num_workers",
        workers,
        only,
        otherwise="the input probe measured no such worker count"
        if on_gpu
        else "a CPU host runs the loader on the step's cores: 0 only",
    )
    restricted += lines
    chunks, no_chunks = loss_chunk_counts(profile)
    chunks, lines = narrow(
        "loss_chunks",
        chunks,
        only,
        otherwise="; ".join(no_chunks)
        or _chunk_probe_reason(profile)
        or "the profile measured no loss in that many chunks",
    )
    restricted += lines
    micro_only: tuple[int, ...] = ()
    if "micro_batch_size" in only:
        per_rank = {w: divisors(request.global_batch_size // w) for _, w in layouts}
        micro_only, lines = narrow(
            "micro_batch_size",
            tuple(sorted({d for sizes in per_rank.values() for d in sizes})),
            only,
            otherwise=f"no layout's per-rank share of global batch {request.global_batch_size} "
            "splits into it",
        )
        restricted += lines
        # A layout none of whose splits is allowed drops out.
        layouts = tuple((p, w) for p, w in layouts if set(per_rank[w]) & set(micro_only))
    reshard, no_kept = reshard_settings(profile, layouts)
    reshard, lines = narrow(
        "fsdp_reshard_after_forward",
        reshard,
        only,
        reasons={
            False: "; ".join(no_kept)
            if any(p == "fsdp" for p, _ in layouts)
            else "no FSDP layout is searched here"
        },
    )
    restricted += lines
    compiled, no_compile = compile_settings(profile, what_if=target is not None)
    compiled, lines = narrow(
        "compile",
        compiled,
        only,
        reasons={
            True: "; ".join(no_compile)
            or "the profile measured no compiled step: re-run 'advisor profile' (it measures "
            "torch.compile when its budget reaches it)"
        },
    )
    restricted += lines
    return SearchSpace(
        global_batch_size=request.global_batch_size,
        precisions=precisions,
        checkpointing=checkpointing,
        layouts=layouts,
        num_workers=workers,
        excluded=(*excluded, *no_chunks, *no_kept, *no_compile, *restricted),
        loss_chunks=chunks,
        fsdp_reshard_after_forward=reshard,
        compile=compiled,
        micro_batch_only=micro_only,
    )


def _chunk_probe_reason(profile: Profile) -> str:
    """Why the profile measured no chunked loss at all, from its 'loss_chunks' probe row
    ("the logits (vocabulary 256) are no larger than one block's activations ...: nothing
    measured"), for ``--only loss-chunks=N``; "" without one. Until 2026-12-07 the refusal
    said only "the profile measured no loss in that many chunks", which a longer profile
    would not have changed."""
    return next(
        (
            f"the profile measured no chunked loss: {row.reason}"
            for row in profile.probes
            if row.probe == "memory" and row.name == "loss_chunks" and row.reason
        ),
        "",
    )


def _layout_reasons(request: SearchRequest, worlds: Sequence[int], what_if: bool) -> dict[str, str]:
    """Why a parallelism has no layout in this search, for ``--only parallelism=...``."""
    gbs = request.global_batch_size
    if what_if:
        many = f"a what-if plans exactly {worlds[-1]} ranks (--world-size)"
        return (
            {"single": many, "ddp": many, "fsdp": many}
            if worlds[-1] > 1
            else {
                "ddp": "a what-if of one rank: pass --world-size 2 or more",
                "fsdp": "a what-if of one rank: pass --world-size 2 or more",
            }
        )
    if worlds[-1] < 2:
        several = "needs 2 or more ranks: pass --world-size 2 or more"
    else:
        several = (
            f"global batch {gbs} splits over none of the world sizes 2 to {worlds[-1]}: pick a "
            "global batch they divide"
        )
    return {"ddp": several, "fsdp": several}


@functools.cache
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in ascending order (none for ``n < 1``).

    Trial division up to sqrt(n) pairs each small divisor d with n // d, so a prime global batch
    near 1e9 costs ~3e4 steps rather than 1e9. Cached: ``SearchSpace.size``, ``candidates`` and
    ``contains`` ask again for the same few per-rank batches.
    """
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0] if n >= 1 else []
    # n // d for the small divisors descending is the large ones ascending; a square root
    # would appear in both halves, so it is dropped from the second.
    large = [n // d for d in reversed(small) if n // d != d]
    return (*small, *large)


def compile_settings(
    profile: Profile, *, what_if: bool = False
) -> tuple[tuple[bool, ...], tuple[str, ...]]:
    """(the ``compile`` values to search, why not on): on only where the profile measured a
    compiled step's speed-up and compile time (profilers.phases_compile); the groups it did not
    reach, or that failed to compile, are priced as unpredictable with the reason. A what-if
    has no measured speed-up for its target, and none is assumed."""
    if what_if:  # said whether or not this device's profile measured it (README: --target
        # plans say why; --only compile=true named a re-profile that cannot help)
        return (False,), (f"compile: {COMPILE_UNAVAILABLE}",)
    if any(m.ok for m in profile.compile):
        return (False, True), ()
    reasons = {m.reason for m in profile.compile if m.reason}
    skipped = [r.reason for r in profile.probes if r.probe == "compile" and r.status != "ok"]
    why = next(iter(sorted(reasons)), None) or next(iter(skipped), None)
    if why is None:  # a profile from before the knob, or a model with no timed group
        return (False,), ()
    return (False,), (f"compile: {why}",)


# Why a model without repeated blocks has no kept-gathered FSDP layout to search.
NO_BLOCKS_TO_KEEP_GATHERED = (
    "the model has no repeated blocks: FSDP shards it as one unit, its root, which stays "
    "gathered from forward to backward either way"
)


def reshard_settings(
    profile: Profile, layouts: Sequence[tuple[str, int]]
) -> tuple[tuple[bool, ...], tuple[str, ...]]:
    """(the ``fsdp_reshard_after_forward`` values to search for FSDP layouts, why not False):
    False only when the profile traced an FSDP rank with the blocks kept gathered (at any world
    size: MemoryModel.resharded moves it to another), as measured knobs enter the search."""
    if not any(p == "fsdp" for p, _ in layouts):
        return (True,), ()
    if not profile.model.repeated_blocks:
        return (True,), (f"fsdp_reshard_after_forward false: {NO_BLOCKS_TO_KEEP_GATHERED}",)
    if any(
        m.parallelism == "fsdp" and not m.fsdp_reshard_after_forward for m in profile.fits.memory
    ):
        return (True, False), ()
    return (True,), (
        "fsdp_reshard_after_forward false: the profile traced no FSDP rank with the blocks kept "
        "gathered (its budget ran out first; see the 'fsdp kept gathered' probe row)",
    )


def loss_chunk_counts(profile: Profile) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(the ``loss_chunks`` values to search, why none beyond 1): 1, plus every chunk count
    the profile traced a memory fit for (profilers.phases_chunked picks and measures one)."""
    if not profile.model.output_head:
        # A profile from before the knob says nothing: no reason to print.
        reason = profile.model.output_head_reason
        return (1,), ((profile.model.loss_chunking_unavailable(),) if reason else ())
    measured = sorted({m.loss_chunks for m in profile.fits.memory if m.loss_chunks > 1})
    return (1, *measured), ()
