"""Deterministic batches: the data order is a pure function of (seed, position).

Sample ``g`` of the run (``g = step * global_batch + k``) is a window starting at a position
drawn by hashing ``(seed, g)``; MLM masking draws from a generator seeded the same way. A
resumed run therefore sees exactly the batches it would have seen, whatever the number of
loader workers, and the k-th sample of a step is the same whether the global batch is split
into micro-batches, accumulation steps or ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from advisor.data.shards import ShardedTokens
from advisor.data.token_source import TokenSource
from advisor.models.objectives import Objective

_MASK64 = (1 << 64) - 1
_STREAM_WINDOW, _STREAM_EXAMPLE, _STREAM_VAL = 0x9E37, 0x85EB, 0xC2B2


def mix(*values: int) -> int:
    """splitmix64 over a tuple of ints (Steele et al. 2014): a fast, well-spread hash."""
    z = 0
    for value in values:
        z = (z + (value & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z


class WindowDataset(Dataset[dict[str, torch.Tensor]]):
    """Map-style dataset over an unbounded index: item ``g`` is the g-th sample of the run."""

    def __init__(
        self, source: TokenSource, split: str, seq_len: int, seed: int, objective: Objective
    ) -> None:
        self.source, self.split, self.seq_len = source, split, seq_len
        self.seed = seed if split == "train" else mix(seed, _STREAM_VAL)
        self.objective = objective
        # opened lazily in each worker process
        self._tokens: np.ndarray | ShardedTokens | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}

    def __len__(self) -> int:  # unbounded; the sampler decides which items are read
        return 1 << 62

    def window(self, index: int) -> torch.Tensor:
        h = mix(self.seed, index, _STREAM_WINDOW)
        if self.source.kind == "synthetic":
            gen = torch.Generator().manual_seed(h & 0x7FFF_FFFF_FFFF_FFFF)
            return torch.randint(self.source.vocab_size, (self.seq_len + 1,), generator=gen)
        if self._tokens is None:
            self._tokens = self.source.tokens(self.split)
        start = h % (len(self._tokens) - self.seq_len)
        return torch.from_numpy(self._tokens[start : start + self.seq_len + 1].astype(np.int64))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = None
        if self.objective.kind == "mlm":  # only masking draws random numbers
            gen = torch.Generator().manual_seed(mix(self.seed, index, _STREAM_EXAMPLE) >> 1)
        return self.objective.example(self.window(index), gen)

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """A whole micro-batch at once (the DataLoader's batched fetch): for causal LM on a
        token file, one numpy gather instead of a tensor, a dict and a collate per sample."""
        if self.source.kind == "synthetic" or self.objective.kind != "causal_lm":
            items = [self[i] for i in indices]
            return {k: torch.stack([item[k] for item in items]) for k in items[0]}
        if self._tokens is None:
            self._tokens = self.source.tokens(self.split)
        span = len(self._tokens) - self.seq_len
        starts = [mix(self.seed, i, _STREAM_WINDOW) % span for i in indices]
        rows = np.stack([self._tokens[s : s + self.seq_len + 1] for s in starts])
        windows = torch.from_numpy(rows.astype(np.int64))
        return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}


class StepSampler(Sampler[int]):
    """Sample indices of this rank's micro-batches, from ``start_step`` for ``num_steps`` steps.

    Within step ``s`` the global batch holds samples ``s*G .. s*G+G-1``; rank ``r``'s
    micro-batch ``m`` takes the ``micro_batch`` of them at ``(r*accum + m) * micro_batch``.
    """

    def __init__(
        self,
        *,
        start_step: int,
        num_steps: int,
        micro_batch: int,
        accum: int,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.start_step, self.num_steps = start_step, num_steps
        self.micro_batch, self.accum, self.rank, self.world = micro_batch, accum, rank, world

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accum * self.world

    def __len__(self) -> int:
        return self.num_steps * self.accum * self.micro_batch

    def __iter__(self) -> Iterator[int]:
        for step in range(self.start_step, self.start_step + self.num_steps):
            for m in range(self.accum):
                first = step * self.global_batch + (self.rank * self.accum + m) * self.micro_batch
                yield from range(first, first + self.micro_batch)


def make_loader(
    dataset: WindowDataset,
    sampler: Sampler[int],
    *,
    micro_batch: int,
    num_workers: int,
    pin_memory: bool,
) -> DataLoader[dict[str, torch.Tensor]]:
    return DataLoader(
        dataset,
        batch_size=micro_batch,
        collate_fn=_already_batched,  # type: ignore[arg-type]  # batched by __getitems__
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=False,
        prefetch_factor=4 if num_workers > 0 else None,
    )


def _already_batched(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return batch  # WindowDataset.__getitems__ returns a collated micro-batch


class DataUse(NamedTuple):
    """How much of its data a run draws: windows are drawn at hashed positions, with
    replacement, so a run that draws more tokens than its train split holds repeats them."""

    train_tokens: int  # tokens in the train split
    drawn_tokens: int  # steps x global batch x seq_len: the tokens the run trains on
    passes: float  # drawn_tokens / train_tokens
    val_windows: int  # distinct validation windows (one per start position; --val-data's own)
    eval_windows: int  # windows one evaluation draws (eval batches x global batch)


def data_use(
    source: TokenSource, *, steps: int, global_batch_size: int, seq_len: int, eval_batches: int = 0
) -> DataUse | None:
    """What a run of ``steps`` steps draws from ``source`` (None for synthetic data, which
    never repeats)."""
    if source.kind == "synthetic":
        return None
    train = source.num_tokens("train")
    drawn = steps * global_batch_size * seq_len
    return DataUse(
        train_tokens=train,
        drawn_tokens=drawn,
        passes=drawn / max(train, 1),
        val_windows=max(source.num_tokens("val") - seq_len, 0),
        eval_windows=eval_batches * global_batch_size,
    )


def repetition_notice(source: TokenSource, use: DataUse | None) -> str | None:
    """One line for stderr when the run repeats its data (more than one pass over the train
    split, or evaluations that draw more windows than the validation split has); else None."""
    if use is None:
        return None
    parts = []
    if use.passes > 1:
        parts.append(
            f"the run draws {use.drawn_tokens:,} tokens from {use.train_tokens:,} train tokens, "
            f"about {use.passes:,.1f} passes (windows at random positions, with replacement; "
            "more data or fewer --steps repeat less)"
        )
    if use.eval_windows > use.val_windows:
        # --val-data: its own windows, named (the line otherwise names --data alone)
        of = f" of --val-data {source.val.label or source.val.spec}" if source.val else ""
        parts.append(
            f"each evaluation draws {use.eval_windows:,} windows from {use.val_windows:,} "
            f"distinct validation windows{of} (fewer --eval-batches repeat less)"
        )
    return f"data {source.label or source.spec}: {'; '.join(parts)}" if parts else None
