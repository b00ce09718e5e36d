"""Checkpoints: written atomically (staging dir, fsync, rename), loaded ``weights_only=True``.

A checkpoint holds everything a resumed run needs to continue bit for bit: model, optimizer,
grad scaler, LR scheduler, every RNG state and the data position (the next step index; the
sample order is a pure function of it). ``checkpoints/latest`` names the newest one.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from advisor.errors import UsageProblem
from advisor.models.weights import (
    FIX,
    HF_DIR_FIX,
    HF_DIR_MISMATCH_FIX,
    WeightsSource,
    check_shapes,
    hf_weights,
    weights_file,
)
from profilers.rundir import (
    CHECKPOINT_NAME,
    LATEST_CHECKPOINT,
    RunDir,
    TrainDir,
    checkpoint_name,
    write_atomically,
)

FORMAT_VERSION = 1
MODEL_STATE = "state.pt"  # model + optimizer of a replicated (single, DDP) run
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index: an FSDP run's shards


def rng_state() -> dict[str, Any]:
    version, state, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": [version, list(state), gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, values, gauss = state["python"]
    random.setstate((version, tuple(values), gauss))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: Path) -> None:
    """Write ``obj`` so that ``path`` holds either the old or the complete new file, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class CheckpointDir:
    """``checkpoints/step_NNNNNNNN/`` directories, each written under a temporary name and
    renamed into place when complete, so a kill at any moment leaves only whole checkpoints.

    A checkpoint directory holds ``extra.pt`` (step, config, scheduler, RNG, data position,
    counters) and the model and optimizer: ``state.pt`` for a replicated model (single device,
    DDP; written by rank 0) or ``torch.distributed.checkpoint`` shards (FSDP; every rank).
    """

    path: Path
    keep_last: int  # advisor.trainer.options.RunOptions.keep_checkpoints

    def dir_for(self, step: int) -> Path:
        return self.path / checkpoint_name(step)

    def staging_dir(self, step: int) -> Path:
        return self.path / f".{checkpoint_name(step)}.tmp"

    def begin(self, step: int) -> Path:
        """Rank 0: a fresh, empty staging directory for ``step``."""
        staging = self.staging_dir(step)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def commit(self, step: int, extra: dict[str, Any]) -> Path:
        """Rank 0, after every rank wrote its part: add ``extra.pt``, rename into place."""
        staging = self.staging_dir(step)
        atomic_save({"format": FORMAT_VERSION, **extra}, staging / "extra.pt")
        for file in staging.iterdir():
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        target = self.dir_for(step)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        _fsync_dir(self.path)
        write_atomically(self.path / LATEST_CHECKPOINT, target.name + "\n", durable=True)
        self._prune()
        return target

    def steps(self) -> list[int]:
        if not self.path.is_dir():
            return []
        found = (CHECKPOINT_NAME.match(p.name) for p in self.path.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> Path | None:
        pointer = self.path / LATEST_CHECKPOINT
        if pointer.is_file():
            candidate = self.path / pointer.read_text().strip()
            if (candidate / "extra.pt").is_file():
                return candidate
        steps = self.steps()  # pointer lost: fall back to the newest complete directory
        return self.dir_for(steps[-1]) if steps else None

    @staticmethod
    def load_extra(path: Path) -> dict[str, Any]:
        state: dict[str, Any] = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
        if state.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{path} has checkpoint format {state.get('format')!r}, expected {FORMAT_VERSION}"
            )
        return state

    def _prune(self) -> None:
        for step in self.steps()[: -self.keep_last] if self.keep_last > 0 else []:
            shutil.rmtree(self.dir_for(step), ignore_errors=True)


# -- initial weights (--init-from, hf:DIR) -----------------------------------------------------


def initial_weights(model: str, init_from: str | None) -> WeightsSource | None:
    """Where a run's initial weights come from: ``init_from`` when given, else the weights in
    an ``hf:DIR`` model directory when it has any; None: the model's own random init.

    ``hf:DIR/config.json`` (the config file, not the directory) builds from the config only.
    """
    if init_from is not None:
        return resolve_init_from(init_from)
    if model.startswith("hf:"):
        directory = Path(model[3:]).expanduser()
        if directory.is_dir():
            return hf_weights(directory)
    return None


def weights_fix(model: str, init_from: str | None, model_args: Mapping[str, Any] | None) -> str:
    """What a mismatch of the initial weights tells the user to do. An ``hf:DIR``'s own
    weights: drop the --model-arg when some were given, else DIR's config.json is the culprit."""
    if init_from is None and model.startswith("hf:"):
        text = HF_DIR_FIX if model_args else HF_DIR_MISMATCH_FIX
        return text.format(directory=model[3:].rstrip("/"))
    return FIX


def check_initial_weights(
    model: str, model_args: dict[str, Any] | None, init_from: str | None
) -> None:
    """Refuse, before anything is profiled, initial weights that do not fit the model as built:
    the model is built on the meta device and the files' headers are read, not their values
    (the UsageProblem the load would raise at the first training step)."""
    source = initial_weights(model, init_from)
    if source is None:
        return
    from advisor.models import build_model

    adapter = build_model(model, model_args or {}, meta=True)
    check_shapes(adapter.module, source, model, fix=weights_fix(model, init_from, model_args))


def resolve_init_from(path: str) -> WeightsSource:
    """The weights ``--init-from PATH`` names: a weights file (.safetensors, .pt/.bin state
    dict, sharded index), a Hugging Face model directory, or a checkpoint of ours (a
    ``step_N`` directory, a ``checkpoints/`` directory, a training or run directory: the latest
    checkpoint in it)."""
    given = Path(path).expanduser()
    if given.name == LATEST_CHECKPOINT and given.is_file():
        # checkpoints/latest, the pointer the README names: the checkpoint it points to
        latest = CheckpointDir(given.parent, keep_last=0).latest()
        if latest is not None:
            given = latest
    if given.is_file():
        return weights_file(given)
    if not given.is_dir():
        raise UsageProblem(
            f"--init-from {path} does not exist: pass a .safetensors/.pt/.bin weights file, a "
            "Hugging Face model directory or a checkpoint directory of 'advisor train'"
        )
    found = _checkpoint_weights(given) or hf_weights(given)
    if found is None:
        raise UsageProblem(
            f"--init-from {path} holds no weights: no {MODEL_STATE} or distributed checkpoint, "
            "no checkpoints/ and no model.safetensors or pytorch_model.bin; pass the file or a "
            "checkpoint directory"
        )
    return found


def _checkpoint_weights(directory: Path) -> WeightsSource | None:
    """A checkpoint step directory, or the latest checkpoint under a checkpoints, training
    or run directory."""
    if (directory / MODEL_STATE).is_file():
        state = directory / MODEL_STATE
        return WeightsSource(path=state, kind="torch", files=(state,))
    if (directory / DCP_METADATA).is_file():
        return WeightsSource(path=directory, kind="dcp", files=())
    for checkpoints in (
        directory,
        TrainDir(directory).checkpoints,
        RunDir(directory).train.checkpoints,
    ):
        latest = CheckpointDir(checkpoints, keep_last=0).latest()
        if latest is not None:
            return _checkpoint_weights(latest)
    return None
