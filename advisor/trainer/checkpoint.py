"""Checkpoints: written atomically (temp file + fsync + rename), loaded with ``weights_only=True``.

A checkpoint holds everything a resumed run needs to continue bit for bit: model, optimizer,
grad scaler, LR scheduler, every RNG state and the data position (the next step index; the
sample order is a pure function of it). ``checkpoints/latest`` names the newest file.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1
_NAME = re.compile(r"^step_(\d{8})\.pt$")


def rng_state() -> dict[str, Any]:
    version, state, gauss = random.getstate()
    np_state = np.random.get_state()
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


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class CheckpointDir:
    path: Path
    keep_last: int = 2

    def file_for(self, step: int) -> Path:
        return self.path / f"step_{step:08d}.pt"

    def save(self, state: dict[str, Any], step: int) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.file_for(step)
        atomic_save({"format": FORMAT_VERSION, **state}, target)
        atomic_write_text(self.path / "latest", target.name + "\n")
        self._prune()
        return target

    def steps(self) -> list[int]:
        if not self.path.is_dir():
            return []
        found = (_NAME.match(p.name) for p in self.path.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> Path | None:
        pointer = self.path / "latest"
        if pointer.is_file():
            candidate = self.path / pointer.read_text().strip()
            if candidate.is_file():
                return candidate
        steps = self.steps()  # pointer lost: fall back to the newest complete file
        return self.file_for(steps[-1]) if steps else None

    def load(self, path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
        state: dict[str, Any] = torch.load(path, map_location=map_location, weights_only=True)
        if state.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{path} has checkpoint format {state.get('format')!r}, expected {FORMAT_VERSION}"
            )
        return state

    def _prune(self) -> None:
        for step in self.steps()[: -self.keep_last] if self.keep_last > 0 else []:
            self.file_for(step).unlink(missing_ok=True)
