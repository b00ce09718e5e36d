"""torch.compile in the trainer (``compile``): the plan key and flag, the losses of compiled steps
against eager ones, and the one line a user gets when compile cannot run or fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result

from advisor.cli import main
from advisor.trainer import compile as compiling
from advisor.workload import AdvisorWorkload
from profilers.workload import StepSpec
from strategies.config import ConfigError, TrainConfig, load_plan_config

# Inductor fuses and reorders fp32 reductions, so a compiled step is not bit-identical to the
# eager one: measured here 1e-7 relative on gpt-tiny's loss (5.57 ± 9.5e-7 over 3 steps); the
# tolerance leaves two orders of magnitude for other CPUs' vector widths.
RELATIVE_TOLERANCE = 1e-5
TINY = {"n_layer": 1}


def test_old_plans_read_as_eager_and_the_key_round_trips(tmp_path: Path) -> None:
    old = TrainConfig().to_dict()
    del old["compile"]
    assert TrainConfig.from_dict(old).compile is False
    config = TrainConfig(compile=True)
    assert config.step_spec().compile is True
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"config": config.to_dict()}))
    assert load_plan_config(plan) == config


def test_compile_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="compile must be true or false"):
        TrainConfig(compile="yes")  # type: ignore[arg-type]


def losses(compile: bool, checkpointing: str = "none", steps: int = 3) -> list[float]:
    torch.manual_seed(0)  # the same initial weights compiled and eager
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=2,
        grad_accum_steps=2,
        activation_checkpointing=checkpointing,
        compile=compile,
    )
    step = AdvisorWorkload("gpt-tiny", TINY).build_step(spec, "cpu")
    generator = torch.Generator().manual_seed(1)
    return [float(step.step(step.synthetic_batches(generator))[0]) for _ in range(steps)]


@pytest.mark.parametrize("checkpointing", ["none", "ops"])
def test_compiled_losses_equal_eager_within_fp_tolerance(checkpointing: str) -> None:
    """Three optimizer steps with accumulation: the compiled block (and its checkpoint, the
    selective ``ops`` policy included) computes the eager losses, updates included."""
    eager = losses(False, checkpointing)
    compiled = losses(True, checkpointing)
    assert len(set(eager)) > 1  # the weights moved: later losses depend on earlier updates
    for e, c in zip(eager, compiled, strict=True):
        assert abs(c - e) <= RELATIVE_TOLERANCE * abs(e), (eager, compiled)


def test_blocks_are_compiled_in_place_keeping_state_dict_keys() -> None:
    workload = AdvisorWorkload("gpt-tiny", {"n_layer": 2})
    spec = StepSpec(seq_len=16, activation_checkpointing="full", compile=True)
    step = workload.build_step(spec, "cpu")
    eager = workload.build_step(StepSpec(seq_len=16, activation_checkpointing="full"), "cpu")
    blocks = step.adapter.blocks()
    assert len(blocks) == 2
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in blocks)
    assert step.model.state_dict().keys() == eager.model.state_dict().keys()


# -- failures: one line, exit 2 ----------------------------------------------------------------


# The smallest run: one block, one step of 2 x 16 tokens.
TRAIN = ("train", "--steps", "1", "--quiet", "--compile", "--model-arg", "n_layer=1")
SMALL = ("--seq-len", "16", "--global-batch-size", "2", "--micro-batch-size", "2")


def train(tmp_path: Path, *args: str) -> Result:
    out = ("--out", str(tmp_path / "run"))
    return CliRunner().invoke(main, [*TRAIN, *SMALL, *out, *args], prog_name="advisor")


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_no_cpp_compiler_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, clang++ or c++ there
    monkeypatch.delenv("CXX", raising=False)
    assert "C++ compiler" in compiling.compile_unavailable("cpu")
    line = one_line_error(train(tmp_path))
    assert line.startswith("error: --compile is unavailable: torch.compile on CPU needs a C++")
    assert line.endswith("or use --no-compile")


def test_available_with_a_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "my-cxx"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CXX", "my-cxx")
    assert compiling.compile_unavailable("cpu") == ""


def _failing_backend(gm: Any, example_inputs: Any) -> Any:
    raise RuntimeError("this backend cannot lower the graph")


def test_a_compile_failure_is_one_line_naming_no_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def apply_failing(adapter: Any) -> None:
        for block in adapter.blocks():
            block.compile(backend=_failing_backend)

    monkeypatch.setattr(compiling, "apply_compile", apply_failing)
    # --warmup-steps 0: a 1-step run with the default 20 is noted first (advisor.trainer.loop)
    line = one_line_error(train(tmp_path, "--warmup-steps", "0"))
    assert line.startswith("error: torch.compile failed on gpt-tiny (BackendCompilerFailed: ")
    assert line.endswith("): use --no-compile")


def test_compile_failure_is_recognised_through_its_causes() -> None:
    from torch._dynamo.exc import Unsupported

    try:
        try:
            raise Unsupported("data-dependent control flow")
        except Unsupported as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        assert compiling.compile_failure(outer) == "RuntimeError: step failed"
    assert compiling.compile_failure(ValueError("bad shape")) is None


# -- advisor predict --compile ----------------------------------------------------------------


def saved_profile(tmp_path: Path, *, measured: bool) -> Path:
    import dataclasses

    from profilers.compile_records import CompileMeasurement
    from tests.strategies.profiles import hand_profile

    records = (
        CompileMeasurement(
            precision="fp32",
            activation_checkpointing="none",
            status="ok",
            speedup=1.25,
            compile_s=30.0,
        ),
    )
    profile = dataclasses.replace(hand_profile(), compile=records if measured else ())
    profile.save(tmp_path)
    return tmp_path / "profile.json"


def predict(path: Path, *args: str) -> Result:
    base = ("predict", "--profile", str(path), "--global-batch-size", "8")
    return CliRunner().invoke(main, [*base, "--micro-batch-size", "8", *args], prog_name="advisor")


def test_predict_shows_the_per_step_and_the_amortised_time(tmp_path: Path) -> None:
    path = saved_profile(tmp_path, measured=True)
    eager = json.loads(predict(path).output)["predicted"]
    result = predict(path, "--compile", "--steps", "100")
    assert result.exit_code == 0, result.output
    compiled = json.loads(result.output)["predicted"]
    assert compiled["step_time_s"] < eager["step_time_s"]
    assert compiled["compile_s"] == 30.0 and compiled["run_steps"] == 100
    assert compiled["amortised_step_time_s"] == pytest.approx(compiled["step_time_s"] + 0.3)
    assert "amortised_step_time_s" not in eager


def test_predict_compile_without_a_measurement_says_why(tmp_path: Path) -> None:
    result = predict(saved_profile(tmp_path, measured=False), "--compile")
    assert one_line_error(result) == (
        "error: the profile did not measure torch.compile for fp32/none: re-run 'advisor "
        "profile' with a larger --budget-s (see its 'compile' probe rows), or use --no-compile"
    )
