"""Each export loaded by the stack's own library, on CPU, with no training started.

transformers' TrainingArguments, Accelerate's config loader and launch validation,
lightning.Trainer with the strategy, DeepSpeed's DeepSpeedConfig and torchtitan's
ConfigManager. They come with the ``export`` extra (``pip install -e '.[export]'``); a test
skips when its library is missing. Where a library probes the hardware (a GPU plan read on
this CPU machine) the probe alone is patched, and the test says so; everything the file sets
is parsed and validated for real.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from advisor.exporters import Export, export_plan
from advisor.exporters.source import PLACEHOLDER_BLOCK, PLACEHOLDER_MODULE
from strategies.plan_records import Plan
from tests.advisor.test_export import PLANS, exportable

NAMES = sorted(PLANS)
# What the user writes over the block-class placeholder of an advisor preset's export (the
# header says to): a class their model has. Here any importable one.
USER_BLOCK = "torch.nn.Linear"


def _user_block(text: str) -> str:
    """The export's text with the placeholder replaced, as the header asks the user to."""
    return text.replace(f"{PLACEHOLDER_MODULE}.{PLACEHOLDER_BLOCK}", USER_BLOCK).replace(
        PLACEHOLDER_BLOCK, USER_BLOCK.rsplit(".", 1)[1]
    )


