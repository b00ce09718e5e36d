"""An FSDP rank the profile did not trace, beside a traced rank of the same setting but for the
loss in chunks (or fp16 for bf16): priced from that traced rank plus what one device's peak
differs by, not by the formula from one device, which reads high beside it. A 7B over 64 GPUs
(ops, micro-batch 4) showed the 2-chunk loss at 70.3 GiB a rank beside the plain loss's traced
65.9: a memory-saving knob priced as a cost (audit of 2026-12-07)."""

from __future__ import annotations

import dataclasses

import pytest

from strategies.cost import cost_model_from_profile
from strategies.space import Candidate
from tests.strategies.profiles import MB, hand_profile, line, memory_model, time_model


def cand(chunks: int, precision: str = "fp32") -> Candidate:
    return Candidate(
        precision=precision,
        activation_checkpointing="none",
        parallelism="fsdp",
        world_size=2,
        micro_batch_size=4,
        grad_accum_steps=1,
        loss_chunks=chunks,
    )


def test_the_chunked_loss_rank_is_the_traced_plain_rank_less_what_one_device_saves() -> None:
    profile = hand_profile(precisions=("fp32",))
    plain = memory_model("fp32", "none")
    chunked = dataclasses.replace(
        plain, loss_chunks=2, forward_backward=line(plain.forward_backward.intercept, 8 * MB)
    )
    rank = dataclasses.replace(
        plain, parallelism="fsdp", world_size=2, forward_backward=line(6 * MB, 6 * MB)
    )
    timed = (*profile.fits.time, dataclasses.replace(time_model("fp32", "none"), loss_chunks=2))
    fits = dataclasses.replace(
        profile.fits, memory=(*profile.fits.memory, chunked, rank), time=timed
    )
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)
    traced_plain = model.predict(cand(1)).breakdown.memory
    priced = model.predict(cand(2))
    memory = priced.breakdown.memory
    assert traced_plain is not None and memory is not None
    saved = plain.predict(4) - chunked.predict(4)  # 2 MB a sample at micro-batch 4
    assert saved == 8 * MB
    assert memory.traced_bytes == pytest.approx(traced_plain.traced_bytes - saved, abs=2)
    assert memory.traced_bytes < traced_plain.traced_bytes  # never priced as a cost
    assert any("the traced rank of the plain loss" in a for a in priced.breakdown.assumptions)
    # Without the traced plain rank, the formula from one device prices it, as before.
    bare = dataclasses.replace(fits, memory=(*profile.fits.memory, chunked))
    formula = cost_model_from_profile(dataclasses.replace(profile, fits=bare), 0.9)
    assert not any(
        "the traced rank of" in a for a in formula.predict(cand(2)).breakdown.assumptions
    )
