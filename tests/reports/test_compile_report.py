"""A compiled plan in the report: said in the config's words, with the per-step and the
amortised time side by side."""

from __future__ import annotations

from reports.summary import _compile_fact, plain_label


def test_a_compiled_config_is_named_and_an_old_plan_is_eager() -> None:
    config = {"precision": "fp32", "micro_batch_size": 8, "grad_accum_steps": 1}
    assert "compile" not in plain_label(config)  # a plan from before the key: eager
    assert plain_label({**config, "compile": True}).endswith(", each block torch.compile'd")


def test_the_compile_fact_shows_per_step_and_amortised_time() -> None:
    fact = _compile_fact(
        {
            "step_time_s": 0.06,
            "compile_s": 13.8,
            "run_steps": 300,
            "amortised_step_time_s": 0.106,
        }
    )
    assert fact.label == "torch.compile"
    assert fact.value == (
        "each repeated block: cold compile 14 s once; predicted 0.060 s/step, 0.106 s/step over "
        "the run's 300 steps"
    )
    assert _compile_fact({}).value == "each repeated block"
