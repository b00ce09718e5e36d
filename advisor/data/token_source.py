"""A token stream on disk (:class:`TokenSource`) and the cache its files live in.

Shared by the sources (advisor.data.sources) and the tokenizer cache (advisor.data.tokenized),
neither of which imports the other's internals.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from advisor.data.shards import ShardedTokens

VAL_FRACTION = 0.1
BYTE_VOCAB = 256


@dataclass(frozen=True)
class TokenSource:
    """Picklable description of a token stream; ``tokens(split)`` memory-maps it."""

    spec: str
    kind: str  # stdlib | text | jsonl | bin | npy | synthetic | tokenized
    vocab_size: int
    paths: tuple[str, str] | None = None  # (train, val) files, or None for synthetic
    split_at: int | None = None  # single-file sources: first val token
    dtype: str = "uint8"
    mask_token_id: int | None = None
    description: str = ""
    offset: int = 0  # bytes before the first id (a .npy file's header)
    label: str = ""  # what the data is, without its size (a tokenized description starts so)
    # ``--val-data``: the validation set, the whole of its own source (its "val" tokens); None:
    # the validation split of this one
    val: TokenSource | None = None
    # A directory of shards (advisor.data.shards): the (train, val) files, each split read as
    # one stream in this order; ``paths`` then names the first of each. None: ``paths`` alone.
    shards: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    def tokens(self, split: str) -> np.ndarray | ShardedTokens:
        assert split in ("train", "val"), split
        if split == "val" and self.val is not None:
            return self.val.tokens("val")
        assert self.paths is not None, "synthetic data has no token file"
        if self.shards is not None:
            parts = [self._mapped(path) for path in self.shards[split == "val"]]
            return parts[0] if len(parts) == 1 else ShardedTokens(parts)  # (none: empty)
        train_path, val_path = self.paths
        data = self._mapped(
            train_path if split == "train" or self.split_at is not None else val_path
        )
        if self.split_at is not None:  # one file, split by position
            return data[: self.split_at] if split == "train" else data[self.split_at :]
        return data

    def _mapped(self, path: str) -> np.ndarray:
        """The ids of one file, memory-mapped past ``offset``."""
        if os.path.getsize(path) <= self.offset:  # numpy cannot memory-map an empty file
            return np.empty(0, dtype=self.dtype)
        return np.memmap(path, dtype=self.dtype, mode="r", offset=self.offset)

    def num_tokens(self, split: str) -> int:
        return 0 if self.kind == "synthetic" else len(self.tokens(split))


def cache_dir() -> Path:
    root = os.environ.get("ADVISOR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "transformer-advisor"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A file written piece by piece that appears at ``path`` complete or not at all: a
    temporary file beside it (named per process), renamed on success, removed on failure."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
