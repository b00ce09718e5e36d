"""A user's model file as users write it: a forward that breaks the contract is one line and
exit 2 wherever it is first run (train, profile), and a model file imports what sits beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from advisor.cli import main

MODEL = """
import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab_size=256, dim=32, layers=2):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab_size)

    def logits(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class Scalar(TinyLM):
    def forward(self, input_ids):
        return self.logits(input_ids).mean()  # a loss-like scalar, not logits


class Shifted(TinyLM):
    def forward(self, input_ids):
        return self.logits(input_ids)[:, :-1]  # one row short


class Loss(TinyLM):
    def forward(self, input_ids):
        return {"loss": self.logits(input_ids).mean()}  # no logits in it


class MaskRequired(TinyLM):
    def forward(self, input_ids, attention_mask):  # the contract is forward(input_ids)
        return self.logits(input_ids)


class MaskOptional(TinyLM):
    def forward(self, input_ids, attention_mask=None):
        return self.logits(input_ids)


def scalar():
    return Scalar()


def mask_required():
    return MaskRequired()


def mask_optional():
    return MaskOptional()


def shifted():
    return Shifted()


def loss():
    return Loss()
"""


def one_line(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "contract.py"
    path.write_text(MODEL)
    return path


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("scalar", "the model returned logits of shape () for input_ids of shape (2, 16)"),
        ("shifted", "the model returned logits of shape (2, 15, 256) for input_ids of shape"),
        ("loss", "the model returned dict, not logits"),
    ],
)
def test_train_names_what_the_forward_returned(
    model_file: Path, tmp_path: Path, factory: str, said: str
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "train", "--model", f"{model_file}:{factory}", "--steps", "1", "--seq-len", "16",
            "--micro-batch-size", "2", "--eval-every", "0", "--quiet",
            "--out", str(tmp_path / "run"),
            # a 1-step run with the default 20 warm-up steps is noted before the error
            "--warmup-steps", "0",
        ],
        prog_name="advisor",
    )  # fmt: skip
    line = one_line(result)
    assert line.startswith(f"error: {said}"), line
    assert "(batch, seq, vocab)" in line


def test_profile_stops_at_the_first_step_instead_of_recording_an_error_per_probe(
    model_file: Path, tmp_path: Path
) -> None:
    """Before, the profile went on to trace and time every group, each failing the same way,
    and exited 0 with nothing measured."""
    out = tmp_path / "profile"
    result = CliRunner().invoke(
        main,
        [
            "profile", "--model", f"{model_file}:scalar", "--seq-len", "16",
            "--budget-s", "20", "--no-comm", "--precision", "fp32", "--quiet",
            "--out", str(out),
        ],
        prog_name="advisor",
    )  # fmt: skip
    line = one_line(result)
    assert line.startswith("error: the model returned logits of shape () for input_ids"), line


@pytest.mark.parametrize("command", ["train", "profile"])
def test_a_forward_that_needs_more_than_input_ids_is_one_line_before_any_step(
    model_file: Path, tmp_path: Path, command: str
) -> None:
    """train printed a TypeError traceback (exit 1), profile exited 0 with every probe an
    error, and recommend then blamed the fake-tensor tracer."""
    extra = ["--steps", "1"] if command == "train" else ["--budget-s", "20", "--no-comm"]
    result = CliRunner().invoke(
        main,
        [command, "--model", f"{model_file}:mask_required", "--seq-len", "16", *extra,
         "--quiet", "--out", str(tmp_path / "run")],
        prog_name="advisor",
    )  # fmt: skip
    assert one_line(result) == (
        f"error: {model_file}:mask_required: its forward(input_ids, attention_mask) cannot be "
        "called with input_ids alone (TypeError: missing a required argument: "
        "'attention_mask'): the advisor calls model(input_ids); give the other parameters "
        "defaults"
    )
    assert not (tmp_path / "run" / "profile.json").exists()
    optional = CliRunner().invoke(
        main,
        ["train", "--model", f"{model_file}:mask_optional", "--seq-len", "16", "--steps", "1",
         "--quiet", "--out", str(tmp_path / "ok")],
        prog_name="advisor",
    )  # fmt: skip
    assert optional.exit_code == 0, optional.output


SIBLING = """
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.linear(x)
"""

USES_SIBLING = """
from torch import nn

from sibling_blocks import Block


class LM(nn.Module):
    def __init__(self, vocab_size=256, dim=32, layers=2):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def factory():
    return LM()
"""


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "sibling_blocks.py").write_text(SIBLING)
    (root / "lm_with_sibling.py").write_text(USES_SIBLING)
    return root


def _console_script() -> str:
    """The installed ``advisor`` script: unlike ``python -m advisor``, its sys.path lacks the
    working directory, which is what users run."""
    script = Path(sys.executable).parent / "advisor"
    if not script.exists():
        pytest.skip("no advisor console script beside this interpreter")
    return str(script)


def test_a_model_file_imports_the_module_beside_it_from_any_directory(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            _console_script(), "train", "--model", f"{project / 'lm_with_sibling.py'}:factory",
            "--steps", "1", "--seq-len", "16", "--micro-batch-size", "2", "--eval-every", "0",
            "--quiet", "--out", str(tmp_path / "run"),
        ],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("trained 1 steps")


def test_a_module_in_the_working_directory_loads_as_module_colon_factory(tmp_path: Path) -> None:
    """The spec the Python API records for a class defined in a module of the working
    directory (``lm_with_sibling:factory``), run by the console script from there."""
    project = _project(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            _console_script(), "train", "--model", "lm_with_sibling:factory", "--steps", "1",
            "--seq-len", "16", "--micro-batch-size", "2", "--eval-every", "0", "--quiet",
            "--out", str(tmp_path / "run"),
        ],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
