"""Golden plans: fixed hand-made profiles give byte-identical plan.json, trials.csv and
``advisor predict`` output.

A guard for refactors that must not change behaviour: the cost model, the search, validation's
rounds and the decision run end to end through :func:`advisor.recommending.recommend` on profiles
built from round numbers (tests/strategies/profiles.py), with a scripted validator whose
measurements are a fixed function of the prediction. Only what differs from run to run by
nature is normalised: the search's wall time and the temporary storage path.

The enumeration draws its chunks from ``random.SystemRandom`` (so that two workers on one study
pick different candidates); here it is seeded, which fixes the trial numbers too.

A change that is MEANT to alter plans regenerates the files with ``ADVISOR_UPDATE_GOLDEN=1
python -m pytest tests/advisor/test_golden_plan.py`` and says why in its commit message.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from advisor.recommending import predict, recommend
from profilers.profile_record import InputSample, Profile
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement
from strategies.space import SearchRequest
from tests.reports.runs import FakeValidator
from tests.strategies.profiles import MB, SEQ_LEN, GiB, hand_profile, time_model

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
UPDATE = os.environ.get("ADVISOR_UPDATE_GOLDEN") == "1"


class ScriptedValidator(FakeValidator):
    """Measures every config as a fixed function of its prediction: some measure faster than
    predicted, some slower, one fails, so the decision's rules all take part."""

    name = "scripted"

    def measure(self, config: TrainConfig, prediction: Prediction) -> Measurement:
        if config.parallelism == "fsdp":
            return Measurement(status="oom", reason="scripted: out of memory")
        factor = (
            1.0
            + 0.07 * (config.micro_batch_size % 3)
            - 0.05 * (config.activation_checkpointing == "full")
        )
        step = prediction.step_time_s * factor
        return Measurement(
            status="ok",
            step_time_s=step,
            tokens_per_s=config.tokens_per_step / step,
            peak_memory_bytes=int((prediction.traced_bytes or 0) * 1.02),
            memory_kind="scripted",
            step_samples_s=(step * 0.98, step, step * 1.03),
            device="cpu",
            validator=self.name,
            wall_s=1.5,
        )


def _cpu_profile() -> Profile:
    return hand_profile(
        memory_bytes=160 * MB,
        fixed_bytes=20 * MB,
        parallel_bytes={"ddp": 3 * MB, "fsdp": 5 * MB},
        extra_time=(
            time_model("fp32", "none", split=(2, 1, 1.6)),
            time_model("bf16", "full", split=(2, 1, 1.5)),
        ),
    )


def _gpu_profile() -> Profile:
    return hand_profile(
        kind="cuda",
        memory_bytes=80 * GiB,
        comm_world_sizes=(2, 4, 8),
        fragmentation=0.05,
        fixed_bytes=600 * MB,
        timed_checkpointing=("none",),
        inputs=tuple(
            InputSample(
                num_workers=w,
                micro_batch_size=8,
                seq_len=SEQ_LEN,
                batches_per_s=rate,
            )
            for w, rate in ((0, 400.0), (2, 1500.0))
        ),
    )


# name -> (profile, request, validate?)
SCENARIOS: dict[str, tuple[Any, SearchRequest, bool]] = {
    "cpu-validated": (
        _cpu_profile,
        SearchRequest(global_batch_size=16, world_size=2, memory_budget=0.9),
        True,
    ),
    "gpu-unvalidated": (
        _gpu_profile,
        SearchRequest(global_batch_size=64, trials=32, config_overrides={"lr": 3e-4, "seed": 7}),
        False,
    ),
    "whatif-h100": (
        _cpu_profile,
        SearchRequest(global_batch_size=512, world_size=16, target="h100-80gb", nodes=2),
        False,
    ),
}


def _config(micro: int, accum: int, world: int, **knobs: Any) -> TrainConfig:
    """The hand profile's workload with these knobs (global batch = micro x accum x world)."""
    return TrainConfig(
        model="gpt-tiny",
        seq_len=SEQ_LEN,
        global_batch_size=micro * accum * world,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        world_size=world,
        **knobs,
    )


PREDICTIONS: dict[str, tuple[Any, TrainConfig, dict[str, Any]]] = {
    "cpu-ddp-accum": (_cpu_profile, _config(2, 4, 2, parallelism="ddp"), {}),
    "gpu-fsdp-full": (
        _gpu_profile,
        _config(8, 2, 4, precision="bf16", activation_checkpointing="full", parallelism="fsdp"),
        {"memory_budget": 0.8},
    ),
    "whatif-fsdp": (
        _cpu_profile,
        _config(4, 8, 8, precision="bf16", parallelism="fsdp"),
        {"target": "a100-80gb"},
    ),
}


def _normalised_plan(text: str) -> str:
    data = json.loads(text)
    data["search"]["wall_s"] = "WALL"
    data["search"]["storage"] = "STORAGE"
    return json.dumps(data, indent=1) + "\n"


def _check(path: Path, text: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"no golden file {path}: run with ADVISOR_UPDATE_GOLDEN=1 once"
    expected = path.read_text()
    assert text == expected, f"{path.name} differs from {path}"


@pytest.fixture
def seeded_enumeration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("strategies.search.random.SystemRandom", lambda: random.Random(0))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.usefixtures("seeded_enumeration")
def test_plan_and_trials_are_byte_identical(name: str, tmp_path: Path) -> None:
    make_profile, request, validate = SCENARIOS[name]
    recommend(
        make_profile(),
        request,
        validate_top_k=3 if validate else 0,
        out=tmp_path,
        validators=[ScriptedValidator()] if validate else [],
    )
    _check(GOLDEN / name / "plan.json", _normalised_plan((tmp_path / "plan.json").read_text()))
    _check(GOLDEN / name / "trials.csv", (tmp_path / "trials.csv").read_text())


@pytest.mark.parametrize("name", sorted(PREDICTIONS))
def test_predict_output_is_byte_identical(name: str) -> None:
    make_profile, config, options = PREDICTIONS[name]
    result = predict(make_profile(), config, **options)
    _check(GOLDEN / "predict" / f"{name}.json", json.dumps(result, indent=1) + "\n")


def test_the_validated_scenario_exercises_every_rule() -> None:
    """The golden plan is only a guard if it covers the decision's branches."""
    plan = json.loads((GOLDEN / "cpu-validated" / "plan.json").read_text())
    statuses = {v["measured"]["status"] for v in plan["validated"]}
    assert statuses == {"ok", "oom"}
    assert any(v["measured"]["visits"] > 1 for v in plan["validated"])
    layouts = {v["candidate"]["parallelism"] for v in plan["validated"]}
    assert {"single", "ddp"} <= layouts
    assert plan["baseline"]["measured"]
    trials = (GOLDEN / "cpu-validated" / "trials.csv").read_text()
    assert ",False," in trials  # some candidates are over the budget
