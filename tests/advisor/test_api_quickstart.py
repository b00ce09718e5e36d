"""The README's Python API example (docs/examples/api_quickstart.py): it runs as written, and
the README shows exactly that file, so the two cannot drift apart."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from profilers.metrics_record import read_metrics
from profilers.profile_record import load_profile
from profilers.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "api_quickstart.py"
FENCED_PYTHON = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a markdown text."""
    return FENCED_PYTHON.findall(markdown)


def test_python_blocks_finds_each_fenced_block() -> None:
    text = "intro\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n\nc = 3\n```\n"
    assert python_blocks(text) == ["a = 1\n", "b = 2\n\nc = 3\n"]


def test_the_readme_shows_the_example_file() -> None:
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert EXAMPLE.read_text() in blocks, (
        "README.md has no ```python block equal to docs/examples/api_quickstart.py: paste the "
        "file into the README's Python API section"
    )


@pytest.mark.slow
def test_the_example_runs(tmp_path: Path) -> None:
    """As a user runs it: a script in its own directory (the relative runs/ lands there)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the library never prints (its 5 steps outlasted no warm-up)
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"chosen: fp32, \w+, micro-batch \d+ × \d+ accumulation", lines[0])
    assert re.fullmatch(r"predicted: [\d,]+ tokens/s", lines[1])
    assert re.fullmatch(r"measured: [\d,]+ tokens/s", lines[2])  # validate_top=1 measured it
    assert re.fullmatch(r"on an H100: [\d,]+ tokens/s \(estimate\)", lines[3])
    assert lines[4].startswith("TrainingArguments: {'output_dir': ")
    assert re.fullmatch(r"trained 5 steps: loss \d+\.\d{3}", lines[5])
    run = RunDir(tmp_path / "runs" / "quickstart")
    assert load_profile(run.profile).workload["model_args"] == {"n_layer": 1}
    plan = json.loads(run.plan.read_text())
    assert plan["config"]["global_batch_size"] == 8 and plan["config"]["precision"] == "fp32"
    args = json.loads((run.root / "training_args.json").read_text())
    assert args["per_device_train_batch_size"] == plan["config"]["micro_batch_size"]
    assert (
        (args["max_steps"], args["warmup_steps"]) == (5, 1) == (5, plan["config"]["warmup_steps"])
    )
    assert [r.step for r in read_metrics(run.train.metrics).train] == [1, 2, 3, 4, 5]
