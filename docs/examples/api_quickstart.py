"""The Python API on one page: profile a model, pick its fastest config, price it elsewhere,
train it, export it.

Tiny settings, so that it runs in about a minute on a laptop CPU; for a real model drop them
(the default profile budget is 120 s). In a script keep the calls under
``if __name__ == "__main__":``: the probes run in child processes that import this file.
"""

import advisor


def main() -> None:
    profile = advisor.profile(
        model="gpt-tiny",  # or a factory: model=my_factory, model_args={...}
        model_args={"n_layer": 1},
        seq_len=64,
        precisions=["fp32"],
        budget_s=10,
        comm=False,
        out="runs/quickstart",
    )
    # plan.json, trials.csv and the study beside the profile (without out=: nothing saved).
    # The plan carries hyper-parameters unchanged: a 5-step run warms up for 1 step, not 20.
    plan = advisor.recommend(
        profile,
        global_batch_size=8,
        validate_top=1,
        hyperparameters={"warmup_steps": 1},
        out="runs/quickstart",
    )
    print("chosen:", plan.candidate.label())
    print(f"predicted: {plan.predicted.tokens_per_s:,.0f} tokens/s")
    if plan.measured is not None:
        print(f"measured: {plan.measured.tokens_per_s:,.0f} tokens/s")

    # What the chosen config would do on hardware that is not here (an estimate, no run)
    h100 = advisor.predict(profile, plan, target="h100-80gb")
    print(f"on an H100: {h100.tokens_per_s:,.0f} tokens/s (estimate)")

    result = advisor.train(plan, steps=5, out="runs/quickstart/train")

    # The same config for the Hugging Face Trainer (also: accelerate, lightning, deepspeed,
    # torchtitan); with out= it is written to runs/quickstart/training_args.json too. Exported
    # from the run directory, its schedule spans the run's own 5 steps (as `advisor export
    # runs/quickstart` writes); a Plan record carries no run, so export(plan) would span 300.
    hf = advisor.export("runs/quickstart", "hf", out="runs/quickstart")
    print("TrainingArguments:", hf.settings)
    print(f"trained {result.steps} steps: loss {result.final_loss:.3f}")
    # The run directory now reads like one of `advisor run`: `advisor report runs/quickstart`


if __name__ == "__main__":
    main()
