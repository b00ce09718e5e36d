"""advisor.exporters: every export reads back to the plan's global batch, precision,
checkpointing and layout (or names the knob it cannot hold), for several plans.

The plans are the golden plans (tests/data/golden) with their configs varied: one process in
fp32 without checkpointing, DDP in bf16 with full checkpointing and accumulation on a CPU host,
FSDP in fp16 on 4 GPUs over 2 nodes, and the golden FSDP plan for 8 GPUs as it is. The stacks'
own parsers are checked in tests/advisor/test_export_stacks.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path

import pytest

from advisor.errors import UsageProblem
from advisor.exporters import FORMATS, READ_BACK_KEYS, export_plan, read_back
from profilers.metrics_record import TrainRecord, encode
from strategies.config import TrainConfig
from strategies.plan_records import Plan

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"


def golden(name: str) -> Plan:
    return Plan.from_dict(json.loads((GOLDEN / name / "plan.json").read_text()))


def _plans() -> dict[str, Plan]:
    cpu = golden("cpu-validated")  # ddp×2 bf16, micro 4 × 2, measured on a CPU host
    gpu = golden("whatif-h100")  # what-if for H100s on 2 nodes
    assert cpu.config.parallelism == "ddp" and gpu.profile["request"]["nodes"] == 2
    return {
        "single-fp32": dataclasses.replace(
            cpu,
            config=cpu.config.replace(
                parallelism="single",
                world_size=1,
                micro_batch_size=8,
                grad_accum_steps=2,
                precision="fp32",
                grad_clip=0.0,
            ),
        ),
        "ddp-bf16-full": dataclasses.replace(
            cpu, config=cpu.config.replace(activation_checkpointing="full")
        ),
        "fsdp-fp16-2nodes": dataclasses.replace(
            gpu,
            config=gpu.config.replace(
                parallelism="fsdp",
                world_size=4,
                micro_batch_size=64,
                grad_accum_steps=2,
                precision="fp16",
                activation_checkpointing="full",
                num_workers=3,
            ),
        ),
        "fsdp-bf16-golden": golden("gpu-unvalidated"),
    }


PLANS = _plans()

# A read-back value may differ from the plan only where the stack cannot hold the knob; then
# an unmapped line starting with the knob says what to do instead.
GAP_KNOB = {
    "global_batch_size": "micro_batch_size",
    "precision": "precision",
    "activation_checkpointing": "activation_checkpointing",
    "parallelism": "parallelism",
    "world_size": "world_size",
}


def exportable(fmt: str, plan: Plan) -> bool:
    """torchtitan has no fp16: such a plan is refused (test_torchtitan_refuses_an_fp16_plan)."""
    return not (fmt == "torchtitan" and plan.config.precision == "fp16")


def expected_gaps(fmt: str, plan: Plan) -> set[str]:
    """What each stack cannot express, written out by hand (README's mapping table)."""
    c = plan.config
    gaps = set()
    if fmt in ("accelerate", "lightning"):  # the per-device batch is the DataLoader's
        gaps.add("global_batch_size")
    # Only their FSDP plugins take a checkpointing policy.
    full = c.activation_checkpointing == "full"
    if fmt in ("accelerate", "lightning") and full and c.parallelism != "fsdp":
        gaps.add("activation_checkpointing")
    return gaps


def plan_values(plan: Plan) -> dict[str, object]:
    return {key: getattr(plan.config, key) for key in READ_BACK_KEYS}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(PLANS))
