"""benchmarks/fsdp_one_rank.py: an FSDP rank priced from one traced micro-batch size, on the
committed Qwen3.5-9B profile, against the rank's own fit from its three traced sizes."""

from __future__ import annotations

import pytest

from benchmarks.fsdp_one_rank import PROFILE, measure, of_group, without_rank_group


def test_the_group_is_removed_but_for_the_kept_trace() -> None:
    from profilers.profile_record import load_profile

    profile = load_profile(PROFILE)
    one = without_rank_group(profile, "none", 4)
    kept = [t.spec.micro_batch_size for t in one.memory if of_group(t.spec, "none")]
    assert kept == [4]
    assert not [m for m in one.fits.memory if of_group(m, "none")]


def test_one_trace_never_reads_under_the_ranks_own_fit_and_is_exact_at_its_size() -> None:
    rows = measure()
    assert {r["micro_batch_size"] for r in rows} == {1, 2, 4, 8}
    for r in rows:
        for b in r["traced_sizes"]:
            one = r[f"one_trace_b{b}_gib"]
            assert one >= r["fit_gib"] * (1 - 1e-9)
            if b == r["micro_batch_size"]:
                assert one == pytest.approx(r["fit_gib"], rel=1e-6)
        assert r["analytic_gib"] >= r["fit_gib"]
