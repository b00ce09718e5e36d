"""Initial weights: ``hf:DIR`` loads DIR's weights, ``--init-from`` any saved weights.

The proof that weights were loaded is the loss at the first step: ``advisor train`` logs the
loss of its first optimizer step, computed before that step's update, so it must equal the loss
of the saved model on the trainer's first batch (computed here independently, with
``transformers.from_pretrained`` or a fresh model and ``load_state_dict``), and differ from the
loss of a random init.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result
from torch import nn

from advisor.cli import main
from advisor.data import StepSampler, WindowDataset, make_loader, resolve_data
from advisor.errors import UsageProblem
from advisor.models import build_model
from advisor.models.adapter import extract_logits
from advisor.models.objectives import lm_loss
from advisor.models.weights import (
    WeightsSource,
    check_shapes,
    load_weights,
    read_shapes,
    weights_file,
)
from advisor.trainer.checkpoint import initial_weights, resolve_init_from
from strategies.config import ConfigError, TrainConfig

transformers = pytest.importorskip("transformers")

HF_CONFIG = Path(__file__).resolve().parents[1] / "data" / "hf_tiny_gpt2" / "config.json"
SEQ_LEN, BATCH, SEED = 16, 4, 1337
TRAIN = ["--data", "synthetic", "--seq-len", str(SEQ_LEN), "--global-batch-size", str(BATCH)]
TRAIN += ["--micro-batch-size", str(BATCH), "--steps", "1", "--eval-every", "0", "--quiet"]
GPT_TINY = ["--model", "gpt-tiny", "--model-arg", "n_layer=1", "--model-arg", "n_embd=32"]


def gpt2_config() -> Any:
    """The test config without dropout: the trainer's first loss is then the model's loss."""
    data = json.loads(HF_CONFIG.read_text())
    data.pop("model_type")
    return transformers.GPT2Config(**data, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def perturbed_gpt2(seed: int = 7) -> nn.Module:
    """A tiny GPT-2 whose weights no init reproduces: its own init, then seeded noise."""
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(gpt2_config())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    perturbed_gpt2().save_pretrained(directory)
    assert (directory / "model.safetensors").is_file()
    return directory


def advisor(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="advisor")


def first_step_loss(out: Path) -> float:
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train" and record["step"] == 1:
            return float(record["loss"])
    raise AssertionError(f"no step 1 in {out}")


def first_batch(model_vocab: int) -> dict[str, torch.Tensor]:
    """The first micro-batch ``advisor train`` sees with TRAIN's flags (its own data code)."""
    source = resolve_data("synthetic", model_vocab=model_vocab, min_tokens=SEQ_LEN + 1)
    objective = build_model("gpt-tiny", meta=True).make_objective(source.vocab_size)
    dataset = WindowDataset(source, "train", SEQ_LEN, SEED, objective)
    sampler = StepSampler(start_step=0, num_steps=1, micro_batch=BATCH, accum=1)
    return next(
        iter(make_loader(dataset, sampler, micro_batch=BATCH, num_workers=0, pin_memory=False))
    )


def loss_of(module: nn.Module, batch: dict[str, torch.Tensor]) -> float:
    module.eval()
    with torch.no_grad():
        return float(lm_loss(extract_logits(module(batch["input_ids"])), batch["labels"]))


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# -- hf:DIR -------------------------------------------------------------------------------------


def test_hf_dir_trains_from_its_weights(hf_dir: Path, tmp_path: Path) -> None:
    result = advisor("train", "--model", f"hf:{hf_dir}", *TRAIN, "--out", str(tmp_path / "a"))
    assert result.exit_code == 0, result.output
    saved = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True)
    expected = loss_of(saved, first_batch(saved.config.vocab_size))
    assert first_step_loss(tmp_path / "a") == pytest.approx(expected, abs=1e-5)

    # The config file alone builds the same model with a random init: another loss.
    config_only = f"hf:{hf_dir / 'config.json'}"
    result = advisor("train", "--model", config_only, *TRAIN, "--out", str(tmp_path / "b"))
    assert result.exit_code == 0, result.output
    assert abs(first_step_loss(tmp_path / "b") - expected) > 0.05

    weights = json.loads((tmp_path / "a" / "train_config.json").read_text())["weights"]
    num_params = sum(p.numel() for p in saved.parameters())  # the tied head counted once
    assert weights["source"] == str(hf_dir / "model.safetensors")
    assert weights["num_params"] == num_params
    assert json.loads((tmp_path / "b" / "train_config.json").read_text())["weights"] is None