def test_round_trip_keeps_the_plan_or_names_the_knob(fmt: str, name: str) -> None:
    plan = PLANS[name]
    if not exportable(fmt, plan):
        pytest.skip("refused: see test_torchtitan_refuses_an_fp16_plan")
    export = export_plan(plan, fmt)
    back = read_back(fmt, export.text, launch=export.launch)
    assert set(back) == set(READ_BACK_KEYS)
    want = plan_values(plan)
    gaps = {key for key in READ_BACK_KEYS if back[key] != want[key]}
    assert gaps == expected_gaps(fmt, plan), (back, want)
    for key in gaps:
        assert any(line.startswith(GAP_KNOB[key]) for line in export.unmapped), (
            key,
            export.unmapped,
        )


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_export_states_the_same_global_batch(name: str) -> None:
    plan = PLANS[name]
    c = plan.config
    for fmt in (f for f in FORMATS if exportable(f, plan)):
        export = export_plan(plan, fmt)
        back = read_back(fmt, export.text, launch=export.launch)
        if back["global_batch_size"] is not None:
            assert back["global_batch_size"] == c.global_batch_size
        else:  # the DataLoader's batch and the accumulation are stated with their values
            assert any(f"batch_size={c.micro_batch_size})" in u for u in export.unmapped)
            assert back["world_size"] == c.world_size
        header = export.sidecar or export.text
        assert f"global batch {c.global_batch_size} = micro-batch {c.micro_batch_size}" in header


def test_accumulation_is_stated_where_the_config_file_cannot_hold_it() -> None:
    plan = PLANS["ddp-bf16-full"]
    export = export_plan(plan, "accelerate")
    assert any("Accelerator(gradient_accumulation_steps=2)" in u for u in export.unmapped)
    lightning = export_plan(plan, "lightning")
    assert lightning.settings["trainer"]["accumulate_grad_batches"] == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_header_names_plan_prediction_measurement_and_every_unmapped_knob(fmt: str) -> None:
    plan = PLANS["ddp-bf16-full"]
    export = export_plan(plan, fmt, steps=1234)
    header = export.sidecar if fmt == "hf" else export.text
    assert header is not None
    assert "predicted: step 146.7 ms, 6,980 tok/s" in header
    assert "measured: step 157.0 ms, 6,524 tok/s" in header
    assert "1234 optimizer steps (as asked (--steps))" in header
    for line in export.unmapped:
        assert line in header
    assert export.launch is not None and export.launch in header
    # The model and data specs are ours in every stack.
    assert any(u.startswith("model gpt-tiny") for u in export.unmapped)
    assert any(u.startswith("data synthetic") for u in export.unmapped)


def test_unvalidated_plan_says_it_was_not_measured() -> None:
    export = export_plan(PLANS["fsdp-bf16-golden"], "torchtitan")
    assert "# measured: not measured" in export.text


