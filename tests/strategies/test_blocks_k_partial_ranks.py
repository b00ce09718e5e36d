"""``blocks:K`` memory when the profile lacks per-rank traces of its anchors, on hand-made
profiles: a short profile (``--budget-s 40``) of a Llama-3-8B shape kept none's and full's
single-device fits (with their windows) and no FSDP rank at all, and the what-if priced
``blocks:1`` above ``none`` (bf16 116.1 against 102.3 GiB a rank; fp32 1,631.8 against 441.6)
and ``blocks:31`` well above ``full``. A ``blocks:K`` peak lies between full's and none's for
the same precision, layout and micro-batch, and does not grow with K.
"""

from __future__ import annotations

import dataclasses

import pytest

from profilers.checkpointing_fits import lerp_fit
from profilers.fit import AffineFit
from profilers.memory_model import MemoryModel
from profilers.profile_record import Profile
from strategies.cost import CostModel, cost_model_from_profile
from strategies.space import Candidate
from tests.strategies.profiles import (
    ADAM_BYTES,
    GRAD_BYTES,
    MB,
    PARAM_BYTES,
    hand_profile,
    line,
    memory_model,
)

MiB = 2**20
STATE = PARAM_BYTES + ADAM_BYTES
SETTINGS = ("none", "blocks:1", "blocks:2", "blocks:3", "full")  # 4 blocks


def cand(setting: str, *, precision: str = "fp32", micro: int = 1, world: int = 8) -> Candidate:
    return Candidate(
        precision=precision,
        activation_checkpointing=setting,
        parallelism="fsdp" if world > 1 else "single",
        world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=1,
    )


def with_memory(profile: Profile, *models: MemoryModel) -> CostModel:
    fits = dataclasses.replace(profile.fits, memory=tuple(models))
    return cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)


def traced(model: CostModel, c: Candidate) -> tuple[float, tuple[str, ...]]:
    prediction = model.predict(c)
    assert prediction.breakdown.memory is not None
    return prediction.breakdown.memory.traced_bytes, prediction.breakdown.assumptions


def assert_between_and_monotone(peaks: dict[str, float]) -> None:
    values = [peaks[s] for s in SETTINGS]
    assert values == sorted(values, reverse=True), peaks  # non-increasing in K
    assert peaks["full"] <= min(values) and max(values) <= peaks["none"]


