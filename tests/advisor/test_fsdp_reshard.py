"""``fsdp_reshard_after_forward``: the plan key, its flag pair, and the trainer under FSDP.

The distributed test launches this file as the ranks' program (torchrun, gloo, world size 2 on
CPU): each rank builds the advisor's own FSDP step with the blocks resharded after forward and
kept gathered, from the same weights and batches, runs two optimizer steps, and rank 0 writes the
largest differences of the losses and of the full gradients gathered from the shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import main
from strategies.commands import Command
from strategies.config import ConfigError, TrainConfig, load_plan_config
from tests.advisor.torchrun import end_rank, run_world_2

TOLERANCE = 1e-6


def test_default_reshards_and_a_plan_without_the_key_reads_as_resharding(tmp_path: Path) -> None:
    assert TrainConfig().fsdp_reshard_after_forward is True
    old = TrainConfig(parallelism="fsdp", world_size=2, micro_batch_size=4).to_dict()
    del old["fsdp_reshard_after_forward"]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"config": old}))
    assert load_plan_config(plan).fsdp_reshard_after_forward is True


def test_kept_gathered_round_trips_through_plan_json_and_the_step_spec(tmp_path: Path) -> None:
    config = TrainConfig(
        parallelism="fsdp", world_size=2, micro_batch_size=4, fsdp_reshard_after_forward=False
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"config": config.to_dict()}))
    loaded = load_plan_config(plan)
    assert loaded == config
    assert loaded.step_spec().fsdp_reshard_after_forward is False


@pytest.mark.parametrize("parallelism, world", [("single", 1), ("ddp", 2)])
def test_kept_gathered_without_fsdp_is_refused_with_the_fix(parallelism: str, world: int) -> None:
    with pytest.raises(ConfigError, match="use --parallelism fsdp, or drop"):
        TrainConfig(
            parallelism=parallelism,
            world_size=world,
            micro_batch_size=8 // world,
            fsdp_reshard_after_forward=False,
        )


def test_a_non_boolean_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be true or false"):
        TrainConfig.from_dict(
            {
                "parallelism": "fsdp",
                "world_size": 2,
                "micro_batch_size": 4,
                "fsdp_reshard_after_forward": "no",
            }
        )


def test_the_flag_pair_is_written_and_read_back() -> None:
    words = Command("train").option("fsdp_reshard_after_forward", False).args()
    assert words == ["train", "--no-fsdp-reshard-after-forward"]
    assert Command("x").option("fsdp_reshard_after_forward", True).args()[-1] == (
        "--fsdp-reshard-after-forward"
    )


def test_the_flag_on_a_single_device_run_is_a_one_line_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--steps",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
            "--no-fsdp-reshard-after-forward",
        ],
        prog_name="advisor",
    )
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0] == (
        "error: fsdp_reshard_after_forward false keeps FSDP's gathered parameters, but "
        "parallelism is 'single': use --parallelism fsdp, or drop --no-fsdp-reshard-after-forward"
    )


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="world size 2 needs two cores")
def test_kept_gathered_losses_and_gradients_equal_resharded_at_world_size_2(
    tmp_path: Path,
) -> None:
    out = tmp_path / "diff.json"
    diff = run_world_2("tests.advisor.test_fsdp_reshard", out=out)
    assert diff["num_grads"] > 0 and diff["steps"] == 2
    assert diff["kept_modules"] > 0  # the False run really kept blocks unsharded
    assert diff["loss"] <= TOLERANCE * diff["plain_loss"], diff
    assert diff["grad"] <= TOLERANCE, diff


def _rank_main(out: str) -> None:  # pragma: no cover - runs under torchrun
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from advisor.workload import AdvisorWorkload
    from profilers.workload import StepSpec

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    workload = AdvisorWorkload("gpt-tiny", {"vocab_size": 1000, "n_layer": 2, "n_embd": 64})

    def run(reshard: bool) -> tuple[list[float], dict[str, torch.Tensor], int]:
        torch.manual_seed(0)  # every rank, both settings: the same initial weights
        spec = StepSpec(
            seq_len=32,
            micro_batch_size=2,
            grad_accum_steps=2,
            parallelism="fsdp",
            world_size=2,
            fsdp_reshard_after_forward=reshard,
        )
        step = workload.build_step(spec, "cpu")
        # What FSDP2 was told per block (its post-forward mesh: None means kept gathered).
        groups = [
            m._get_fsdp_state()._fsdp_param_group
            for m in step.model.modules()
            if isinstance(m, FSDPModule) and m is not step.model
        ]
        kept = len([g for g in groups if g is not None and g.post_forward_mesh_info is None])
        generator = torch.Generator().manual_seed(rank)
        losses = []
        grads: dict[str, torch.Tensor] = {}
        for i in range(2):
            loss = step.forward_backward(step.synthetic_batches(generator))
            dist.all_reduce(loss)
            losses.append(float(loss) / 2)
            if i == 1:  # the second step's gradients, after one optimizer update
                for name, p in step.model.named_parameters():
                    assert p.grad is not None, name
                    assert isinstance(p.grad, DTensor), name
                    grads[name] = p.grad.full_tensor().detach().clone()
            step.optimizer_step()
        return losses, grads, kept

    plain_losses, plain, plain_kept = run(True)
    losses, grads, kept = run(False)
    if rank == 0:
        assert plain_kept == 0, plain_kept
        diff = {
            "plain_loss": min(abs(x) for x in plain_losses),
            "loss": max(abs(a - b) for a, b in zip(losses, plain_losses, strict=True)),
            "grad": max(float((grads[k] - plain[k]).abs().max()) for k in plain),
            "num_grads": len(plain),
            "steps": len(losses),
            "kept_modules": kept,
        }
        Path(out).write_text(json.dumps(diff))
    end_rank()


if __name__ == "__main__":
    _rank_main(sys.argv[1])


def test_each_stack_gets_its_own_setting_for_the_kept_blocks() -> None:
    from advisor.exporters import export_plan
    from tests.advisor.test_export import PLANS

    plan = PLANS["fsdp-fp16-2nodes"]
    kept = dataclasses.replace(plan, config=plan.config.replace(fsdp_reshard_after_forward=False))
    assert (
        export_plan(plan, "accelerate").settings["fsdp_config"]["fsdp_reshard_after_forward"]
        is True
    )
    assert (
        export_plan(kept, "accelerate").settings["fsdp_config"]["fsdp_reshard_after_forward"]
        is False
    )
    assert export_plan(kept, "hf").settings["fsdp_config"]["reshard_after_forward"] is False
    strategy = export_plan(kept, "lightning").settings["trainer"]["strategy"]
    assert strategy["init_args"]["sharding_strategy"] == "SHARD_GRAD_OP"
    # torchtitan has no fp16 mixed precision: the same plan in bf16 (an fp16 one is refused).
    bf16 = dataclasses.replace(kept, config=kept.config.replace(precision="bf16"))
    titan = export_plan(bf16, "torchtitan").settings["parallelism"]
    assert titan["fsdp_reshard_after_forward"] == "never"
    ds = export_plan(kept, "deepspeed")
    assert ds.settings["zero_optimization"]["stage"] == 2
    assert any(
        line.startswith("fsdp_reshard_after_forward false: ZeRO stage 2") for line in ds.unmapped
    )
    assert export_plan(plan, "deepspeed").settings["zero_optimization"]["stage"] == 3


def test_the_report_shows_the_resharding_of_fsdp_plans_only() -> None:
    from reports.summary import Summary, plain_label, summary_section

    def facts(config: dict[str, object]) -> dict[str, str]:
        summary = Summary(
            headline=(),
            config=config,
            expected_speedup=None,
            measured_speedup=None,
            training_speedup=None,
            predicted_tokens_per_s=None,
            measured_tokens_per_s=None,
            training_tokens_per_s=None,
            reasons=(),
            notes=(),
        )
        section = summary_section(summary, {"config": config}, None, True)
        return {f.label: f.value for f in section.facts}

    kept = TrainConfig(
        parallelism="fsdp", world_size=2, micro_batch_size=4, fsdp_reshard_after_forward=False
    ).to_dict()
    assert facts(kept)["FSDP resharding"].startswith("none: blocks kept gathered")
    assert "kept gathered" in plain_label(kept)
    resharded = {**kept, "fsdp_reshard_after_forward": True}
    assert facts(resharded)["FSDP resharding"].startswith("after forward")
    assert "kept" not in plain_label(resharded)
    old = dict(resharded)
    del old["fsdp_reshard_after_forward"]  # a plan from before the knob
    assert facts(old)["FSDP resharding"].startswith("after forward")
    assert "FSDP resharding" not in facts(TrainConfig().to_dict())