def test_hf_header_is_a_sidecar_and_the_json_holds_only_training_arguments() -> None:
    export = export_plan(PLANS["ddp-bf16-full"], "hf")
    assert export.sidecar and "no equivalent in hf" in export.sidecar
    kw = json.loads(export.text)
    assert kw == export.settings
    assert kw["activation_checkpointing"] is True
    assert kw["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    assert export.launch == "torchrun --standalone --nproc-per-node=2 train.py"


def test_multi_node_launch_lines_spread_the_ranks_over_the_nodes() -> None:
    plan = PLANS["fsdp-fp16-2nodes"]
    hf = export_plan(plan, "hf")
    assert hf.launch is not None and "--nnodes=2" in hf.launch
    assert "--nproc-per-node=2" in hf.launch and "--rdzv-backend=c10d" in hf.launch
    # c10d numbers the nodes itself: torchrun ignores --node-rank there (with a warning)
    assert "node-rank" not in hf.launch and "NODE_RANK" not in hf.launch
    lightning = export_plan(plan, "lightning").settings["trainer"]
    assert (lightning["devices"], lightning["num_nodes"]) == (2, 2)
    accelerate = export_plan(plan, "accelerate").settings
    assert (accelerate["num_processes"], accelerate["num_machines"]) == (4, 2)
    assert "--num_nodes 2 --num_gpus 2" in (export_plan(plan, "deepspeed").launch or "")


def test_fsdp_maps_to_zero_3_and_shard_degree_and_the_block_class() -> None:
    plan = PLANS["fsdp-fp16-2nodes"]
    ds = export_plan(plan, "deepspeed").settings
    assert ds["zero_optimization"]["stage"] == 3
    # advisor's fp16: autocast over fp32 weights, gradients reduced in fp32 (GradScaler: the
    # engine's own for torch_autocast), not DeepSpeed's "fp16" section, which casts the weights.
    assert "fp16" not in ds and "bf16" not in ds
    assert ds["torch_autocast"] == {
        "enabled": True,
        "dtype": "float16",
        "lower_precision_safe_modules": [],
    }
    bf16 = dataclasses.replace(plan, config=plan.config.replace(precision="bf16"))
    titan = export_plan(bf16, "torchtitan").settings
    assert titan["parallelism"] == {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": 4,
        "fsdp_reshard_after_forward": "always",  # every block, as advisor's trainer
    }
    assert titan["training"]["dataloader"]["num_workers"] == 3
    # gpt-tiny's block is advisor's own class, which the user's model does not have: a
    # placeholder that fails loudly where a stack checks it, and a header line saying so.
    strategy = export_plan(plan, "lightning").settings["trainer"]["strategy"]
    assert strategy["init_args"]["activation_checkpointing_policy"] == ["your_model.YourBlock"]
    assert export_plan(plan, "hf").settings["fsdp_config"]["transformer_layer_cls_to_wrap"] == [
        "YourBlock"
    ]


def test_a_stack_of_two_kinds_of_layer_is_wrapped_by_both_classes() -> None:
    """Jamba's attention and Mamba layers are its blocks (since 2026-12-05): every class is
    named where a stack's wrap policy takes class names."""
    plan = PLANS["fsdp-fp16-2nodes"]
    hybrid = str(Path(__file__).resolve().parents[1] / "data" / "sequential_model.py") + ":hybrid"
    config = dataclasses.replace(
        plan.config, model=hybrid, model_args={}, activation_checkpointing="full"
    )
    plan = dataclasses.replace(plan, config=config)
    accelerate = export_plan(plan, "accelerate").settings["fsdp_config"]
    assert accelerate["fsdp_transformer_layer_cls_to_wrap"] == "GatedMixer,CausalLayer"
    hf = export_plan(plan, "hf").settings["fsdp_config"]
    assert hf["transformer_layer_cls_to_wrap"] == ["GatedMixer", "CausalLayer"]
    init = export_plan(plan, "lightning").settings["trainer"]["strategy"]["init_args"]
    assert [p.rsplit(".", 1)[1] for p in init["auto_wrap_policy"]] == ["GatedMixer", "CausalLayer"]
    assert init["activation_checkpointing_policy"] == init["auto_wrap_policy"]


def test_schedule_floor_and_disabled_clipping_carry_over() -> None:
    plan = PLANS["single-fp32"]  # grad_clip 0: no clipping
    c = plan.config
    titan = export_plan(plan, "torchtitan")
    assert titan.settings["lr_scheduler"]["min_lr_factor"] == pytest.approx(c.min_lr / c.lr)
    assert "max_norm = inf" in titan.text  # torchtitan always clips: an infinite norm never does
    ds = export_plan(plan, "deepspeed").settings
    assert ds["scheduler"]["params"]["cos_min_ratio"] == pytest.approx(c.min_lr / c.lr)
    assert ds["gradient_clipping"] == 0.0
    hf = export_plan(plan, "hf").settings
    assert hf["lr_scheduler_kwargs"] == {"min_lr": c.min_lr} and hf["max_grad_norm"] == 0.0
    assert export_plan(plan, "lightning").settings["trainer"]["gradient_clip_val"] is None


def schedule_steps(run: Path) -> int:
    steps: int = export_plan(run, "deepspeed").settings["scheduler"]["params"]["total_num_steps"]
    return steps


def test_run_directory_takes_the_schedule_length_of_its_training(tmp_path: Path) -> None:
    plan = PLANS["ddp-bf16-full"]
    plan.save(tmp_path)
    assert schedule_steps(tmp_path) == 300  # advisor train's default: no training here
    train = tmp_path / "train"
    train.mkdir()
    (train / "train_config.json").write_text(
        json.dumps({"config": plan.config.to_dict(), "total_steps": 777})
    )
    assert schedule_steps(tmp_path) == 777
    assert schedule_steps(tmp_path / "plan.json") == 777  # the run's plan.json: the same run
    # Its measured speed joins the header: medians after the first tenth of the steps.
    times = [9.0] + [0.2] * 5 + [0.3] * 4  # step 1 is the warm-up outlier
    (train / "metrics.jsonl").write_text(
        "".join(
            encode(TrainRecord(step=i + 1, step_time_s=t, tokens_per_s=1024 / t)) + "\n"
            for i, t in enumerate(times)
        )
    )
    header = export_plan(tmp_path, "torchtitan").text
    assert "# trained (RUN/train): step 200.0 ms, 5,120 tok/s (medians of 9 steps" in header
    other = plan.config.replace(seed=1)
    (train / "train_config.json").write_text(
        json.dumps({"config": other.to_dict(), "total_steps": 777})
    )
    assert schedule_steps(tmp_path) == 300  # another config's training says nothing here


def test_errors_are_one_line_usage_problems(tmp_path: Path) -> None:
    with pytest.raises(UsageProblem, match="unknown export format 'jax': use one of hf"):
        export_plan(PLANS["single-fp32"], "jax")
    with pytest.raises(UsageProblem, match=r"no plan at .*plan\.json: pass a run directory"):
        export_plan(tmp_path, "hf")
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    with pytest.raises(UsageProblem, match="not readable JSON"):
        export_plan(bad, "hf")
    bad.write_text(json.dumps({"config": {}, "predicted": {}, "schema_version": 99}))
    with pytest.raises(UsageProblem, match=r"cannot be read .*schema version 99"):
        export_plan(bad, "hf")
    bad.write_text(json.dumps({"model": "gpt-tiny"}))
    with pytest.raises(UsageProblem, match="is not a plan"):
        export_plan(bad, "hf")
    with pytest.raises(UsageProblem, match="steps must be a positive integer"):
        export_plan(PLANS["single-fp32"], "hf", steps=0)
    with pytest.raises(UsageProblem, match="not a deepspeed export"):
        read_back("deepspeed", "{}")


def _named(line: str, keys: set[str]) -> set[str]:
    return {key for key in keys if re.search(rf"\b{key}\b", line)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_trainconfig_key_is_mapped_or_named(fmt: str) -> None:
    """A knob is never dropped silently: each TrainConfig key (a new one too) is set by the
    exporter or named by one of its unmapped lines, with every knob set away from its default."""
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    plan = PLANS["ddp-bf16-full"]
    changes: dict[str, object] = {
        "model_args": {"n_layer": 3},
        "tokenizer": "tok-dir",
        "num_workers": 2,
    }
    if "init_from" in keys:
        changes["init_from"] = "weights.pt"
    plan = dataclasses.replace(plan, config=plan.config.replace(**changes))
    export = export_plan(plan, fmt)
    mapped = importlib.import_module(f"advisor.exporters.{fmt}").MAPPED
    named = set().union(*(_named(line, keys) for line in export.unmapped))
    assert keys - mapped - named == set()
    if "init_from" in keys:
        assert any(line.startswith("init_from weights.pt") for line in export.unmapped)


def test_zero_warmup_is_written_as_deepspeeds_least_and_said() -> None:
    plan = PLANS["single-fp32"]
    plan = dataclasses.replace(plan, config=plan.config.replace(warmup_steps=0))
    export = export_plan(plan, "deepspeed")
    assert export.settings["scheduler"]["params"]["warmup_num_steps"] == 2
    assert any(line.startswith("warmup_steps 0:") for line in export.unmapped)


@pytest.mark.parametrize("fmt", ["hf", "accelerate", "lightning"])
def test_an_unbuildable_model_leaves_the_block_to_the_user_and_says_so(fmt: str) -> None:
    plan = PLANS["fsdp-fp16-2nodes"]
    plan = dataclasses.replace(plan, config=plan.config.replace(model="no_such_file.py:build"))
    export = export_plan(plan, fmt)
    line = next(u for u in export.unmapped if u.startswith("parallelism fsdp:"))
    assert "no_such_file.py" in line  # why it could not be built
    back = read_back(fmt, export.text, launch=export.launch)
    if back["activation_checkpointing"] != "full":  # Lightning's policy is the block class
        assert any(u.startswith("activation_checkpointing full") for u in export.unmapped)


def test_the_header_says_which_file_holds_the_initial_weights_and_how_to_read_it(
    tmp_path: Path,
) -> None:
    """init_from a training directory: the header said torch.load(...) of the directory."""
    import torch

    step = tmp_path / "trained" / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    torch.save({"model": {}}, step / "state.pt")
    torch.save({"format": 1, "step": 4}, step / "extra.pt")
    (step.parent / "latest").write_text(step.name + "\n")
    plan = dataclasses.replace(
        PLANS["ddp-bf16-full"],
        config=PLANS["ddp-bf16-full"].config.replace(init_from=str(tmp_path / "trained")),
    )
    lines = [line for line in export_plan(plan, "accelerate").unmapped if "init_from" in line]
    assert lines == [
        f"init_from {tmp_path / 'trained'}: advisor's initial weights; load them into your "
        f'model before training: torch.load({step / "state.pt"}, weights_only=True)["model"], '
        "then load_state_dict"
    ]
    elsewhere = plan.config.replace(init_from="/not/on/this/machine.safetensors")
    lines = [
        line
        for line in export_plan(dataclasses.replace(plan, config=elsewhere), "hf").unmapped
        if "init_from" in line
    ]
    assert lines == [
        "init_from /not/on/this/machine.safetensors: advisor's initial weights; load them "
        "into your model before training (load_state_dict)"
    ]


def test_torchtitan_refuses_an_fp16_plan_naming_the_fix() -> None:
    """torchtitan has no fp16: a float32 file under the fp16 plan's predicted speed and memory
    (audit 41, D6: 115 GB for a plan predicted at 68 GiB) is refused with the way out."""
    with pytest.raises(UsageProblem, match=r"^torchtitan has no fp16 .*--only precision=bf16"):
        export_plan(PLANS["fsdp-fp16-2nodes"], "torchtitan")


def test_torchtitan_says_to_set_its_model_and_that_it_needs_a_gpu() -> None:
    cpu = export_plan(PLANS["ddp-bf16-full"], "torchtitan")
    assert any("set [model] name and flavor" in u for u in cpu.unmapped)
    assert any(
        u.startswith("parallelism ddp on CPU: torchtitan trains on GPUs only") for u in cpu.unmapped
    )
    gpu = export_plan(PLANS["fsdp-bf16-golden"], "torchtitan")
    assert not any("on CPU" in u for u in gpu.unmapped)


def test_the_measured_peak_is_set_beside_a_prediction_on_the_same_basis() -> None:
    """The predicted peak includes the process overheads; the measured one is the allocator's:
    the header says which is which, and gives the prediction on the measurement's basis."""
    plan = PLANS["ddp-bf16-full"]
    header = export_plan(plan, "lightning").text
    assert "per rank (process overheads included)" in header
    measured = next(line for line in header.splitlines() if line.startswith("# measured:"))
    assert plan.measured is not None and plan.measured.memory_kind in measured
    traced = plan.predicted.traced_bytes
    if traced:
        from reports import fmt

        assert f"predicted on this basis {fmt.size(traced)}" in measured


def test_accelerate_starts_every_cpu_rank_through_its_multi_process_launcher() -> None:
    """Accelerate's MULTI_CPU starts one process unless under mpirun (audit 41, D1): a CPU DDP
    plan takes the torchrun launcher, with ACCELERATE_USE_CPU=true on the launch line."""
    export = export_plan(PLANS["ddp-bf16-full"], "accelerate")
    assert export.settings["distributed_type"] == "MULTI_GPU"
    assert export.settings["use_cpu"] is False and export.settings["num_processes"] == 2
    assert export.launch is not None and export.launch.startswith("ACCELERATE_USE_CPU=true ")
    assert any(u.startswith("world_size 2 on CPU:") for u in export.unmapped)
    single = export_plan(PLANS["single-fp32"], "accelerate")
    assert single.settings["use_cpu"] is True and single.settings["distributed_type"] == "NO"
    assert single.launch == "accelerate launch --config_file accelerate_config.yaml train.py"


@pytest.mark.parametrize("fmt", ["hf", "accelerate", "lightning"])
def test_an_advisor_preset_block_is_a_placeholder_the_header_says_to_set(fmt: str) -> None:
    """advisor's own block class matches nothing in the user's model (Lightning then wraps
    and checkpoints nothing, silently): the file names a placeholder and the header says
    what to put there."""
    plan = PLANS["fsdp-fp16-2nodes"]  # gpt-tiny
    export = export_plan(plan, fmt)
    written = json.dumps(export.settings)  # the file's settings, not its header
    assert "advisor.models" not in written and 'Block"' not in written.replace("YourBlock", "")
    assert "YourBlock" in written
    line = next(u for u in export.unmapped if u.startswith("parallelism fsdp: the repeated"))
    assert "advisor.models.gpt.Block" in line and "GPT2Block" in line


@pytest.mark.parametrize("fmt", ["hf", "accelerate", "lightning"])
def test_an_hf_model_is_wrapped_by_its_transformers_layer_class(fmt: str) -> None:
    pytest.importorskip("transformers")
    plan = PLANS["fsdp-fp16-2nodes"]
    hf_model = "hf:" + str(Path(__file__).resolve().parents[1] / "data" / "hf_tiny_gpt2")
    plan = dataclasses.replace(plan, config=plan.config.replace(model=hf_model, model_args={}))
    export = export_plan(plan, fmt)
    assert "GPT2Block" in export.text and "YourBlock" not in export.text
    assert not any("YourBlock" in u for u in export.unmapped)


def test_fsdp_exports_name_where_gradients_are_reduced_in_16_bits() -> None:
    """advisor's FSDP reduces gradients in fp32; stacks whose files cannot say so are named."""
    plan = PLANS["fsdp-fp16-2nodes"]
    for fmt in ("hf", "accelerate", "lightning"):
        unmapped = export_plan(plan, fmt).unmapped
        assert any(
            u.startswith("precision fp16 under FSDP") and "reduce" in u and "fp32" in u
            for u in unmapped
        ), (fmt, unmapped)
    lightning = export_plan(plan, "lightning").unmapped
    assert any("FSDP1" in u for u in lightning)


def test_lightning_fsdp_leaves_norm_clipping_to_the_module_and_says_how() -> None:
    plan = PLANS["fsdp-fp16-2nodes"]
    export = export_plan(plan, "lightning")
    trainer = export.settings["trainer"]
    assert trainer["gradient_clip_val"] is None and "gradient_clip_algorithm" not in trainer
    line = next(u for u in export.unmapped if u.startswith("grad_clip"))
    assert f"clip_grad_norm_({plan.config.grad_clip:g})" in line
    ddp = export_plan(PLANS["ddp-bf16-full"], "lightning").settings["trainer"]
    assert (ddp["gradient_clip_val"], ddp["gradient_clip_algorithm"]) == (1.0, "norm")


def test_hf_warm_up_is_advisors_from_the_first_step() -> None:
    """cosine_with_min_lr trains the first step at lr 0; advisor's warm-up starts at lr/W."""
    plan = PLANS["ddp-bf16-full"]
    assert plan.config.warmup_steps > 0
    assert export_plan(plan, "hf").settings["lr_scheduler_type"] == "cosine_warmup_with_min_lr"
    flat = dataclasses.replace(plan, config=plan.config.replace(warmup_steps=0))
    assert export_plan(flat, "hf").settings["lr_scheduler_type"] == "cosine_with_min_lr"
