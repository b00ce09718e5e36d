"""advisor.validation's routing and repeated visits of close contenders (scripted validators,
no torch: what is measured is the decision logic, not a device)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from advisor.recommending import recommend
from advisor.validation import (
    TIE_MARGIN,
    busy_visits,
    contenders,
    merge_measurements,
    route,
    suspects,
    validate_rounds,
)
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement
from strategies.space import Candidate, SearchRequest
from strategies.uncertainty import Uncertainty, drift_term
from tests.reports.runs import FakeValidator
from tests.strategies.profiles import MB, hand_profile

TOKENS = 1000  # tokens per step of every scripted config


def config(micro_batch_size: int, parallelism: str = "single") -> TrainConfig:
    world = 1 if parallelism == "single" else 2
    return TrainConfig(
        model="gpt-tiny",
        seq_len=8,
        global_batch_size=8,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=8 // (micro_batch_size * world),
        parallelism=parallelism,
        world_size=world,
    )


def ok(step_s: float, samples: Sequence[float] | None = None, peak: int = 100) -> Measurement:
    samples = tuple(samples) if samples is not None else (step_s,) * 3
    step = statistics.median(samples)
    return Measurement(
        status="ok",
        step_time_s=step,
        tokens_per_s=TOKENS / step,
        peak_memory_bytes=peak,
        step_samples_s=samples,
        wall_s=1.0,
    )


def oom() -> Measurement:
    return Measurement(status="oom", reason="out of memory", wall_s=1.0)


def prediction() -> Prediction:
    return Prediction(
        peak_memory_bytes=1, budgeted_bytes=1, budget_bytes=2, step_time_s=0.1, tokens_per_s=1.0
    )


@dataclass
class Scripted:
    """A validator whose n-th visit of a config (by micro-batch size) returns script[mb][n]."""

    script: dict[int, list[Measurement]]
    kind: str = "single"
    name: str = "scripted"
    calls: list[list[int]] = field(default_factory=list)

    def unsupported_reason(self, config: TrainConfig) -> str | None:
        return None if config.parallelism == self.kind else f"not {self.kind}"

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]:
        self.calls.append([c.micro_batch_size for c in configs])
        return [self.script[c.micro_batch_size].pop(0) for c in configs]


def test_merge_pools_samples_keeps_the_largest_peak_and_counts_visits() -> None:
    merged = merge_measurements(ok(0.1, (0.1, 0.1, 0.1)), ok(0.2, (0.2, 0.2, 0.2), peak=300))
    assert merged.step_samples_s == (0.1, 0.1, 0.1, 0.2, 0.2, 0.2)
    assert merged.step_time_s == pytest.approx(0.15)
    assert merged.tokens_per_s == pytest.approx(TOKENS / 0.15)
    assert merged.peak_memory_bytes == 300
    assert merged.visits == 2
    assert merged.wall_s == pytest.approx(2.0)
    assert merge_measurements(merged, ok(0.1)).visits == 3


def test_merge_keeps_the_busiest_host_share_of_the_visits() -> None:
    quiet = dataclasses.replace(ok(0.1), host_others_share=0.05)
    busy = dataclasses.replace(ok(0.2), host_others_share=0.6)
    assert merge_measurements(quiet, busy).host_others_share == 0.6
    assert merge_measurements(busy, ok(0.1)).host_others_share == 0.6
    assert merge_measurements(ok(0.1), ok(0.1)).host_others_share is None
    failed = Measurement(status="oom", reason="out of memory")
    assert merge_measurements(busy, failed).host_others_share == 0.6


def test_a_failed_visit_fails_the_config_and_says_which_visit() -> None:
    failed = Measurement(status="oom", reason="out of memory", wall_s=1.0)
    merged = merge_measurements(ok(0.1), failed)
    assert merged.status == "oom"
    assert not merged.ok
    assert merged.reason == "visit 2: out of memory (earlier visits measured 10,000 tok/s)"
    assert merge_measurements(failed, ok(0.1)).status == "oom"


def test_contenders_are_the_configs_within_the_margin_fastest_first() -> None:
    failed = Measurement(status="error", reason="x")
    measured = [ok(0.105), ok(0.1), ok(0.2), failed, ok(0.1 / (1 - TIE_MARGIN) - 1e-9)]
    assert contenders(measured) == [1, 0, 4]
    assert contenders([failed]) == []
    assert contenders(measured, margin=0.0) == [1]


def test_a_config_fast_on_one_visit_only_loses_to_a_steady_one() -> None:
    """mb 8 is fastest on its first visit (a quiet moment) but slower on the next two; mb 4 is
    steady. Pooled over three visits mb 4 is the faster; mb 2, clearly slower, is visited once."""
    local = Scripted(
        {
            8: [ok(0.095), ok(0.115), ok(0.12)],
            4: [ok(0.1), ok(0.1), ok(0.1)],
            2: [ok(0.2)],
        }
    )
    configs = [config(8), config(4), config(2)]
    results = validate_rounds(configs, [prediction()] * 3, [local], rounds=3)
    assert [m.visits for m in results] == [3, 3, 1]
    best = max(range(3), key=lambda i: results[i].tokens_per_s or 0.0)
    assert configs[best].micro_batch_size == 4
    assert results[0].step_time_s == pytest.approx(0.115)
    # each round in the reverse order of the one before
    assert local.calls == [[8, 4, 2], [4, 8], [8, 4]]


def test_a_visit_on_a_busy_host_is_measured_again() -> None:
    """Session 12's case: the best config read 4x slow while others took the host; its second
    visit, quiet, puts it back in front. A busy visit that stays busy is retried while rounds
    are left; a quiet slow one is not (nothing doubts it)."""

    def busy(step_s: float) -> Measurement:
        return dataclasses.replace(ok(step_s), host_others_share=0.6)

    local = Scripted(
        {
            8: [busy(0.4), ok(0.1), ok(0.1)],
            4: [ok(0.13), ok(0.13), ok(0.13)],
            2: [ok(0.3)],
        }
    )
    configs = [config(8), config(4), config(2)]
    results = validate_rounds(configs, [prediction()] * 3, [local], rounds=3)
    assert local.calls == [[8, 4, 2], [4, 8], [8, 4]]
    best = max(range(3), key=lambda i: results[i].tokens_per_s or 0.0)
    assert configs[best].micro_batch_size == 8
    assert results[0].host_others_share == 0.6  # the plan still says one visit was busy
    stays = Scripted({8: [busy(0.4), busy(0.4), busy(0.4)], 4: [ok(0.1)] * 3})
    results = validate_rounds([config(8), config(4)], [prediction()] * 2, [stays], rounds=3)
    assert [m.visits for m in results] == [3, 3]
    assert busy_visits([busy(0.4), ok(0.1), oom()]) == [0]
    assert busy_visits([dataclasses.replace(ok(0.1), host_others_share=0.1)]) == []


def test_rounds_alternate_the_validators_order() -> None:
    """Single-device and distributed contenders: the validator measured second in one round is
    measured first in the next."""
    order: list[str] = []

    class Logged(Scripted):
        def validate(
            self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
        ) -> list[Measurement]:
            order.append(self.kind)
            return super().validate(configs, predictions)

    local = Logged({8: [ok(0.1)] * 3}, kind="single")
    launcher = Logged({4: [ok(0.101)] * 3}, kind="ddp")
    validate_rounds([config(8), config(4, "ddp")], [prediction()] * 2, [local, launcher])
    assert order == ["single", "ddp", "ddp", "single", "single", "ddp"]


def test_one_clear_winner_is_not_measured_again() -> None:
    local = Scripted({8: [ok(0.1)], 4: [ok(0.2)]})
    results = validate_rounds([config(8), config(4)], [prediction()] * 2, [local], rounds=3)
    assert local.calls == [[8, 4]]
    assert [m.visits for m in results] == [1, 1]


def test_one_round_visits_each_config_once() -> None:
    local = Scripted({8: [ok(0.1)], 4: [ok(0.1)]})
    results = validate_rounds([config(8), config(4)], [prediction()] * 2, [local], rounds=1)
    assert local.calls == [[8, 4]]
    assert all(m.visits == 1 for m in results)
    with pytest.raises(ValueError, match="at least 1"):
        validate_rounds([config(8)], [prediction()], [local], rounds=0)


def test_a_config_failing_on_a_later_visit_drops_out() -> None:
    oom = Measurement(status="oom", reason="out of memory")
    local = Scripted({8: [ok(0.09), oom], 4: [ok(0.1), ok(0.1), ok(0.1)]})
    results = validate_rounds([config(8), config(4)], [prediction()] * 2, [local], rounds=3)
    assert results[0].status == "oom"
    assert results[0].reason.startswith("visit 2: out of memory")
    # the round after the failure has a single contender left: nothing more is measured
    assert local.calls == [[8, 4], [4, 8]]
    assert results[1].visits == 2


def test_route_records_why_no_validator_took_a_config() -> None:
    local = Scripted({8: [ok(0.1)]})
    results = route([config(8), config(4, "fsdp")], [prediction()] * 2, [local])
    assert results[0].ok
    assert results[1].status == "not_validated"
    assert results[1].reason == "not single"


def predicted(step_s: float, sigma: float = 0.06) -> Prediction:
    """A prediction of ``step_s`` with a 90% interval of exp(±1.645·sigma) (±10% at 0.06)."""
    return dataclasses.replace(
        prediction(),
        step_time_s=step_s,
        tokens_per_s=TOKENS / step_s,
        uncertainty=Uncertainty(terms=(("host", sigma, "test"),)),
    )


def test_one_slow_visit_does_not_rule_out_the_predicted_best() -> None:
    """mb 8 is predicted fastest (10,000 tok/s, interval 9,057-11,041) but its first visit runs
    at half speed (a busy neighbour); mb 4 is steady at 9,524. One visit would drop mb 8: it
    is outside 15% of mb 4 and below its own interval. Visited again it runs as predicted; the
    two visits pooled still sit outside the margin, so its normal latest visit keeps it for a
    third, and three visits pooled make it the faster."""
    local = Scripted({8: [ok(0.2), ok(0.1), ok(0.1)], 4: [ok(0.105)] * 3})
    results = validate_rounds(
        [config(8), config(4)], [predicted(0.1), predicted(0.105)], [local], rounds=3
    )
    assert suspects([ok(0.2), ok(0.105)], [predicted(0.1), predicted(0.105)]) == [0]
    assert local.calls == [[8, 4], [4, 8], [8, 4]]
    assert [m.visits for m in results] == [3, 3]
    assert results[0].step_time_s == pytest.approx(0.1)
    assert (results[0].tokens_per_s or 0.0) > (results[1].tokens_per_s or 0.0)


def test_a_slow_visit_confirmed_by_the_next_drops_out() -> None:
    """The second visit is slow too: the prediction was wrong, not the moment; no third."""
    local = Scripted({8: [ok(0.2), ok(0.2)], 4: [ok(0.105)] * 3})
    results = validate_rounds(
        [config(8), config(4)], [predicted(0.1), predicted(0.105)], [local], rounds=3
    )
    assert local.calls == [[8, 4], [4, 8]]
    assert [m.visits for m in results] == [2, 2]


@pytest.mark.parametrize(
    ("first", "prediction_", "why"),
    [
        (ok(0.2), predicted(0.2), "as predicted: slow, inside its interval"),
        (ok(0.2), predicted(0.15), "its interval's best (7,358) is outside the band (8,095)"),
        (ok(0.2), prediction(), "no interval: no doubt"),
        (Measurement(status="oom", reason="x"), predicted(0.1), "a failed visit is not doubted"),
    ],
)
def test_what_raises_no_doubt(first: Measurement, prediction_: Prediction, why: str) -> None:
    steady = ok(0.105)
    assert suspects([first, steady], [prediction_, predicted(0.105)]) == [], why


def test_the_hosts_drift_since_the_profile_does_not_excuse_one_slow_visit() -> None:
    """mb 8's stated interval counts the host's drift since the profile (σ 0.13 beside its
    own 0.06: down to 7,902 tok/s); its first visit at 8,000 lies inside it, and outside 15% of
    mb 4's 9,524 (8,095). But that drift would move mb 4, measured in the same validation,
    alike: judged by its own parts only (down to 9,057) the visit is doubted, as without the
    drift."""
    drifting = dataclasses.replace(
        predicted(0.1),
        uncertainty=Uncertainty(terms=(("host", 0.06, "test"), drift_term())),
    )
    assert drifting.tokens_per_s_interval is not None
    assert drifting.tokens_per_s_interval[0] == pytest.approx(7_902, abs=1)
    assert suspects([ok(0.125), ok(0.105)], [drifting, predicted(0.105)]) == [0]


def test_a_config_visited_more_than_once_is_judged_by_the_pool() -> None:
    twice = merge_measurements(ok(0.2), ok(0.2))
    assert suspects([twice, ok(0.105)], [predicted(0.1), predicted(0.105)]) == []


def test_a_failed_first_visit_is_replaced_and_the_replacement_measured() -> None:
    """mb 8 runs out of memory; the callback names mb 2 in its place, which is measured (its
    result after the given configs'), and the rounds then compare it with mb 4 as usual."""
    local = Scripted({8: [oom()], 4: [ok(0.105)] * 3, 2: [ok(0.1)] * 3})
    asked: list[tuple[int, str]] = []

    def replace(i: int, m: Measurement) -> tuple[TrainConfig, Prediction] | None:
        asked.append((i, m.status))
        return config(2), predicted(0.1)

    results = validate_rounds(
        [config(8), config(4)], [predicted(0.1), predicted(0.105)], [local], replace=replace
    )
    assert asked == [(0, "oom")]
    assert [m.status for m in results] == ["oom", "ok", "ok"]
    assert local.calls[:2] == [[8, 4], [2]]
    assert results[2].visits == 3 and results[1].visits == 3  # within 15%: both again


def test_a_failing_replacement_is_replaced_until_none_is_left() -> None:
    local = Scripted({8: [oom()], 4: [oom()], 2: [ok(0.1)], 1: [ok(0.2)]})
    names = iter([config(4), config(2)])

    def replace(i: int, m: Measurement) -> tuple[TrainConfig, Prediction] | None:
        nxt = next(names, None)
        return None if nxt is None else (nxt, predicted(0.1))

    results = validate_rounds(
        [config(8), config(1)], [predicted(0.1), predicted(0.2)], [local], replace=replace
    )
    assert [m.status for m in results] == ["oom", "ok", "oom", "ok"]
    assert local.calls[:3] == [[8, 1], [4], [2]]


def test_what_is_not_replaced() -> None:
    """A config no validator takes would be refused alike; without a callback nothing is."""
    local = Scripted({8: [oom()], 4: [ok(0.1)]})
    refused = config(2, "ddp")

    def replace(i: int, m: Measurement) -> tuple[TrainConfig, Prediction] | None:
        raise AssertionError(f"asked to replace {i} ({m.status})")

    results = validate_rounds([refused], [predicted(0.1)], [local], replace=replace, rounds=1)
    assert [m.status for m in results] == ["not_validated"]
    assert [
        m.status for m in validate_rounds([config(8), config(4)], [predicted(0.1)] * 2, [local])
    ] == [
        "oom",
        "ok",
    ]


def test_recommend_measures_the_next_ranked_configs_when_finalists_run_out_of_memory(
    tmp_path: Path,
) -> None:
    """Every config predicted to need more than 100 MB runs out of memory (its memory
    prediction was short). The predicted best (128 MB) fails; in its place the next ranked
    config needing less (blocks:1, 110 MB), which fails too, then the next needing less than
    that (micro-batch 4 x 4, 60 MB), which runs: two replacements, top_k's worth. The baseline
    (116 MB) is measured as it is and not replaced."""
    profile = hand_profile(memory_bytes=160 * MB, fixed_bytes=20 * MB)
    request = SearchRequest(global_batch_size=16, memory_budget=0.9)

    class Tight(FakeValidator):
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def validate(
            self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
        ) -> list[Measurement]:
            self.calls.append([Candidate.from_config(c).key for c in configs])
            return super().validate(configs, predictions)

        def measure(self, config: TrainConfig, p: Prediction) -> Measurement:
            if p.budgeted_bytes > 100 * MB:
                return Measurement(status="oom", reason="scripted: out of memory")
            return super().measure(config, p)

    validator = Tight()
    plan = recommend(profile, request, validate_top_k=2, validators=[validator], out=tmp_path)
    best, second = "bf16/none/single1/mb16xga1/nw0", "bf16/none/single1/mb8xga2/nw0"
    baseline = "fp32/none/single1/mb8xga2/nw0"
    blocks, small = "bf16/blocks:1/single1/mb16xga1/nw0", "bf16/none/single1/mb4xga4/nw0"
    assert validator.calls[:3] == [[best, second, baseline], [blocks], [small]]
    status = {v.candidate.key: v.measured.status for v in plan.validated}
    assert status == {best: "oom", second: "ok", baseline: "oom", blocks: "oom", small: "ok"}
    assert plan.config.micro_batch_size == 8 and plan.measured is not None
    assert validator.calls[3:] == [[small, second], [second, small]]  # the close pair again
