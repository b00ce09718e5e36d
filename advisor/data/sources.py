"""Token sources for ``--data``: where the token ids come from, split into train and val.

* ``stdlib`` (default): the Python standard library's own ``.py`` sources — real text on every
  machine with no download — as byte-level tokens (vocab 256). Files are assigned to train or
  val by a hash of their relative path, so the split is deterministic for a Python version.
* a text file: its bytes are the tokens (vocab 256); the last 10% is the validation split.
  A file that is not text (NUL bytes, an archive's magic ...) is refused (advisor.data.formats).
* ``FILE.jsonl`` (or ``.json`` lines, ``FILE.jsonl:FIELD``): the documents of each line's
  ``"text"`` field, read as a text file is.
* ``FILE.bin``: uint16 token ids (nanoGPT format); last 10% is val. A directory holding
  ``train.bin`` and ``val.bin`` uses those two files. ``FILE.npy``: integer token ids.
* ``synthetic``: random tokens over the model's vocabulary, for probes and smoke tests.
* with ``--tokenizer DIR`` (a local Hugging Face tokenizer, extra ``hf``), text sources are
  tokenized once and cached as token-id files.

Token arrays are memory-mapped from files (the cache for ``stdlib`` and tokenized text), so data
loader workers open them cheaply under any multiprocessing start method.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

import numpy as np

from advisor.data.formats import (
    id_range,
    is_npy,
    jsonl_source,
    jsonl_spec,
    npy_source,
    refuse_binary,
)
from advisor.data.token_source import BYTE_VOCAB, VAL_FRACTION, TokenSource, cache_dir
from advisor.data.tokenized import TEXT_KINDS, model_tokenizer, tokenize_source
from advisor.errors import UsageProblem
from profilers.rundir import write_atomically


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def _stdlib_source() -> TokenSource:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    if not files:
        raise UsageProblem(f"no .py files under {root}: pass --data FILE instead of stdlib")
    listing = "\n".join(f"{p.relative_to(root)}:{p.stat().st_size}" for p in files)
    key = hashlib.sha1(listing.encode()).hexdigest()[:16]
    base = cache_dir() / f"stdlib-{key}"
    train_path, val_path = base.with_suffix(".train.u8"), base.with_suffix(".val.u8")
    if not (train_path.exists() and val_path.exists()):
        parts: dict[str, list[bytes]] = {"train": [], "val": []}
        for path in files:
            rel = str(path.relative_to(root))
            bucket = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 10
            parts["val" if bucket == 0 else "train"].append(path.read_bytes() + b"\n\n")
        write_atomically(train_path, b"".join(parts["train"]))
        write_atomically(val_path, b"".join(parts["val"]))
    label = f"Python {sysconfig.get_python_version()} standard library sources"
    return TokenSource(
        spec="stdlib",
        kind="stdlib",
        vocab_size=BYTE_VOCAB,
        paths=(str(train_path), str(val_path)),
        description=f"{label} ({len(files)} files, byte-level)",
        label=f"{label} ({len(files)} files)",
    )


def _single_file(spec: str, path: Path, dtype: str, vocab: int, kind: str) -> TokenSource:
    n = path.stat().st_size // np.dtype(dtype).itemsize
    split_at = int(n * (1 - VAL_FRACTION))
    return TokenSource(
        spec=spec,
        kind=kind,
        vocab_size=vocab,
        paths=(str(path), str(path)),
        split_at=split_at,
        dtype=dtype,
        description=f"{path.name} ({n:,} tokens)",
        label=path.name,
    )


# Token ids a .bin's first words are checked on: enough that every second one being 0 is no
# coincidence of real text.
WIDTH_SAMPLE = 1 << 20
WIDTH_SAMPLE_MIN = 64


def _refuse_wider_ids(path: Path) -> None:
    """A .bin of 32- or 64-bit ids (``np.uint32``/``int64``: ids under 65,536 little-endian)
    read as uint16 has every second word 0: it trained on every other token being id 0,
    silently. Refused, with how to write the file."""
    words = np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else None
    if words is None or len(words) < WIDTH_SAMPLE_MIN:
        return
    head = np.asarray(words[: min(len(words), WIDTH_SAMPLE) // 2 * 2]).reshape(-1, 2)
    if not head[:, 1].any() and head[:, 0].any():
        raise UsageProblem(
            f"{path} looks like 32- or 64-bit token ids (every second 16-bit word is 0): a .bin "
            "holds uint16 ids, as nanoGPT writes them; save it with "
            "np.array(ids, dtype=np.uint16).tofile(...)"
        )


def _bin_vocab(paths: list[Path]) -> int:
    top = 0
    for path in paths:
        if path.stat().st_size == 0:
            continue
        top = max(top, id_range(np.memmap(path, dtype=np.uint16, mode="r"))[1])
    return top + 1


def resolve_data(
    spec: str,
    *,
    tokenizer: str | None = None,
    model_vocab: int | None = None,
    min_tokens: int = 2,
    model: str | None = None,
) -> TokenSource:
    """The token source named by ``--data`` (``min_tokens``: each split must hold a window).
    Text for an ``hf:DIR`` ``model`` that ships a tokenizer is tokenized with it when
    ``tokenizer`` is None (:func:`advisor.data.tokenized.model_tokenizer`). ``model_vocab``
    (the model's vocabulary; synthetic data draws from it, 256 if None): a tokenizer larger
    than it is refused before it tokenizes anything."""
    if spec == "synthetic":
        if tokenizer:
            raise UsageProblem("--tokenizer has no effect on synthetic data: drop it")
        vocab = BYTE_VOCAB if model_vocab is None else model_vocab
        return TokenSource(
            spec=spec,
            kind="synthetic",
            vocab_size=vocab,
            description=f"random tokens over {vocab} ids",
        )
    source = _stdlib_source() if spec == "stdlib" else _file_source(spec)
    if tokenizer and source.kind not in TEXT_KINDS:
        raise UsageProblem(
            f"--tokenizer applies to text data, not .{source.kind} token ids: drop it"
        )
    name = tokenizer or model_tokenizer(model)  # the model directory's own, by default
    if name and source.kind in TEXT_KINDS:
        source = tokenize_source(
            source, name, own=not tokenizer, model_vocab=model_vocab, model=model
        )
    for split in ("train", "val"):
        if source.num_tokens(split) < min_tokens:
            raise UsageProblem(
                f"data {spec!r} has {source.num_tokens(split)} {split} tokens, fewer than one "
                f"window of {min_tokens}: use more text or a shorter --seq-len"
            )
    return source


def _file_source(spec: str) -> TokenSource:
    """A file or directory named by ``--data``, by its suffix (``.bin``, ``.npy``, ``.jsonl``
    in any case) or else as text."""
    if (jsonl := jsonl_spec(spec)) is not None:
        refuse_binary(jsonl[0])
        return jsonl_source(spec, *jsonl)
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageProblem(
            f"data {spec!r} does not exist: pass stdlib, synthetic, a text file, a .jsonl of "
            '"text" lines, a .bin of uint16 token ids, a .npy of integer token ids, or a '
            "directory with train.bin and val.bin"
        )
    if path.is_dir():
        train, val = path / "train.bin", path / "val.bin"
        if not (train.is_file() and val.is_file()):
            # Which one is missing, and what else would do: "needs train.bin and val.bin" left
            # a directory of one train.bin (or of a .npy or text) without a way forward.
            missing = " and ".join(p.name for p in (train, val) if not p.is_file())
            alone = (
                f", or pass {train} alone (its last 10% is validation)" if train.is_file() else ""
            )
            raise UsageProblem(
                f"directory {path} has no {missing}: a --data directory holds train.bin and "
                f"val.bin of uint16 token ids (nanoGPT's format){alone}; a file of ids or text "
                "is passed as the file itself"
            )
        for part in (train, val):
            _refuse_wider_ids(part)
        return TokenSource(
            spec=spec,
            kind="bin",
            vocab_size=_bin_vocab([train, val]),
            paths=(str(train), str(val)),
            dtype="uint16",
            # The counts too: a resume tells a train.bin written again by its size (loop).
            description=f"{path}/{{train,val}}.bin ({train.stat().st_size // 2:,} + "
            f"{val.stat().st_size // 2:,} tokens)",
        )
    if path.suffix.lower() == ".bin":
        if path.stat().st_size % 2:
            raise UsageProblem(
                f"{path} has an odd size ({path.stat().st_size:,} bytes): a .bin holds uint16 "
                "token ids, 2 bytes each; write them with np.asarray(ids, dtype=np.uint16)"
                ".tofile(path), or save another dtype as a .npy"
            )
        _refuse_wider_ids(path)
        return _single_file(spec, path, "uint16", _bin_vocab([path]), "bin")
    if is_npy(path):
        return npy_source(spec, path)
    refuse_binary(path)
    return _single_file(spec, path, "uint8", BYTE_VOCAB, "text")
