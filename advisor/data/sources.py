"""Token sources for ``--data``: where the token ids come from, split into train and val.

* ``stdlib`` (default): the Python standard library's own ``.py`` sources — real text on every
  machine with no download — as byte-level tokens (vocab 256). Files are assigned to train or
  val by a hash of their relative path, so the split is deterministic for a Python version.
* a text file: its bytes are the tokens (vocab 256); the last 10% is the validation split.
  A file that is not text (NUL bytes, an archive's magic ...) is refused (advisor.data.formats).
* ``FILE.jsonl`` (or ``.json`` lines, ``FILE.jsonl:FIELD``): the documents of each line's
  ``"text"`` field, read as a text file is.
* ``FILE.bin``: uint16 token ids (nanoGPT format), or an llm.c token shard (its header read,
  advisor.data.shards); last 10% is val. A directory holding ``train.bin`` and ``val.bin``, or
  shards named for their split (``fineweb_train_000001.bin`` ...), reads each split as one
  stream. ``FILE.npy``: integer token ids.
* ``synthetic``: random tokens over the model's vocabulary, for probes and smoke tests.
* with ``--tokenizer DIR`` (a local Hugging Face tokenizer, extra ``hf``), text sources are
  tokenized once and cached as token-id files.

``--val-data SPEC`` names a validation set of its own: the whole of a file of the forms above
(or a directory's ``val.bin``), read as the train data is (text through the same tokenizer);
the train split of a single-file ``--data`` is then the whole file (a directory's train.bin
and the stdlib's train files stay as they are).

Token arrays are memory-mapped from files (the cache for ``stdlib`` and tokenized text), so data
loader workers open them cheaply under any multiprocessing start method.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sysconfig
from pathlib import Path

import numpy as np

from advisor.data.formats import (
    ACCEPTED,
    id_range,
    is_npy,
    jsonl_source,
    jsonl_spec,
    npy_source,
    refuse_binary,
)
from advisor.data.shards import (
    HEADER_BYTES,
    ShardSet,
    directory_shards,
    shard_header,
    shard_set,
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


def _single_file(
    spec: str, path: Path, dtype: str, vocab: int, kind: str, *, offset: int = 0, what: str = ""
) -> TokenSource:
    """One file of ids (or text) past ``offset`` bytes; its last 10% is the validation split.
    ``what``: said of the file after its token count (", an llm.c GPT-2 shard")."""
    n = (path.stat().st_size - offset) // np.dtype(dtype).itemsize
    return TokenSource(
        spec=spec,
        kind=kind,
        vocab_size=vocab,
        paths=(str(path), str(path)),
        split_at=int(n * (1 - VAL_FRACTION)),
        dtype=dtype,
        offset=offset,
        description=f"{path.name} ({n:,} tokens{what})",
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


# Files at least this large have their largest id cached (a 10B-token data set is scanned once).
ID_CACHE_MIN_BYTES = 1 << 24


def _largest_id(path: Path, dtype: str, offset: int) -> int:
    """The largest id of a token file (0 if it holds none), cached for a large file under its
    path, size and modification time: the vocabulary check of every later command is free."""
    stat = path.stat()
    if stat.st_size <= offset:
        return 0
    # ctime and the inode too: a copy that keeps the mtime (cp -p, rsync -a) changes them
    key = (
        f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:{stat.st_ino}:"
        f"{dtype}:{offset}"
    )
    cached = cache_dir() / f"ids-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    if stat.st_size >= ID_CACHE_MIN_BYTES and cached.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return int(json.loads(cached.read_text())["largest_id"])
    high = id_range(np.memmap(path, dtype=dtype, mode="r", offset=offset))[1]
    if stat.st_size >= ID_CACHE_MIN_BYTES:
        write_atomically(cached, json.dumps({"file": key, "largest_id": high}).encode())
    return high


def _bin_vocab(paths: list[Path], dtype: str = "uint16", offset: int = 0) -> int:
    return max((_largest_id(path, dtype, offset) for path in paths), default=0) + 1


def resolve_data(
    spec: str,
    *,
    tokenizer: str | None = None,
    model_vocab: int | None = None,
    min_tokens: int = 2,
    model: str | None = None,
    val_data: str | None = None,
    need_val: bool = True,
) -> TokenSource:
    """The token source named by ``--data`` (``min_tokens``: each split must hold a window).
    Text for an ``hf:DIR`` ``model`` that ships a tokenizer is tokenized with it when
    ``tokenizer`` is None (:func:`advisor.data.tokenized.model_tokenizer`). ``model_vocab``
    (the model's vocabulary; synthetic data draws from it, 256 if None): a tokenizer larger
    than it is refused before it tokenizes anything. ``val_data`` (``--val-data``): the
    validation set, nested as the source's ``val`` (:func:`_val_file_source`). ``need_val``
    False (a profile, which never evaluates): only the train split must be there."""
    if val_data is not None:
        _refuse_val_spec(val_data, spec)
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
    own_val = need_val and val_data is None
    source = _stdlib_source() if spec == "stdlib" else _file_source(spec, need_val=own_val)
    if tokenizer and source.kind not in TEXT_KINDS:
        raise UsageProblem(
            f"--tokenizer applies to text data, not .{source.kind} token ids: drop it"
        )
    val = None
    if val_data is not None:
        val = _val_file_source(val_data)
        _refuse_other_tokens(spec, source, val_data, val)
        _refuse_train_files(spec, source, val_data, val)
    name = tokenizer or model_tokenizer(model)  # the model directory's own, by default
    if name and source.kind in TEXT_KINDS:
        source = tokenize_source(
            source, name, own=not tokenizer, model_vocab=model_vocab, model=model
        )
        if val is not None:  # the same tokenizer: the ids mean the same tokens in both
            val = tokenize_source(
                val, name, own=not tokenizer, model_vocab=model_vocab, model=model
            )
            val = dataclasses.replace(val, split_at=None)  # all of it is the validation set
    if val is not None:
        if (count := val.num_tokens("val")) < min_tokens:
            raise UsageProblem(
                f"--val-data {val_data!r} has {count} tokens, fewer than one window of "
                f"{min_tokens}: use more validation data or a shorter --seq-len"
            )
        # A single file trains on all of it (no 10% held back); a directory or the stdlib
        # keeps its train part (split_at is None for them already).
        source = dataclasses.replace(source, split_at=None, val=val)
    for split in ("train", "val") if need_val or val is not None else ("train",):
        if source.num_tokens(split) < min_tokens:
            raise UsageProblem(
                f"data {spec!r} has {source.num_tokens(split)} {split} tokens, fewer than one "
                f"window of {min_tokens}: use more text or a shorter --seq-len"
            )
    return source


def _file_source(
    spec: str, *, need_val: bool = True, flag: str = "--data", accepted: str = ACCEPTED
) -> TokenSource:
    """A file or directory named by ``--data``, by its suffix (``.bin``, ``.npy``, ``.jsonl``
    in any case) or else as text. ``flag`` and ``accepted``: the option that named it and what
    that option takes, for the refusals (``--val-data`` reads its files here too)."""
    if (jsonl := jsonl_spec(spec)) is not None:
        refuse_binary(jsonl[0], accepted)
        return jsonl_source(spec, *jsonl, flag=flag)
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageProblem(
            f"data {spec!r} does not exist: pass stdlib, synthetic, a text file, a .jsonl of "
            '"text" lines, a .bin of uint16 token ids, a .npy of integer token ids, or a '
            "directory with train.bin and val.bin"
        )
    if path.is_dir():
        return _directory_source(spec, path, need_val=need_val)
    if path.suffix.lower() == ".bin":
        if (header := shard_header(path)) is not None:  # llm.c's: its ids past the header
            vocab = _bin_vocab([path], header.dtype, HEADER_BYTES)
            what = f", an llm.c {header.writer} shard"
            return _single_file(
                spec, path, header.dtype, vocab, "bin", offset=HEADER_BYTES, what=what
            )
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
    refuse_binary(path, accepted)
    return _single_file(spec, path, "uint8", BYTE_VOCAB, "text")


DIRECTORY_FORMS = (
    "a --data directory holds train.bin and val.bin of uint16 token ids (nanoGPT's format), "
    "or shards named for their split (llm.c's fineweb_train_000001.bin ... and "
    "fineweb_val_000000.bin)"
)


def _read_alike(paths: list[Path]) -> ShardSet:
    """The shards ``paths`` in one format (advisor.data.shards.shard_set); raw uint16 ones are
    checked for wider ids as a single .bin is."""
    shards = shard_set(paths)
    if shards.writer is None:
        for path in paths:
            _refuse_wider_ids(path)
    return shards


def _shards_description(path: Path, splits: dict[str, list[Path]], shards: ShardSet) -> str:
    """``DIR: 2 train shards + 1 val shard (a + b tokens, llm.c GPT-2 shards)``: the shards of
    each split named (``shards``: all of them, read alike, in the order of ``splits``)."""
    files: list[str] = []
    counts: list[str] = []
    start = 0
    for split, paths in splits.items():
        if paths:
            files.append(f"{len(paths)} {split} shard{'s' if len(paths) > 1 else ''}")
            counts.append(f"{sum(shards.counts[start : start + len(paths)]):,}")
            start += len(paths)
    form = f"llm.c {shards.writer} shards" if shards.writer else "uint16 ids"
    return f"{path}: {' + '.join(files)} ({' + '.join(counts)} tokens, {form})"


def _directory_source(spec: str, path: Path, *, need_val: bool = True) -> TokenSource:
    """A --data directory: train.bin and val.bin, or shards whose names say their split, each
    split read as one stream (``need_val`` False: --val-data names the validation set, so the
    directory may have no val shard)."""
    found = directory_shards(path)
    # train.bin and val.bin, where there, are the splits (other files beside them are not read)
    for split in ("train", "val"):
        if (path / f"{split}.bin").is_file():
            found[split] = [path / f"{split}.bin"]
    train, val = found["train"], found["val"]
    if not train or (need_val and not val):
        # Which one is missing, and what else would do: "needs train.bin and val.bin" left
        # a directory of one train.bin (or of a .npy or text) without a way forward.
        missing = " and ".join(
            what for what, files in (("train.bin", train), ("val.bin", val)) if not files
        )
        alone = ""
        if len(train) == 1:
            alone = f", or pass {train[0]} alone (its last 10% is validation)"
        if train:
            alone += ", or name the validation set with --val-data"
        neither = found[""]
        if neither:
            names = ", ".join(p.name for p in neither[:3]) + (", ..." if len(neither) > 3 else "")
            alone += f" ({len(neither)} .bin files name neither split: {names})"
        raise UsageProblem(
            f"directory {path} has no {missing}: {DIRECTORY_FORMS}{alone}; a file of ids or "
            "text is passed as the file itself"
        )
    alike = _read_alike(train + val)  # one format for both splits
    classic = (
        [p.name for p in train] == ["train.bin"]
        and [p.name for p in val] == ["val.bin"]
        and alike.writer is None
    )
    if classic:
        # The counts too: a resume tells a train.bin written again by its size (loop).
        train_count, val_count = alike.counts
        description = f"{path}/{{train,val}}.bin ({train_count:,} + {val_count:,} tokens)"
    else:
        description = _shards_description(path, {"train": train, "val": val}, alike)
    one_each = len(train) == 1 and len(val) == 1
    return TokenSource(
        spec=spec,
        kind="bin",
        vocab_size=_bin_vocab(train + val, alike.dtype, alike.offset),
        paths=(str(train[0]), str((val or train)[0])),
        dtype=alike.dtype,
        offset=alike.offset,
        shards=None if one_each else (alike.paths[: len(train)], alike.paths[len(train) :]),
        description=description,
    )


VAL_DATA_FORMS = (
    "a text file, FILE.jsonl[:FIELD], a .bin of uint16 token ids, a .npy of integer token ids, "
    "or a directory holding val.bin or val shards"
)


def _refuse_val_spec(val_data: str, data: str) -> None:
    """``--val-data`` names a file: not the stdlib or random tokens, and not beside
    ``--data synthetic`` (whose windows are random ids, never read from a file)."""
    if val_data in ("synthetic", "stdlib"):
        raise UsageProblem(
            f"--val-data {val_data} is not a validation file: pass {VAL_DATA_FORMS}, or drop "
            "--val-data to evaluate on the validation split of --data"
        )
    if data == "synthetic":
        raise UsageProblem(
            f"--val-data {val_data} with --data synthetic: random tokens have no validation "
            "file; pass the train data as --data FILE, or drop --val-data"
        )


def _val_file_source(spec: str) -> TokenSource:
    """``--val-data SPEC``: the whole of a file of ``--data``'s file forms, or a directory's
    val.bin (its train.bin, if any, is not read), as a source whose "val" tokens are all of it
    (``split_at`` None: the file, not its last 10%)."""
    path = Path(spec).expanduser()
    if jsonl_spec(spec) is None and path.is_dir():
        val = [path / "val.bin"] if (path / "val.bin").is_file() else directory_shards(path)["val"]
        if not val:
            raise UsageProblem(
                f"--val-data directory {path} has no val.bin: write the validation ids there "
                "as val.bin (uint16, nanoGPT's format) or as shards named for it (llm.c's "
                "fineweb_val_000000.bin), or pass the validation file itself"
            )
        shards = _read_alike(val)
        if [p.name for p in val] == ["val.bin"] and shards.writer is None:
            description, label = f"{val[0]} ({shards.num_tokens:,} tokens)", str(val[0])
        else:
            description, label = _shards_description(path, {"val": val}, shards), str(path)
        return TokenSource(
            spec=spec,
            kind="bin",
            vocab_size=_bin_vocab(val, shards.dtype, shards.offset),
            paths=(str(val[0]), str(val[0])),
            dtype=shards.dtype,
            offset=shards.offset,
            shards=None if len(val) == 1 else ((), shards.paths),
            description=description,
            label=label,
        )
    if jsonl_spec(spec) is None and not path.exists():
        raise UsageProblem(f"--val-data {spec!r} does not exist: pass {VAL_DATA_FORMS}")
    accepted = f"--val-data takes {VAL_DATA_FORMS}"
    source = _file_source(spec, flag="--val-data", accepted=accepted)
    return dataclasses.replace(source, split_at=None)


def _token_files(source: TokenSource, split: str) -> set[Path]:
    """The files a split of a (not yet tokenized) source reads."""
    if source.paths is None:
        return set()
    if source.shards is not None:
        files = source.shards[split == "val"]
    elif source.split_at is not None or split == "train":
        files = (source.paths[0],)
    else:
        files = (source.paths[1],)
    return {Path(f).resolve() for f in files}


def _refuse_train_files(spec: str, train: TokenSource, val_data: str, val: TokenSource) -> None:
    """``--val-data`` that names what the run trains on: its eval loss would measure the
    training data, not held-out data."""
    if _token_files(train, "train") & _token_files(val, "val"):
        raise UsageProblem(
            f"--val-data {val_data} is data that --data {spec} trains on: its eval loss would "
            "measure training data; pass a held-out file, or drop --val-data to evaluate on "
            "the validation split of --data"
        )


def _refuse_other_tokens(spec: str, train: TokenSource, val_data: str, val: TokenSource) -> None:
    """Text validation data beside token-id train data (or the reverse): the same number
    would mean a byte in one and a token in the other."""
    train_text, val_text = train.kind in TEXT_KINDS, val.kind in TEXT_KINDS
    if train_text == val_text:
        return
    if val_text:
        raise UsageProblem(
            f"--val-data {val_data} is text but --data {spec} holds token ids "
            f"(.{train.kind}): pass validation token ids from the same tokenizer (.bin or .npy), "
            "or text for both"
        )
    raise UsageProblem(
        f"--val-data {val_data} holds token ids (.{val.kind}) but --data {spec} is text: pass "
        "validation text (it is read as --data is, through the same tokenizer), or token ids "
        "for both"
    )