def windowed(precision: str, setting: str) -> MemoryModel:
    """A single-device fit whose whole peak is window B's (every gradient live at the end of
    backward), as a 16-bit or fp32 step of a large model at a long sequence is: the windows
    leave the gradients out of a rank's activations, the whole peak does not."""
    a_slope, b_slope = (1.5 * MiB, 1 * MiB) if setting == "none" else (0.4 * MiB, 0.1 * MiB)
    whole = line(STATE + GRAD_BYTES, b_slope)
    windows = (("A", line(STATE, a_slope)), ("B", whole))
    return dataclasses.replace(
        memory_model(precision, setting), forward_backward=whole, windows=windows
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("micro", [1, 4])
def test_fsdp_blocks_k_without_rank_traces_lies_between_the_anchors(
    precision: str, micro: int
) -> None:
    """No per-rank trace at all: each anchor's rank activations come from its windows, and
    blocks:K's from the line in K between those (its derived fit keeps no windows: its whole
    peak less the state counted every gradient, which a rank holds 1/8 of)."""
    profile = hand_profile(kind="cuda")
    model = with_memory(
        profile, *(windowed(p, s) for p in ("fp32", "bf16") for s in ("none", "full"))
    )
    peaks = {s: traced(model, cand(s, precision=precision, micro=micro))[0] for s in SETTINGS}
    assert_between_and_monotone(peaks)

    def activations(setting: str) -> float:
        c = cand(setting, precision=precision, micro=micro)
        memory = model.predict(c).breakdown.to_dict()["memory"]["fsdp"]
        return float(memory["activation_bytes"])

    at = {s: activations(s) for s in SETTINGS}
    for k in (1, 2, 3):
        expected = at["none"] + k / 4 * (at["full"] - at["none"])
        assert at[f"blocks:{k}"] == pytest.approx(expected, abs=2)


def test_a_floor_from_windows_is_interpolated_at_micro_batch_1() -> None:
    """full traced at 4 and 8 and floored at what its windows give micro-batch 1, none a plain
    line through 4 and 8: the line in K's floor reads none at 1, where full's floor stands,
    not at 4 (fp32 blocks:1 of the Llama-3-8B shape: 1,512 GiB at 1 against none's 458)."""
    none = line(STATE, 10 * MiB, xs=(4.0, 8.0))
    full = dataclasses.replace(
        line(STATE, 1 * MiB, xs=(4.0, 8.0)), floor=STATE + GRAD_BYTES + 2 * MiB
    )
    mid = lerp_fit(none, full, 0.25)
    assert mid.floor == pytest.approx(0.75 * none.predict(1) + 0.25 * full.predict(1))
    assert full.predict(1) <= mid.predict(1) <= none.predict(1)
    # A hinged fit's floor is its smallest traced size's peak: read there, as before.
    ys = (STATE, STATE + 4 * MiB, STATE + 8 * MiB)
    hinged = AffineFit(intercept=STATE, slope=MiB, xs=(2.0, 4.0, 8.0), ys=ys, floor=STATE)
    assert lerp_fit(none, hinged, 0.5).floor == pytest.approx((none.predict(2) + STATE) / 2)

    profile = hand_profile(kind="cuda")
    fits = []
    for p in ("fp32", "bf16"):
        for setting, fit in (("none", none), ("full", full)):
            fits.append(dataclasses.replace(memory_model(p, setting), forward_backward=fit))
    model = with_memory(profile, *fits)
    for micro in (1, 2, 4):
        peaks = {s: traced(model, cand(s, micro=micro, world=1))[0] for s in SETTINGS}
        assert_between_and_monotone(peaks)


def test_a_formula_blocks_k_is_held_below_a_traced_none_rank_and_says_so() -> None:
    """The profile traced the none rank (fsdp×2) but not full's: blocks:K has no rank line and
    is priced by the formula from one device, which reads above none's traced rank for small
    K. It is held at none's, and the assumptions say so; never below full's."""
    profile = hand_profile()
    rank_none = dataclasses.replace(
        memory_model("fp32", "none"),
        parallelism="fsdp",
        world_size=2,
        forward_backward=line(6 * MB, 6 * MB),
    )
    model = with_memory(profile, *profile.fits.memory, rank_none)
    c = {s: cand(s, micro=4, world=2) for s in SETTINGS}
    peaks = {s: traced(model, c[s])[0] for s in SETTINGS}
    assert peaks["none"] == pytest.approx(30 * MB, abs=2)  # the traced rank
    assert_between_and_monotone(peaks)
    # Held at none's, then on the line in K from the traced none to full (one block's
    # recompute, 3/4 of a block at K=1, above it).
    per_block = (peaks["none"] - peaks["full"]) / 4
    assert peaks["blocks:1"] == pytest.approx(peaks["none"] - per_block + 0.75 * per_block, abs=2)
    notes = traced(model, c["blocks:1"])[1]
    assert any("above the line in K between full's and none's ranks (none from" in n for n in notes)
    memory = model.predict(c["blocks:1"]).breakdown.to_dict()["memory"]
    fsdp = memory["fsdp"]
    parts = sum(
        fsdp[k]
        for k in (
            "sharded_state_bytes",
            "gathered_units_bytes",
            "reduce_scatter_buffer_bytes",
            "activation_bytes",
        )
    )
    assert parts == pytest.approx(memory["traced_bytes"], abs=2)


def test_a_formula_blocks_k_far_above_a_traced_full_rank_is_taken_on_the_line_from_it() -> None:
    """The profile traced full's rank (fsdp×2) but not none's, and the formula from one device
    reads every blocks:K well above full's trace (a 70B Llama over 64 GPUs: full traced 60.7
    GiB a rank, blocks:79 of 80 blocks 100.2 by the formula). Identical blocks: blocks:K holds
    full's rank plus (L - K) blocks' activations and one block's recompute, so it is priced
    on the line in K from the traced full to none, plus that recompute; a formula already
    below the line is kept."""
    profile = hand_profile()
    rank_full = dataclasses.replace(
        memory_model("fp32", "full"),
        parallelism="fsdp",
        world_size=2,
        forward_backward=line(2 * MB, 1 * MB),
        optimizer_step=line(4 * MB, 1000.0),
    )
    model = with_memory(profile, *profile.fits.memory, rank_full)
    c = {s: cand(s, micro=4, world=2) for s in SETTINGS}
    peaks = {s: traced(model, c[s])[0] for s in SETTINGS}
    assert peaks["full"] == pytest.approx(6 * MB, abs=2)  # the traced rank
    assert_between_and_monotone(peaks)
    per_block = (peaks["none"] - peaks["full"]) / 4
    for k in (2, 3):
        on_line = peaks["none"] - k * per_block + (1 - k / 4) * per_block
        assert peaks[f"blocks:{k}"] == pytest.approx(on_line, abs=2)
        notes = traced(model, c[f"blocks:{k}"])[1]
        assert any("(full from the profile's rank traces)" in n for n in notes), notes
    # Without the traced full, the same formula is kept (both ends from one source).
    formula = with_memory(profile, *profile.fits.memory)
    assert traced(formula, c["blocks:3"])[0] > peaks["blocks:3"] + 5 * MB