def test_train_prints_what_it_loaded(hf_dir: Path, tmp_path: Path) -> None:
    args = [a for a in TRAIN if a != "--quiet"]
    result = advisor("train", "--model", f"hf:{hf_dir}", *args, "--out", str(tmp_path / "a"))
    assert result.exit_code == 0, result.output
    num_params = sum(p.numel() for p in perturbed_gpt2().parameters())
    assert f"weights: {hf_dir / 'model.safetensors'} ({num_params:,} params)" in result.output


def test_resume_keeps_the_record_of_the_initial_weights(hf_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = advisor("train", "--model", f"hf:{hf_dir}", *TRAIN, "--out", str(out))
    assert first.exit_code == 0, first.output
    record = json.loads((out / "train_config.json").read_text())["weights"]
    longer = [a if a != "1" else "2" for a in TRAIN]  # --steps 2
    resumed = advisor("train", "--model", f"hf:{hf_dir}", *longer, "--out", str(out), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "train_config.json").read_text())["weights"] == record
    assert record["source"] == str(hf_dir / "model.safetensors")


def _save_bin(model: nn.Module, directory: Path) -> None:
    directory.mkdir()
    torch.save(model.state_dict(), directory / "pytorch_model.bin")


def _save_sharded(model: nn.Module, directory: Path) -> None:
    model.save_pretrained(directory, max_shard_size="20KB")
    assert (directory / "model.safetensors.index.json").is_file()


def _save_base_model(model: Any, directory: Path) -> None:
    """The base model's keys (``h.0...``, no ``transformer.`` prefix), as old GPT-2 files."""
    directory.mkdir()
    torch.save(model.transformer.state_dict(), directory / "pytorch_model.bin")


def _save_ddp_prefixed(model: nn.Module, directory: Path) -> None:
    directory.mkdir()
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    torch.save({"model": state, "step": torch.tensor(3)}, directory / "pytorch_model.bin")


@pytest.mark.parametrize(
    "save",
    [_save_bin, _save_sharded, _save_base_model, _save_ddp_prefixed],
    ids=lambda f: f.__name__,
)
def test_every_weights_layout_loads_the_same_values(save: Any, tmp_path: Path) -> None:
    saved = perturbed_gpt2()
    directory = tmp_path / "model"
    save(saved, directory)
    source = initial_weights(f"hf:{directory}", None)
    assert source is not None
    adapter = build_model(f"hf:{HF_CONFIG}")
    loaded = load_weights(adapter.module, source, "tiny-gpt2")
    assert loaded.num_params == sum(p.numel() for p in saved.parameters())
    ours, theirs = adapter.module.state_dict(), saved.state_dict()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


def _save_legacy_bin(model: nn.Module, directory: Path) -> None:
    """A PyTorch file of the old, non-zip format: its header cannot be read alone."""
    directory.mkdir()
    torch.save(
        model.state_dict(), directory / "pytorch_model.bin", _use_new_zipfile_serialization=False
    )


@pytest.mark.parametrize(
    "save",
    [_save_bin, _save_sharded, _save_base_model, _save_ddp_prefixed, _save_legacy_bin],
    ids=lambda f: f.__name__,
)
def test_the_header_check_refuses_what_the_load_refuses(save: Any, tmp_path: Path) -> None:
    """check_shapes (headers only, a meta model) accepts each layout the load accepts, and
    refuses a wider model with the load's own message, without reading a value."""
    directory = tmp_path / "model"
    save(perturbed_gpt2(), directory)
    source = initial_weights(f"hf:{directory}", None)
    assert source is not None
    check_shapes(build_model(f"hf:{HF_CONFIG}", meta=True).module, source, "tiny-gpt2")
    wider = {"n_embd": 64}
    if save is _save_legacy_bin:  # unreadable without loading: left to the load
        assert read_shapes(source) is None
        return
    shapes = read_shapes(source)
    assert shapes is not None and all(t.device.type == "meta" for t in shapes.values())
    with pytest.raises(UsageProblem) as by_header:
        check_shapes(build_model(f"hf:{HF_CONFIG}", wider, meta=True).module, source, "m")
    with pytest.raises(UsageProblem) as by_load:
        load_weights(build_model(f"hf:{HF_CONFIG}", wider).module, source, "m")
    assert str(by_header.value) == str(by_load.value)
    assert " tensor(s) differ in shape, e.g. " in str(by_header.value)


def test_the_header_check_reads_a_distributed_checkpoint(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model = build_model("gpt-tiny", {"n_layer": 1, "n_embd": 32}).module
    step = tmp_path / "step_00000002"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(step), no_dist=True)
    source = WeightsSource(path=step, kind="dcp", files=())
    check_shapes(
        build_model("gpt-tiny", {"n_layer": 1, "n_embd": 32}, meta=True).module, source, "a"
    )
    with pytest.raises(UsageProblem, match=r"does not match b: 12 model tensor\(s\) missing"):
        check_shapes(
            build_model("gpt-tiny", {"n_layer": 2, "n_embd": 32}, meta=True).module, source, "b"
        )


