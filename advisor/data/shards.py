"""Token-id shards as llm.c writes them, and directories of shards.

llm.c's ``dev/data/data_common.py`` (karpathy/llm.c; modded-nanogpt's FineWeb shards and the
many projects that copied it) writes a ``.bin`` as a header of 256 little-endian int32 —
``[0]`` a magic that names the token width, ``[1]`` a version, ``[2]`` the number of tokens —
followed by the ids: magic 20240520 version 1 for GPT-2's uint16 ids, magic 20240801 version 7
for LLaMA 3's uint32 ids. Read as plain uint16 ids, the header trained as 512 tokens (the magic
read as id 55,240, past GPT-2's vocabulary), silently. A data set comes as a directory of such
shards, ``fineweb_val_000000.bin`` and ``fineweb_train_000001.bin`` ...: the files whose names
say ``train`` and ``val`` are the two splits, each read as one stream (:class:`ShardedTokens`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advisor.errors import UsageProblem

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# magic -> (version, id dtype, what writes it): llm.c's HEADERS_INFO.
FORMATS: dict[int, tuple[int, str, str]] = {
    20240520: (1, "uint16", "GPT-2"),
    20240801: (7, "uint32", "LLaMA 3"),
}
# llm.c's write_evalfile: multiple-choice examples (HellaSwag), not a stream of tokens.
EVAL_MAGIC = 20240522
# A shard's split, from its name: a word "train" or "val" ("valid", "validation") between
# separators or at either end (fineweb_train_000001.bin, val.bin, shakespeare-validation.bin;
# not "interval" or "retrain").
_SPLIT_WORD = {
    "train": re.compile(r"(?:^|[^a-z])train(?:[^a-z]|$)"),
    "val": re.compile(r"(?:^|[^a-z])val(?:id(?:ation)?)?(?:[^a-z]|$)"),
}


@dataclass(frozen=True)
class ShardHeader:
    """What an llm.c header says: the ids' dtype, how many follow, who writes the format."""

    dtype: str
    num_tokens: int
    writer: str


def shard_header(path: Path) -> ShardHeader | None:
    """The llm.c header of ``path``, or None when the file does not start with one of its
    magics. A header whose version, token count or file size disagree with the format is
    refused: the file was cut short, or is another format that starts the same way."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < 4:
        return None
    magic = int.from_bytes(head[:4], "little", signed=True)
    if magic == EVAL_MAGIC:
        raise UsageProblem(
            f"{path} holds llm.c evaluation examples (magic {EVAL_MAGIC}: multiple-choice "
            "items such as HellaSwag's), not a token stream: pass token shards (llm.c's "
            "fineweb_val_000000.bin) or token ids"
        )
    if magic not in FORMATS:
        return None
    version, dtype, writer = FORMATS[magic]
    if len(head) < HEADER_BYTES:
        raise UsageProblem(
            f"{path} starts with llm.c's {writer} token-shard magic ({magic}) but is shorter "
            f"than its {HEADER_BYTES}-byte header ({len(head)} bytes): the file was cut short; "
            "write or download it again"
        )
    ints = np.frombuffer(head, dtype="<i4")
    if int(ints[1]) != version:
        raise UsageProblem(
            f"{path} is an llm.c {writer} token shard of version {int(ints[1])}, not {version}: "
            f"only version {version} ({dtype} ids after a {HEADER_BYTES}-byte header) is read; "
            "write it with llm.c's dev/data/data_common.py write_datafile"
        )
    count = int(ints[2])
    expected = HEADER_BYTES + count * np.dtype(dtype).itemsize
    size = path.stat().st_size
    if count < 0 or size != expected:
        raise UsageProblem(
            f"{path}: its llm.c header promises {count:,} {dtype} tokens ({expected:,} bytes "
            f"with the header), but the file has {size:,} bytes: it was cut short or written "
            "by something else; write or download it again"
        )
    return ShardHeader(dtype=dtype, num_tokens=count, writer=writer)


def split_of(name: str) -> str | None:
    """``train`` or ``val`` when a shard's file name says which split it is, else None."""
    stem = name.lower()
    hits = [split for split, word in _SPLIT_WORD.items() if word.search(stem)]
    return hits[0] if len(hits) == 1 else None


def directory_shards(directory: Path) -> dict[str, list[Path]]:
    """The ``.bin`` files of ``directory`` (any case, not in subdirectories), sorted by name,
    by the split their name says ("train" or "val"); the ones that say neither under "".
    """
    found: dict[str, list[Path]] = {"train": [], "val": [], "": []}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.suffix.lower() == ".bin":
            found[split_of(path.name) or ""].append(path)
    return found


class ShardedTokens:
    """Several token arrays read as one stream: ``len()`` and slices ``[a:b]`` (a window that
    spans two shards is joined from both), what the data loader asks of a token array."""

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self.parts = [part for part in parts if len(part)]
        self.ends = [int(end) for end in np.cumsum([len(part) for part in self.parts])]
        self.dtype = parts[0].dtype if parts else np.dtype("uint16")

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("sharded tokens are read in slices: tokens[start:stop]")
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("sharded tokens are read in contiguous slices (step 1)")
        pieces: list[np.ndarray] = []
        shard = bisect.bisect_right(self.ends, start)
        while start < stop:
            begin = self.ends[shard - 1] if shard else 0
            end = min(stop, self.ends[shard])
            pieces.append(self.parts[shard][start - begin : end - begin])
            start, shard = end, shard + 1
        if not pieces:
            return np.empty(0, dtype=self.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


@dataclass(frozen=True)
class ShardSet:
    """The shards of one split: their paths, the ids' dtype and where the ids start in each
    file (all alike: llm.c shards of one writer, or raw uint16 files)."""

    paths: tuple[str, ...]
    dtype: str
    offset: int
    counts: tuple[int, ...]  # the tokens of each shard, in order
    writer: str | None  # llm.c's writer ("GPT-2", "LLaMA 3"), None for raw uint16 ids

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)


def shard_set(paths: Sequence[Path]) -> ShardSet:
    """The shards ``paths`` (one split, in order) read alike: every one an llm.c shard of the
    same writer, or every one raw uint16 ids; a mix is refused, naming one of each."""
    kinds: dict[str | None, Path] = {}
    counts: list[int] = []
    dtype = "uint16"
    for path in paths:
        header = shard_header(path)
        writer = header.writer if header else None
        kinds.setdefault(writer, path)
        if header is not None:
            dtype = header.dtype
            counts.append(header.num_tokens)
        else:
            size = path.stat().st_size
            if size % 2:
                raise UsageProblem(
                    f"{path} has an odd size ({size:,} bytes): a .bin holds uint16 token ids, 2 "
                    "bytes each (or an llm.c header and its ids)"
                )
            counts.append(size // 2)
    if len(kinds) > 1:
        named = "; ".join(
            f"{path.name}: {f'llm.c {writer} shard' if writer else 'raw uint16 ids'}"
            for writer, path in kinds.items()
        )
        raise UsageProblem(
            f"the shards of {paths[0].parent} mix formats ({named}): write them all with one writer"
        )
    writer = next(iter(kinds), None)
    return ShardSet(
        paths=tuple(str(p) for p in paths),
        dtype=dtype,
        offset=HEADER_BYTES if writer else 0,
        counts=tuple(counts),
        writer=writer,
    )
