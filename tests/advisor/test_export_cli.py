"""``advisor export``: the command writes the file (and hf's header next to it), prints to
stdout without --out, and turns bad input into one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from advisor.cli import main
from advisor.cli.export import FORMAT_CHOICES
from advisor.exporters import FORMATS, read_back
from tests.advisor.test_export import PLANS


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    PLANS["ddp-bf16-full"].save(run)
    return run


def test_cli_choices_are_the_library_formats() -> None:
    assert FORMAT_CHOICES == FORMATS


def test_export_run_directory_to_a_file(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    out = tmp_path / "cfg" / "ds.json"
    result = invoke("export", str(run), "--to", "deepspeed", "--out", str(out), "--steps", "50")
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    assert "launch: deepspeed --num_gpus 2 train.py" in result.output
    config = json.loads(out.read_text())
    assert config["train_batch_size"] == 16
    assert config["scheduler"]["params"]["total_num_steps"] == 50
    assert read_back("deepspeed", out.read_text())["world_size"] == 2


def test_hf_writes_the_header_next_to_the_json(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    out = tmp_path / "args.json"
    result = invoke("export", str(run / "plan.json"), "--to", "hf", "--out", str(out))
    assert result.exit_code == 0, result.output
    kw = json.loads(out.read_text())
    assert kw["per_device_train_batch_size"] == 4 and kw["gradient_accumulation_steps"] == 2
    sidecar = tmp_path / "args.json.advisor.txt"
    assert "no equivalent in hf" in sidecar.read_text()
    assert "launch: torchrun --standalone --nproc-per-node=2 train.py" in sidecar.read_text()


def test_out_directory_takes_the_default_file_name(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    result = invoke("export", str(run), "--to", "torchtitan", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "torchtitan.toml").read_text().startswith("# advisor export --to")
    new = tmp_path / "new"  # not there yet: the trailing slash says it is a directory
    result = invoke("export", str(run), "--to", "accelerate", "--out", f"{new}/")
    assert result.exit_code == 0, result.output
    assert (new / "accelerate_config.yaml").is_file()


def test_without_out_the_file_goes_to_stdout(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    result = invoke("export", str(run), "--to", "lightning")
    assert result.exit_code == 0, result.output
    assert "accumulate_grad_batches: 2" in result.output
    assert read_back("lightning", result.output)["world_size"] == 2


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = invoke("export", str(tmp_path), "--to", "hf")
    assert result.exit_code == 2
    assert "error: no plan at" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    bad = tmp_path / "plan.json"
    bad.write_text("[1, 2")
    result = invoke("export", str(bad), "--to", "hf")
    assert result.exit_code == 2 and "is not readable JSON" in result.output
    result = invoke("export", str(bad), "--to", "keras")
    assert result.exit_code == 2 and "'keras' is not one of" in result.output
    result = invoke("export", str(bad))
    assert result.exit_code == 2 and "Missing option '--to'" in result.output