def test_a_distributed_checkpoint_loads_in_one_process_without_a_warning(
    tmp_path: Path,
) -> None:
    """An FSDP checkpoint read whole in one process (--init-from, advisor.train(init_from=)):
    torch's 'torch.distributed is disabled ...' UserWarning reached the API's caller, though
    one process was the intent."""
    import warnings

    import torch.distributed.checkpoint as dcp

    model = build_model("gpt-tiny", {"n_layer": 1, "n_embd": 32}).module
    step = tmp_path / "step_00000002"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the test's own save warns the same
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(step), no_dist=True)
    fresh = build_model("gpt-tiny", {"n_layer": 1, "n_embd": 32}).module
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_weights(fresh, WeightsSource(path=step, kind="dcp", files=()), "a")
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_run_refuses_weights_of_another_model_before_it_profiles(
    hf_dir: Path, tmp_path: Path
) -> None:
    """Weights that do not fit failed advisor run at its train stage, after the profile's
    budget and the search: refused now before the first probe, with the train stage's line."""
    out = tmp_path / "run"
    args = ["--data", "synthetic", "--seq-len", str(SEQ_LEN), "--budget-s", "30", "--quiet"]
    line = one_line_error(
        advisor("run", *GPT_TINY, *args, "--init-from", str(hf_dir), "--out", str(out))
    )
    assert line.startswith(f"error: {hf_dir / 'model.safetensors'} does not match gpt-tiny: ")
    assert line.endswith("pass weights saved from this model (the same --model and --model-arg)")
    assert not (out / "profile.json").exists()
    wide = ["--model-arg", "n_embd=64"]
    line = one_line_error(
        advisor("run", "--model", f"hf:{hf_dir}", *wide, *args, "--out", str(out))
    )
    assert " does not fit hf:" in line and line.endswith(f"--model hf:{hf_dir}/config.json")
    assert not (out / "profile.json").exists()


# -- --init-from --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training directory of gpt-tiny after two steps."""
    out = tmp_path_factory.mktemp("trained") / "run"
    args = [a if a != "1" else "2" for a in TRAIN]  # --steps 2
    result = advisor("train", *GPT_TINY, *args, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_init_from_our_checkpoint_starts_from_its_weights(trained: Path, tmp_path: Path) -> None:
    step_dir = trained / "checkpoints" / "step_00000002"
    pointer = trained / "checkpoints" / "latest"  # the file the README names
    for given in (trained, trained / "checkpoints", pointer, step_dir, step_dir / "state.pt"):
        assert resolve_init_from(str(given)).path == step_dir / "state.pt"
    out = tmp_path / "finetune"
    result = advisor("train", *GPT_TINY, *TRAIN, "--init-from", str(trained), "--out", str(out))
    assert result.exit_code == 0, result.output

    adapter = build_model("gpt-tiny", {"n_layer": 1, "n_embd": 32})
    random_init = loss_of(adapter.module, first_batch(adapter.vocab_size))
    state = torch.load(step_dir / "state.pt", weights_only=True)["model"]
    adapter.module.load_state_dict(state)
    expected = loss_of(adapter.module, first_batch(adapter.vocab_size))
    assert first_step_loss(out) == pytest.approx(expected, abs=1e-5)
    assert abs(expected - random_init) > 1e-3
    config = json.loads((out / "train_config.json").read_text())["config"]
    assert config["init_from"] == str(trained)


def test_plan_carries_init_from(trained: Path, tmp_path: Path) -> None:
    """``advisor train --plan`` starts from the plan's initial weights, as a run's plan says."""
    config = TrainConfig(
        model="gpt-tiny",
        model_args={"n_layer": 1, "n_embd": 32},
        data="synthetic",
        seq_len=SEQ_LEN,
        global_batch_size=BATCH,
        micro_batch_size=BATCH,
        init_from=str(trained),
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"config": config.to_dict()}))
    out = tmp_path / "from-plan"
    result = advisor("train", "--plan", str(plan), "--steps", "1", "--quiet", "--out", str(out))
    assert result.exit_code == 0, result.output
    direct = tmp_path / "direct"
    result = advisor("train", *GPT_TINY, *TRAIN, "--init-from", str(trained), "--out", str(direct))
    assert result.exit_code == 0, result.output
    assert first_step_loss(out) == first_step_loss(direct)


def test_init_from_is_validated_as_a_path() -> None:
    with pytest.raises(ConfigError, match="init_from must be the path"):
        TrainConfig(init_from="  ")
    assert TrainConfig.from_dict(TrainConfig(init_from="w.pt").to_dict()).init_from == "w.pt"


