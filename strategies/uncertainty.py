"""How far a predicted step time can be trusted: a 90% interval from what the profile measured.

A prediction is a line fitted through a few micro-batch sizes, each timed a few times on a
host that may be shared. Its error has independent parts, each a relative standard deviation
(in log space, so an interval is a factor either side, never negative):

* ``fit``: where the fitted line itself may be, from its residuals: ``s·√h(b)``, with ``s`` the
  residual standard deviation of the samples (relative to the line, ``n − 2`` degrees of
  freedom) and ``h(b) = 1/n + (b − x̄)²/Sxx`` the leverage, which grows with the distance of
  ``b`` from the probed sizes (an extrapolation is less certain than an interpolation).
* ``sample``: one new measurement's own scatter about the line, ``s`` again.
* ``extrapolation``: a micro-batch outside the probed sizes, where the line's *shape* may be
  wrong, which neither part above can see: the residuals measure the scatter at each probed
  size, not a curve between or beyond them (two probed sizes, the usual profile, fit any curve
  exactly; the one GPU profile so far timed one sample per size and has no residuals at all).
  The part is ``σ = k·d`` with ``d = |ln(b / nearest probed size)|``: 0 inside the probed
  range (nothing there changes), the same either side (predicting 1 from 2-8 is as far as
  16). Why this form: the distance is scale-free, a ratio (16 from 2-4 is as far as 64 from
  8-16; ``d`` / ln 2 counts doublings past the edge), and the part grows linearly in it, the
  simplest form that is 0 at the range's edge. Why a factor either
  side when the data below read one way: the sign of the curvature is the workload's and the
  device's (a device that a small micro-batch leaves partly idle reads nearly flat at small
  sizes and climbs later; per-step overheads spread over more samples bend it the other
  way), so it is not assumed; and an interval here is symmetric in log space. The constant
  ``k`` = 0.064 is measured, on the *tuning* models only (gpt-tiny and llama-tiny, fp32 and
  bf16, the 2-vCPU dev hosts): every profiler_accuracy*.json under benchmarks/results times
  sizes 3 and 6 inside the profile's probed 2-8 and 12 outside it (``d`` = ln 1.5), and the
  *same-session* error there (the line re-fitted in the truth's own children: no drift) had
  a root mean square log error of 0.0352 over the 152 interpolated rows and 0.0437 over the
  76 extrapolated ones; the part is the excess, √(0.0437² − 0.0352²) / ln 1.5 = 0.064, what a
  prediction outside missed beyond what one inside did (inside 2.4% over on average, outside
  3.0% under: one convex curve both times). One distance was measured, so the growth beyond
  1.5× is the assumed form; the fp16 rows (probed 1-2, predicted at 3, 6, 12: ``d`` up to
  ln 6) all stayed within 1.2%, inside it. Held out, on bert-tiny's 42 extrapolated rows
  (fp32 and bf16, same files), the ``fit`` and ``sample`` parts alone covered 32 at 90%, with
  this part 33; its 84 interpolated rows are unchanged (60). With a shared host's ``host``
  part as well, 41 of the 42 were covered before and after: on these CPUs the host's part
  dwarfs it; it matters where the others are small (a device the job owns, a fit of one
  sample per size). A blocks:K time interpolated between two timed settings has no fit of its
  own: it takes the larger of its two anchors' parts (each anchor's line is predicted at the
  same micro-batch). Not covered: torch.compile's speed-up, held at the nearest measured
  size's outside them (no measurement of how it bends there). Nothing else is extrapolated:
  accumulation repeats the timed micro-batch (the fit is per micro-batch), and a sequence
  length other than the profile's is refused (strategies.cost.CostModel.check_config).
* ``host``: a shared host's visit-to-visit scatter, which no sample taken in the profile's few
  seconds shows. Measured, not assumed, on the *tuning* models only (gpt-tiny and
  llama-tiny, 60 configs × 3 visits each, benchmarks/results/regret_grid.csv of the earlier
  regret benchmark on the 2-vCPU dev host): a visit's log-deviation from its config's median
  had a 90th percentile of 0.104 and 0.073; pooled ≈ 0.09 → σ = 0.09 / 1.645 = 0.055. A GPU
  the job owns has no such neighbour: a small ``0.02`` is assumed there, and said so. The one
  GPU run so far (an H200, gpt-small fp32, benchmarks/results/gpu_h200_2026-12-04/) is within
  it: three validated configs' visits came within 0.0-0.4% of the profile's fits (their own
  visits within 0.5% of each other), and a 30-step training run within 0.8%. One run, one
  model: kept as an assumption.
* ``drift``: a shared host's drift between the profile's moment and a later run's, which the
  ``host`` part (visits of one grid, minutes apart) does not see: the profiler-accuracy
  benchmark re-times a profile's own probed sizes after the profile (``drift`` = step time
  then / the profile's). On the tuning models only (gpt-tiny and llama-tiny, 80 precision ×
  checkpointing groups of every profiler_accuracy*.json under benchmarks/results: drift
  0.68-1.38), the root mean square of log(drift) is 0.132 → σ = 0.13
  (benchmarks/profile_drift.py re-derives it: results/profile_drift.md; 0.132 → 0.13 from the
  24 groups before 2026-12-04's runs, 0.156 → 0.16 from the 48 before its third selective
  run, r3, whose host held still: drift 0.91-1.18, 0.141 → 0.14 from the 64 before the
  fourth, r4, of 2026-12-04/05: drift 0.91-1.21). Part of the earlier runs' drift was the
  timing child's own one-sided bias, since fixed (profilers.host_allocator); the first run
  after the fix alone reads 0.188, its host moving both ways. The groups of one run are not
  independent (a run's groups mostly drift together: gpt-tiny's selective run 0.90, 0.90,
  0.90, 0.74), so this rests on a few runs. A moment's drift moves the configs measured
  together alike, so the tests that compare candidates of one profile with each other
  (validation's contenders and doubted visits: :meth:`Uncertainty.comparable`) leave it out;
  those tests were set with intervals that did not have it. A device the job owns has no
  neighbour to drift with: no term.
* ``busy``: other processes' share ``s`` of the host's CPU time while the profile timed steps
  (profilers.host_activity, the largest over its timing children). A step that got only
  ``1 − s`` of the host can read up to ``1/(1 − s)`` slow, a bias a quiet run does not share;
  the part is sized so that the interval reaches it: ``σ = −ln(1 − s)/z``. Derived from the
  meter's definition, not fitted: on a quiet host (``s`` below 1%) it adds nothing visible;
  beside one spinning core of two (``s`` ≈ 0.4) the factor is at least 1.67. It is not a
  common part: groups timed at different moments were slowed differently, so it widens the
  comparisons between candidates too (more contenders validated after a busy profile). Only
  where the step runs on the host's CPUs: a GPU's step is the device's, and a busy host slows
  only its launches (not modelled). Not a bound for a multi-threaded step, seen once: a
  bert-tiny profile beside the test suite on the 2-vCPU dev host (``s`` = 43%, allowing
  1.76×) timed fp32 mb 8 at 0.087 s, 2.0× a quiet profile's 0.044 s (the regret grid measured
  0.038 s): a step's threads meet at every op, so a core shared with a neighbour slows all of
  them to its pace. The interval widened from ×/÷ 1.28 to ×/÷ 1.85 and still did not reach
  the quiet step; the warning to re-profile on a quiet host stands.
* ``source``: what the profile did not measure for this candidate: a checkpointing time derived
  from the counted FLOPs ratio, a CPU rank's time scaled from the single-process fit with the
  collectives modelled (their errors on the tuning models: ddp×2 median |error| 6-9%; fsdp×2
  median 6%, max 9.5% once FSDP2's CPU work is charged, strategies.cost.FSDP_CPU_STEP_S, was
  16-27%), or a what-if estimate for hardware never measured (strategies.roofline). The
  what-if's part is its measured error, not assumed: in bf16 (fp16 taken alike: the same
  tensor-core peaks), the root mean square of log(predicted / published tokens/s/GPU) over the
  40 held-out rows of benchmarks/whatif_published.py (three sources' published runs, FSDP over
  8-128 A100/H100s, 0.1-70B parameters; nothing fitted on them, though two of its terms were
  added after seeing some): 0.075, which puts 36 of the 40 inside a 90% interval. In fp32,
  which no published run used, our own GPU run's fp32 steps (an H200, gpt-small,
  benchmarks/whatif_measured.py) read the what-if 1.8× slow, 1.4× once fp32 attention was
  priced without FlashAttention's tensor-core fractions (a cause those rows exposed, so they no
  longer judge that change blind): RMS log error 0.32 over its four rows (one model, one run; an
  interval ×/÷ 1.7 that says "not validated" in numbers). Both are
  re-derived by the benchmarks (``rms_log_error`` in their results) and a test holds these
  constants to the committed results.
* ``delta``: a group timed as a *delta* beside the plain step in one child (the recompute of
  a checkpointing setting, the loss chunks' cost: profilers.throughput.delta_time_model) adds
  that delta to the plain fit, whose residuals say nothing of it. Its own error is read from
  its samples: the standard error of the paired same-round differences (each round of the
  child times every group once), over the step. A child that timed one round has no spread to
  read, and adds no term.
* ``compile``: a compiled candidate's forward+backward is the eager one over a measured
  speed-up, itself uncertain: two probe children of the same group disagree. Measured on the
  tuning model gpt-tiny (fp32, none and full, micro-batch 2 and 8, 2-3 children each:
  benchmarks/results/compile_children/README.md), the pooled sd of their log speed-ups is
  0.043 (6 degrees of freedom); 0.05 is used. A child whose own paired ratios scatter more
  than that (the standard error of its median) uses its own. A DDP/FSDP rank gets the single
  device's speed-up, not measured on a rank: a ``source`` part, assumed 0.10, said so.

The parts add in quadrature; the interval is ``step × exp(±z·σ)`` with ``z`` the normal 95th
percentile (a central 90% interval). Whether 90% of real measurements land inside is not
assumed: benchmarks/regret.py measures it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profilers.fit import AffineFit

__all__ = [
    "INTERVAL_LEVEL",
    "Uncertainty",
    "busy_term",
    "compile_term",
    "delta_term",
    "drift_term",
    "extrapolation_distance",
    "extrapolation_term",
    "fit_terms",
    "interval_overlaps",
    "source_term",
]

INTERVAL_LEVEL = 0.90
_Z = 1.6448536269514722  # the standard normal's 95th percentile: a central 90% interval

# A shared (CPU) host's visit-to-visit drift, and the one assumed for a GPU the job owns
# (module docstring for where each comes from).
HOST_DRIFT_SHARED = 0.055
HOST_DRIFT_DEDICATED = 0.02
# A shared host's drift between the profile and a later run (module docstring).
PROFILE_TO_RUN_DRIFT_SHARED = 0.13
# Parts a moment's drift moves alike for every candidate of one profile: left out when
# candidates are compared with each other (Uncertainty.comparable).
COMMON_TERMS = frozenset({"drift"})

# What the profile did not measure (module docstring).
DERIVED_CHECKPOINTING = 0.10
CPU_RANKS_DDP = 0.08
CPU_RANKS_FSDP = 0.08
GPU_COLLECTIVES_MODELLED = 0.10
WHAT_IF_PUBLISHED = 0.075  # held-out published runs (bf16): benchmarks/results/whatif_published.md
WHAT_IF_FP32 = 0.32  # our own H200 fp32 run: benchmarks/results/whatif_measured.md
# A micro-batch outside the probed sizes: σ per unit of |ln(b / nearest probed size)| (module
# docstring: the tuning models' same-session error at 1.5× the largest probed size).
EXTRAPOLATION_PER_LOG_DISTANCE = 0.064
# torch.compile's measured speed-up, between two children; and applied to a rank (module doc).
COMPILE_BETWEEN_CHILDREN = 0.05
COMPILE_ON_RANKS = 0.10


@dataclass(frozen=True, kw_only=True, slots=True)
class Uncertainty:
    """The parts of a prediction's relative error (name, σ, where it comes from) and the
    resulting interval of the step time."""

    terms: tuple[tuple[str, float, str], ...]
    level: float = INTERVAL_LEVEL

    @property
    def sigma(self) -> float:
        return math.sqrt(sum(sigma**2 for _, sigma, _ in self.terms))

    def factor(self) -> float:
        """The interval's factor either side of the point: [step / f, step × f]."""
        return math.exp(_Z * self.sigma)

    def step_time_interval(self, step_time_s: float) -> tuple[float, float]:
        f = self.factor()
        return step_time_s / f, step_time_s * f

    def comparable(self) -> Uncertainty:
        """Without the parts every candidate of one profile shares (:data:`COMMON_TERMS`):
        the uncertainty that matters when candidates measured together are compared."""
        return Uncertainty(
            terms=tuple(t for t in self.terms if t[0] not in COMMON_TERMS), level=self.level
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "relative_sd": self.sigma,
            "terms": [
                {"name": name, "relative_sd": sigma, "source": source}
                for name, sigma, source in self.terms
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Uncertainty:
        return cls(
            level=float(data.get("level", INTERVAL_LEVEL)),
            terms=tuple(
                (str(t["name"]), float(t["relative_sd"]), str(t.get("source", "")))
                for t in data.get("terms") or ()
            ),
        )


def fit_terms(fit: AffineFit, x: float, weight: float) -> list[tuple[str, float, str]]:
    """The ``fit``, ``sample`` and ``extrapolation`` parts of a time fit at ``x``, for a term
    that is ``weight`` of the step (the micro-batches' share; the optimizer step is timed
    apart).

    No ``fit`` and ``sample`` parts when the fit has no residual degrees of freedom (two
    samples for two sizes): the host part then stands alone, and the source says so. The
    ``extrapolation`` part needs only the probed sizes: it is there whenever ``x`` is outside
    them (:func:`extrapolation_term`).
    """
    outside = extrapolation_term(fit, x, weight)
    extra = [outside] if outside is not None else []
    xs, ys = fit.xs, fit.ys
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return extra
    relative = [y / fit.predict(xi) - 1.0 for xi, y in zip(xs, ys, strict=True) if fit.predict(xi)]
    if len(relative) < 3:
        return extra
    s = math.sqrt(sum(r * r for r in relative) / (len(relative) - 2))
    mean_x = statistics.fmean(xs)
    sxx = sum((xi - mean_x) ** 2 for xi in xs)
    leverage = 1.0 / n + (x - mean_x) ** 2 / sxx
    sizes = ", ".join(f"{v:g}" for v in sorted(set(xs)))
    where = "inside" if min(xs) <= x <= max(xs) else "outside"
    return [
        (
            "fit",
            weight * s * math.sqrt(leverage),
            f"the line through {n} samples at micro-batch {sizes} (residual sd {s:.1%}), "
            f"at {x:g}, {where} the probed range",
        ),
        ("sample", weight * s, f"one measurement's scatter about that line ({s:.1%})"),
        *extra,
    ]


def extrapolation_distance(sizes: Sequence[float], x: float) -> float:
    """``|ln(x / the nearest of sizes)|`` when ``x`` is outside them, else 0 (also without
    sizes, or with a size that is not positive: nothing to measure the distance from)."""
    if not sizes or x <= 0:
        return 0.0
    low, high = min(sizes), max(sizes)
    if low <= 0 or low <= x <= high:
        return 0.0
    return math.log(x / high) if x > high else math.log(low / x)


def extrapolation_term(fit: AffineFit, x: float, weight: float) -> tuple[str, float, str] | None:
    """The ``extrapolation`` part of a time fit predicted at micro-batch ``x`` outside the
    sizes it was fitted through: ``weight × k × d`` (module docstring:
    :data:`EXTRAPOLATION_PER_LOG_DISTANCE`, ``d`` from :func:`extrapolation_distance`).
    None inside the probed range, or for a fit that keeps no sizes."""
    d = extrapolation_distance(fit.xs, x)
    if not d > 0:
        return None
    low, high = min(fit.xs), max(fit.xs)
    ratio = x / high if x > high else low / x
    side = "above" if x > high else "below"
    sigma = EXTRAPOLATION_PER_LOG_DISTANCE * d
    return (
        "extrapolation",
        weight * sigma,
        f"micro-batch {x:g} is {ratio:.3g}× {side} the probed {low:g}-{high:g}: the line's "
        f"shape there was not measured ({EXTRAPOLATION_PER_LOG_DISTANCE:g} × ln {ratio:.3g} = "
        f"{sigma:.1%} of the micro-batches' time, the factor measured on the tuning models "
        "at 1.5× their largest probed size)",
    )


def host_term(shared_host: bool, load: float | None, cpus: int | None) -> tuple[str, float, str]:
    if not shared_host:
        return (
            "host",
            HOST_DRIFT_DEDICATED,
            "drift of a device the job owns: assumed; on the one GPU run so far (an H200), "
            "validation visits and a training run came within 0.8% of the profile's fit",
        )
    at = f"; load {load:.1f} on {cpus} CPUs when profiled" if load is not None and cpus else ""
    return (
        "host",
        HOST_DRIFT_SHARED,
        "a shared host's visit-to-visit drift, measured on the tuning models (90th "
        f"percentile 9%){at}",
    )


def drift_term() -> tuple[str, float, str]:
    """The ``drift`` part of a shared host (module docstring)."""
    return (
        "drift",
        PROFILE_TO_RUN_DRIFT_SHARED,
        "a shared host's drift between the profile and a later run: profiled step times "
        "re-timed afterwards on the tuning models (root mean square 13%)",
    )


def busy_term(share: float) -> tuple[str, float, str] | None:
    """The ``busy`` part for a profile timed while others took ``share`` of the host (module
    docstring); None when nobody did (a share of 0, or not measured)."""
    if not share > 0:
        return None
    share = min(share, 0.95)  # the meter's own noise, and a host entirely taken: keep it finite
    return (
        "busy",
        -math.log1p(-share) / _Z,
        f"other processes took up to {share:.1%} of the host's CPU time while the profile "
        f"timed steps: its step times may read up to {1 / (1 - share):.2f}× slow",
    )


def compile_term(
    weight: float, log_sd: float | None, pairs: int, speedup: float
) -> tuple[str, float, str]:
    """The ``compile`` part for a forward+backward that is ``weight`` of the step, divided by
    a speed-up measured from ``pairs`` paired ratios per size scattering ``log_sd``."""
    within = log_sd / math.sqrt(pairs) if log_sd is not None and pairs > 0 else None
    sigma = max(COMPILE_BETWEEN_CHILDREN, within or 0.0)
    own = (
        f"; this child's {pairs} pairs per size scatter {log_sd:.1%} (standard error {within:.1%})"
        if within is not None and log_sd is not None
        else ""
    )
    return (
        "compile",
        weight * sigma,
        f"the measured speed-up {speedup:.2f}×: two probe children of one group differ by "
        f"σ ≈ {COMPILE_BETWEEN_CHILDREN:.0%} (gpt-tiny){own}",
    )


def delta_term(sigma: float) -> tuple[str, float, str]:
    """The ``delta`` part: a same-child delta added to a timed fit (the recompute of a
    checkpointing setting timed beside the plain step, the loss chunks' cost) is itself a
    difference of a few samples; ``sigma`` is its standard error over the step (module doc)."""
    return (
        "delta",
        sigma,
        "the recompute or loss-chunk cost timed beside the plain step: the standard error of "
        "its paired same-round differences",
    )


def source_term(kind: str) -> tuple[str, float, str]:
    """The part for what the profile did not measure: ``kind`` names it (see module doc)."""
    sources = {
        "derived_checkpointing": (
            DERIVED_CHECKPOINTING,
            "checkpointing time derived from the counted FLOPs ratio, not timed",
        ),
        "cpu_ddp": (
            CPU_RANKS_DDP,
            "ddp ranks scaled from the single-process fit, collectives modelled (tuning "
            "models' median |error| 6-9%)",
        ),
        "cpu_fsdp": (
            CPU_RANKS_FSDP,
            "fsdp ranks scaled from the single-process fit, collectives and FSDP2's CPU work "
            "modelled (tuning models' median |error| 6%, max 9.5%)",
        ),
        "gpu_collectives": (
            GPU_COLLECTIVES_MODELLED,
            "collectives from the α-β fits and their overlap modelled, not timed together",
        ),
        "compile_ranks": (
            COMPILE_ON_RANKS,
            "torch.compile's speed-up measured on one device, applied to a ddp/fsdp rank as is "
            "(not measured on a rank: assumed)",
        ),
        "what_if": (
            WHAT_IF_PUBLISHED,
            "what-if estimate for hardware never measured: its RMS log error over 40 held-out "
            "published training runs (bf16, FSDP over 8-128 A100/H100s; 36 of 40 inside this "
            "interval; benchmarks/results/whatif_published.md)",
        ),
        "what_if_fp32": (
            WHAT_IF_FP32,
            "what-if estimate in fp32, which no published run used: our one GPU run's fp32 "
            "steps (an H200, gpt-small) read it +36% to +39% slow, RMS log error 0.32 "
            "(benchmarks/results/whatif_measured.md); a bf16 plan is the validated one",
        ),
    }
    sigma, source = sources[kind]
    return ("source", sigma, source)


def interval_overlaps(
    interval: Sequence[float] | None, best: Sequence[float] | None
) -> bool | None:
    """Whether a candidate's tokens/s interval reaches the best one's (None if either is
    unknown): a candidate whose upper bound is at or above the best's lower bound may measure
    faster and is a contender to validate."""
    if interval is None or best is None:
        return None
    return interval[1] >= best[0]