@pytest.fixture(autouse=True)
def _keep_environment() -> Iterator[None]:
    """These libraries write environment variables on import and on construction (Lightning's
    seed, FSDP loading flags, NVML checks): the rest of the suite must not see them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _write(tmp_path: Path, export: Export) -> Path:
    path = tmp_path / export.filename
    path.write_text(_user_block(export.text))
    return path


def _advisor_lrs(plan: Plan, steps: int) -> list[float]:
    """advisor's own lr at each optimizer step (the trainer's WarmupCosine)."""
    from advisor.trainer.schedule import WarmupCosine

    c = plan.config
    schedule = WarmupCosine(c.lr, c.min_lr, c.warmup_steps, steps)
    return [schedule.lr_at(s) for s in range(steps)]


def _stack_lrs(make: Any, lr: float, steps: int) -> list[float]:
    """The lr each optimizer step trains at under a stack's scheduler (stepped after it)."""
    import torch

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)
    scheduler = make(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("name", NAMES)
def test_transformers_training_arguments_construct(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    training_args = pytest.importorskip("transformers.training_args")
    plan = PLANS[name]
    export = export_plan(plan, "hf")
    kw = json.loads(export.text)
    kw["output_dir"] = str(tmp_path / "out")
    if plan.machine.get("kind") == "cuda":
        # A GPU plan read on a CPU machine: only the bf16-capable-GPU probe is patched.
        monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    args = training_args.TrainingArguments(**kw)
    c = plan.config
    assert args.per_device_train_batch_size == c.micro_batch_size
    assert args.gradient_accumulation_steps == c.grad_accum_steps
    assert (args.bf16, args.fp16) == (c.precision == "bf16", c.precision == "fp16")
    assert args.lr_scheduler_type.value in ("cosine_with_min_lr", "cosine_warmup_with_min_lr")
    assert args.max_steps == 300 and args.warmup_steps == c.warmup_steps
    if c.parallelism == "fsdp":
        assert args.fsdp and args.fsdp_config["version"] == 2
        assert args.fsdp_config["activation_checkpointing"] == (
            c.activation_checkpointing == "full"
        )
    else:
        assert args.activation_checkpointing == (c.activation_checkpointing == "full")
    # The Trainer's scheduler from these arguments: advisor's warm-up step for step (no step
    # at lr 0), its cosine one step ahead (said in the header), min_lr at the last step.
    from transformers import get_scheduler

    def make(optimizer: Any) -> Any:
        return get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=args.get_warmup_steps(args.max_steps),
            num_training_steps=args.max_steps,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs,
        )

    theirs = _stack_lrs(make, args.learning_rate, args.max_steps)
    ours = _advisor_lrs(plan, args.max_steps)
    w = c.warmup_steps
    assert theirs[:w] == pytest.approx(ours[:w], rel=1e-12)
    assert theirs[w:-1] == pytest.approx(ours[w + 1 :], rel=1e-12)
    assert theirs[-1] == pytest.approx(c.min_lr)
    assert min(theirs) > 0
    # Why the header is a sidecar file: the arguments take no extra key.
    with pytest.raises(TypeError):
        training_args.TrainingArguments(**kw, _advisor=["header"])


@pytest.mark.parametrize("name", NAMES)
def test_accelerate_loads_and_validates_the_config_file(name: str, tmp_path: Path) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    launch = pytest.importorskip("accelerate.commands.launch")
    plan = PLANS[name]
    path = _write(tmp_path, export_plan(plan, "accelerate"))
    config = config_args.load_config_from_file(str(path))
    c = plan.config
    assert config.num_processes == c.world_size
    assert config.mixed_precision == {"fp32": "no"}.get(c.precision, c.precision)
    # accelerate launch's own validation of the file (what it would start, started nothing).
    parsed = launch.launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args = launch._validate_launch_command(parsed)[0]
    assert args.num_processes == c.world_size
    assert args.num_machines == config.num_machines
    assert bool(args.use_fsdp) == (c.parallelism == "fsdp")
    if c.parallelism == "fsdp":
        assert args.fsdp_version == "2" or args.fsdp_version == 2
        assert args.fsdp_activation_checkpointing == (c.activation_checkpointing == "full")
    else:
        assert bool(args.multi_gpu or args.use_cpu) == (c.world_size > 1 or args.use_cpu)


def _pretend_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Lightning refuses FSDP without CUDA: patch its device probes only (no fit runs)."""
    from lightning.fabric.accelerators import cuda as fabric_cuda
    from lightning.pytorch.accelerators import CUDAAccelerator

    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: True))
    monkeypatch.setattr(fabric_cuda, "num_cuda_devices", lambda: count)


@pytest.mark.parametrize("name", NAMES)
def test_lightning_trainer_constructs_with_the_strategy(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lightning = pytest.importorskip("lightning")
    yaml = pytest.importorskip("yaml")
    from advisor.exporters.lightning import trainer_kwargs

    plan = PLANS[name]
    export = export_plan(plan, "lightning")
    settings = yaml.safe_load(export.text)
    assert settings == export.settings  # the file is what the settings say
    kw: dict[str, Any] = trainer_kwargs(yaml.safe_load(_user_block(export.text)))
    if kw["accelerator"] == "gpu":
        _pretend_gpus(monkeypatch, kw["devices"])
    trainer = lightning.Trainer(
        **kw, logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path)
    )
    c = plan.config
    assert trainer.world_size == c.world_size
    assert trainer.accumulate_grad_batches == c.grad_accum_steps
    precision = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[c.precision]
    assert trainer.precision == precision
    strategy = type(trainer.strategy).__name__
    assert strategy == {"single": "SingleDeviceStrategy", "ddp": "DDPStrategy"}.get(
        c.parallelism, "FSDPStrategy"
    )
    if c.parallelism == "fsdp":
        checkpointing = trainer.strategy._activation_checkpointing_kwargs
        assert bool(checkpointing) == (c.activation_checkpointing == "full")


class _DataParallel:
    """The ``mpu`` argument DeepSpeedConfig takes: it answers the data-parallel size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@pytest.mark.parametrize("name", NAMES)
def test_deepspeed_config_parser_accepts_the_json(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    import torch

    plan = PLANS[name]
    c = plan.config
    path = _write(tmp_path, export_plan(plan, "deepspeed"))
    assert "_advisor" in json.loads(path.read_text())
    # Outside a launched job DeepSpeed takes the world size from the mpu once it has a rank.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    config = ds_config.DeepSpeedConfig(str(path), mpu=_DataParallel(c.world_size))
    assert config.train_batch_size == c.global_batch_size
    assert config.train_micro_batch_size_per_gpu == c.micro_batch_size
    assert config.gradient_accumulation_steps == c.grad_accum_steps
    assert config.zero_optimization_stage == (3 if c.parallelism == "fsdp" else 0)
    assert config.optimizer_name == "adamw" and config.scheduler_name == "WarmupCosineLR"
    # advisor's mixed precision is autocast over fp32 weights with gradients reduced in fp32:
    # DeepSpeed's torch_autocast with no module's parameters communicated in 16 bits, never its
    # bf16/fp16 sections, which cast the weights.
    assert not config.bfloat16_config.enabled and not config.float16_config.enabled
    assert config.torch_autocast_enabled == (c.precision != "fp32")
    if c.precision != "fp32":
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[c.precision]
        assert config.torch_autocast_dtype == dtype
        assert config.torch_autocast_lower_precision_safe_modules == []
    # The scheduler DeepSpeed builds from "scheduler": lr 0 at the first step (DeepSpeed's
    # own), then advisor's warm-up one step late (said in the header), equal from step W + 1.
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    params = config.scheduler_params
    steps = params["total_num_steps"]
    theirs = _stack_lrs(lambda o: WarmupCosineLR(o, **params), c.lr, steps)
    ours = _advisor_lrs(plan, steps)
    w = c.warmup_steps
    assert theirs[0] == 0
    if w >= 2:
        assert theirs[1] == pytest.approx(ours[0], rel=1e-12)
        assert theirs[1 : w + 1] == pytest.approx(ours[:w], rel=1 / w)
        assert theirs[w + 1 :] == pytest.approx(ours[w + 1 :], rel=1e-12)
    # DeepSpeed's own batch check: a wrong world size is refused.
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        ds_config.DeepSpeedConfig(str(path), mpu=_DataParallel(c.world_size * 2 + 1))


@pytest.mark.parametrize("name", NAMES)
def test_torchtitan_config_manager_parses_the_toml(name: str, tmp_path: Path) -> None:
    manager = pytest.importorskip("torchtitan.config.manager")
    plan = PLANS[name]
    if not exportable("torchtitan", plan):
        pytest.skip("torchtitan has no fp16: the export is refused")
    c = plan.config
    path = _write(tmp_path, export_plan(plan, "torchtitan"))
    job = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    assert job.training.global_batch_size == c.global_batch_size
    assert job.training.local_batch_size == c.micro_batch_size
    assert job.training.seq_len == c.seq_len
    assert job.activation_checkpoint.mode == c.activation_checkpointing
    replicate = job.parallelism.data_parallel_replicate_degree
    shard = job.parallelism.data_parallel_shard_degree
    assert replicate * shard == c.world_size
    assert (shard > 1) == (c.parallelism == "fsdp")
    # torchtitan derives the accumulation the way advisor fixes it.
    assert job.training.global_batch_size // (job.training.local_batch_size * c.world_size) == (
        c.grad_accum_steps
    )
    assert job.lr_scheduler.min_lr_factor == pytest.approx(c.min_lr / c.lr)
    assert job.debug.seed == c.seed
    if c.grad_clip == 0:
        assert job.training.max_norm == float("inf")


@pytest.mark.parametrize("name", NAMES)
def test_lightning_cli_reads_the_file_as_its_config(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The file is a LightningCLI config: the CLI's own parser (jsonargparse) builds the
    Trainer from it, class paths of the strategy and its policies included."""
    lightning = pytest.importorskip("lightning")
    pytest.importorskip("jsonargparse")
    import random

    import numpy as np
    import torch
    from lightning.pytorch.cli import LightningCLI

    class Module(lightning.LightningModule):  # the user's module; nothing runs
        pass

    plan = PLANS[name]
    c = plan.config
    export = export_plan(plan, "lightning")
    path = _write(tmp_path, export)
    if export.settings["trainer"]["accelerator"] == "gpu":
        _pretend_gpus(monkeypatch, export.settings["trainer"]["devices"])
    monkeypatch.setattr("sys.argv", ["train.py"])  # the CLI reads args=, not pytest's argv
    # The CLI seeds every generator (seed_everything): keep this process's streams as they were.
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        cli = LightningCLI(
            Module,
            run=False,
            args=["--config", str(path), "--trainer.default_root_dir", str(tmp_path)],
            save_config_callback=None,
        )
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    trainer = cli.trainer
    assert cli.config["seed_everything"] == c.seed
    assert trainer.world_size == c.world_size
    assert trainer.accumulate_grad_batches == c.grad_accum_steps
    assert trainer.max_steps == 300
    # FSDPStrategy refuses norm clipping at the first step: the header says how to clip.
    assert trainer.gradient_clip_val == (None if c.parallelism == "fsdp" else c.grad_clip or None)
    if c.parallelism == "fsdp":
        checkpointing = trainer.strategy._activation_checkpointing_kwargs
        assert bool(checkpointing) == (c.activation_checkpointing == "full")


def _with_config(plan: Plan, **changes: Any) -> Plan:
    return dataclasses.replace(plan, config=plan.config.replace(**changes))


def _kept_and_compiled() -> Plan:
    return _with_config(PLANS["fsdp-bf16-golden"], compile=True, fsdp_reshard_after_forward=False)


def test_accelerate_reads_regional_compilation_and_kept_gathered_blocks(tmp_path: Path) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    launch = pytest.importorskip("accelerate.commands.launch")
    path = _write(tmp_path, export_plan(_kept_and_compiled(), "accelerate"))
    config = config_args.load_config_from_file(str(path))
    assert config.dynamo_config["dynamo_backend"] == "INDUCTOR"
    assert config.dynamo_config["dynamo_use_regional_compilation"] is True
    assert config.fsdp_config["fsdp_reshard_after_forward"] is False
    parsed = launch.launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args = launch._validate_launch_command(parsed)[0]
    assert str(args.dynamo_backend).upper() == "INDUCTOR"
    assert str(args.dynamo_use_regional_compilation).lower() == "true"
    assert str(args.fsdp_reshard_after_forward).lower() == "false"


def test_torchtitan_reads_compile_and_never_reshard(tmp_path: Path) -> None:
    manager = pytest.importorskip("torchtitan.config.manager")
    path = _write(tmp_path, export_plan(_kept_and_compiled(), "torchtitan"))
    job = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    assert job.compile.enable is True
    # the blocks only, as advisor compiles them: torchtitan's default adds "loss"
    assert job.compile.components == ["model"]
    assert job.parallelism.fsdp_reshard_after_forward == "never"
    resharded = _with_config(_kept_and_compiled(), fsdp_reshard_after_forward=True)
    path = _write(tmp_path, export_plan(resharded, "torchtitan"))
    job = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    assert job.parallelism.fsdp_reshard_after_forward == "always"


def test_transformers_reads_torch_compile_and_the_fsdp_reshard_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    training_args = pytest.importorskip("transformers.training_args")
    kw = json.loads(export_plan(_kept_and_compiled(), "hf").text)
    kw["output_dir"] = str(tmp_path / "out")
    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    args = training_args.TrainingArguments(**kw)
    assert args.torch_compile is True
    assert args.fsdp_config["reshard_after_forward"] is False


def test_the_trainer_compiles_each_block_from_the_hf_export(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The launch line's variable turns the Trainer's torch_compile into Accelerate's regional
    compilation (each repeated block, as advisor compiles them); tf32 stays off."""
    transformers = pytest.importorskip("transformers")
    import shlex

    import torch

    export = export_plan(_with_config(PLANS["single-fp32"], compile=True), "hf")
    kw = dict(json.loads(export.text), output_dir=str(tmp_path / "out"))

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    def plugin() -> Any:
        args = transformers.TrainingArguments(**kw)
        assert args.torch_compile is True and args.tf32 is False
        return transformers.Trainer(model=Blocks(), args=args).accelerator.state.dynamo_plugin

    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", raising=False)
    assert plugin().use_regional_compilation is False  # torch_compile alone: the whole model
    assert export.launch is not None
    for word in shlex.split(export.launch):
        if word == "torchrun":
            break
        name, _, value = word.partition("=")
        monkeypatch.setenv(name, value)
    regional = plugin()
    assert regional.use_regional_compilation is True
    assert str(regional.backend).upper().endswith("INDUCTOR")


def test_torchtitan_values_are_ones_its_fields_take(tmp_path: Path) -> None:
    """Every key the export writes is a JobConfig field (ConfigManager refuses others) and
    every value of a Literal field is one of its choices (ConfigManager does not check)."""
    import typing

    job_config = pytest.importorskip("torchtitan.config.job_config")

    def check(cls: Any, data: dict[str, Any], where: str) -> None:
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        for key, value in data.items():
            assert key in names, f"{where}{key}"
            kind = hints[key]
            if dataclasses.is_dataclass(kind):
                check(kind, value, f"{where}{key}.")
            elif typing.get_origin(kind) is typing.Literal:
                assert value in typing.get_args(kind), (f"{where}{key}", value)

    for name in NAMES:
        for changes in ({}, {"compile": True}, {"activation_checkpointing": "ops"}):
            plan = _with_config(PLANS[name], **changes)
            if exportable("torchtitan", plan):
                check(job_config.JobConfig, export_plan(plan, "torchtitan").settings, "")


def test_deepspeed_reads_kept_gathered_blocks_as_zero_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    plan = _kept_and_compiled()
    path = _write(tmp_path, export_plan(plan, "deepspeed"))
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    config = ds_config.DeepSpeedConfig(str(path), mpu=_DataParallel(plan.config.world_size))
    assert config.zero_optimization_stage == 2


def test_lightning_reads_kept_gathered_blocks_as_shard_grad_op(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lightning = pytest.importorskip("lightning")
    yaml = pytest.importorskip("yaml")
    from advisor.exporters.lightning import trainer_kwargs

    kw: dict[str, Any] = trainer_kwargs(
        yaml.safe_load(_user_block(export_plan(_kept_and_compiled(), "lightning").text))
    )
    _pretend_gpus(monkeypatch, kw["devices"])
    trainer = lightning.Trainer(
        **kw, logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path)
    )
    assert trainer.strategy.sharding_strategy.name == "SHARD_GRAD_OP"


PROBE = """\
from pathlib import Path

from accelerate import Accelerator

state = Accelerator()
seen = f"rank {state.process_index} of {state.num_processes} {state.distributed_type}"
Path(f"rank{state.process_index}.txt").write_text(seen)
"""


def test_accelerate_launch_starts_every_rank_of_a_cpu_ddp_plan(tmp_path: Path) -> None:
    """audit 41, D1: `accelerate launch` of a MULTI_CPU file started one process (global
    batch halved). The file and launch line as exported, launched for real on this CPU."""
    pytest.importorskip("accelerate.commands.launch")
    import shlex
    import subprocess
    import sys

    plan = PLANS["ddp-bf16-full"]
    export = export_plan(plan, "accelerate")
    _write(tmp_path, export)
    (tmp_path / "train.py").write_text(PROBE)
    assert export.launch is not None
    words = shlex.split(export.launch)
    env = dict(os.environ)
    while "=" in words[0]:  # the launch line's environment (ACCELERATE_USE_CPU=true)
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:2] == ["accelerate", "launch"]
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", *words[2:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = sorted(path.read_text() for path in tmp_path.glob("rank*.txt"))
    world = plan.config.world_size
    assert ranks == [f"rank {r} of {world} DistributedType.MULTI_CPU" for r in range(world)]


def test_lightning_fsdp_export_clips_without_the_refused_norm_algorithm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """audit 41, D2: FSDPPrecision raises at the first optimizer step for gradient_clip_algorithm
    'norm'. The Trainer built from the export runs Lightning's clipping hook as a step does."""
    lightning = pytest.importorskip("lightning")
    yaml = pytest.importorskip("yaml")
    import torch
    from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision

    from advisor.exporters.lightning import trainer_kwargs

    export = export_plan(PLANS["fsdp-fp16-2nodes"], "lightning")
    kw: dict[str, Any] = trainer_kwargs(yaml.safe_load(_user_block(export.text)))
    _pretend_gpus(monkeypatch, kw["devices"])
    trainer = lightning.Trainer(
        **kw, logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path)
    )
    assert isinstance(trainer.strategy.precision_plugin, FSDPPrecision)
    module = lightning.LightningModule()
    module.trainer = trainer
    trainer.strategy.connect(module)
    parameter = torch.nn.Parameter(torch.ones(2))
    parameter.grad = torch.ones(2)
    optimizer = torch.optim.AdamW([parameter])
    # What the precision plugin does before each optimizer step (Precision._after_closure).
    trainer.strategy.precision_plugin._clip_gradients(
        module, optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm
    )


def test_lightning_cli_refuses_the_block_placeholder_until_it_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An advisor preset's block class would wrap nothing in the user's model, silently; the
    placeholder stops LightningCLI at once, naming it."""
    lightning = pytest.importorskip("lightning")
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    export = export_plan(PLANS["fsdp-bf16-golden"], "lightning")
    path = tmp_path / export.filename
    path.write_text(export.text)  # as exported: the placeholder left in
    _pretend_gpus(monkeypatch, export.settings["trainer"]["devices"])
    monkeypatch.setattr("sys.argv", ["train.py"])

    class Module(lightning.LightningModule):
        pass

    with pytest.raises(SystemExit):
        LightningCLI(Module, run=False, args=["--config", str(path)], save_config_callback=None)