def test_run_passes_init_from_into_its_plan(trained: Path, tmp_path: Path) -> None:
    from advisor.recommending import base_config
    from advisor.run import RunRequest
    from strategies.space import SearchRequest
    from tests.strategies.profiles import hand_profile

    request = RunRequest(config_overrides={"init_from": str(trained)})
    command = request.command(tmp_path / "run")
    assert command[command.index("--init-from") + 1] == str(trained)
    search = SearchRequest(global_batch_size=8, config_overrides=request.config_overrides)
    assert base_config(hand_profile(), search).init_from == str(trained)


@pytest.mark.slow
def test_run_fine_tunes_a_downloaded_model_end_to_end(hf_dir: Path, tmp_path: Path) -> None:
    """``advisor run --model hf:DIR``: probes on a random init, the trained run from DIR."""
    run = tmp_path / "run"
    args = ["run", "--model", f"hf:{hf_dir}", "--data", "synthetic", "--seq-len", str(SEQ_LEN)]
    # The least profile/validation that still runs every stage: one precision, no checkpointing
    # settings to probe, one validation round, eval at the end only. The device benchmarks, first
    # real step and baseline timing run whatever the budget, so 12 s cannot starve the plan.
    args += ["--global-batch-size", str(BATCH), "--steps", "2", "--budget-s", "12"]
    args += ["--precision", "fp32", "--checkpointing", "none", "--no-comm", "--eval-every", "0"]
    args += ["--validate-top", "1", "--validate-rounds", "1", "--quiet"]
    proc = subprocess.run(
        [sys.executable, "-m", "advisor", *args, "--out", str(run)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True)
    expected = loss_of(saved, first_batch(saved.config.vocab_size))
    assert first_step_loss(run / "train") == pytest.approx(expected, abs=1e-5)
    weights = json.loads((run / "train" / "train_config.json").read_text())["weights"]
    assert weights["source"] == str(hf_dir / "model.safetensors")


# -- errors -------------------------------------------------------------------------------------


def test_missing_init_from_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    result = advisor("train", *GPT_TINY, *TRAIN, "--init-from", str(missing))
    assert result.exit_code == 2
    assert "does not exist" in result.output
    with pytest.raises(UsageProblem, match=r"nope.pt does not exist: pass a \.safetensors"):
        resolve_init_from(str(missing))


def test_keys_that_do_not_match_name_a_few_and_the_fix(hf_dir: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    line = one_line_error(
        advisor("train", *GPT_TINY, *TRAIN, "--init-from", str(hf_dir), "--out", out)
    )
    assert line.startswith(f"error: {hf_dir / 'model.safetensors'} does not match gpt-tiny: ")
    assert "model tensor(s) missing from it (" in line and "unexpected (transformer." in line
    assert line.endswith("pass weights saved from this model (the same --model and --model-arg)")


def test_shape_mismatch_names_the_tensors(hf_dir: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    wider = ["--model-arg", "n_embd=64"]
    line = one_line_error(advisor("train", "--model", f"hf:{hf_dir}", *wider, *TRAIN, "--out", out))
    assert " does not fit hf:" in line
    assert "transformer.wte.weight (128, 32) in the file, (128, 64) in the model" in line
    # DIR's own weights: the fix is to drop the shape-changing arg or build from the config
    assert line.endswith(
        f"{hf_dir}'s weights are of the model its config.json describes: drop the --model-arg "
        "that change its shape, or build from the config alone (random init) with "
        f"--model hf:{hf_dir}/config.json"
    )


def test_a_file_without_a_state_dict(tmp_path: Path) -> None:
    path = tmp_path / "notes.pt"
    torch.save({"step": 3, "lr": 0.1}, path)
    line = one_line_error(advisor("train", *GPT_TINY, *TRAIN, "--init-from", str(path)))
    assert line == (
        f"error: {path} holds no state dict of tensors: save it with "
        "torch.save(model.state_dict(), PATH)"
    )


def test_a_directory_without_weights(tmp_path: Path) -> None:
    with pytest.raises(UsageProblem, match="holds no weights"):
        resolve_init_from(str(tmp_path))
    assert initial_weights(f"hf:{HF_CONFIG.parent}", None) is None  # a config-only dir


class Payload:
    """An arbitrary object: ``weights_only=True`` refuses to unpickle it."""


def test_torch_files_are_read_with_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "pickled.pt"
    torch.save({"weight": torch.zeros(2), "obj": Payload()}, path)
    with pytest.raises(UsageProblem, match=r"cannot read .* as a PyTorch weights file"):
        load_weights(nn.Linear(2, 2), weights_file(path), "linear")
