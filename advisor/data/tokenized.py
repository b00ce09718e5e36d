"""Tokenize a text source once with a local Hugging Face tokenizer and cache the ids on disk."""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from advisor.data.token_source import VAL_FRACTION, TokenSource, atomic_output, cache_dir
from advisor.errors import UsageProblem, one_line
from advisor.models.hf import import_transformers

# Text is read, tokenized and written ~1 MiB at a time, each piece ending at a line end: memory
# holds one piece and its ids, never the whole text (a Python list of ids is ~29x its text).
CHUNK_CHARS = 1 << 20
# More than this share of bytes that are not UTF-8 is refused: it is not UTF-8 text, and
# tokenizing it would train on replacement characters.
MAX_INVALID_SHARE = 0.01
TEXT_KINDS = ("stdlib", "text", "jsonl")  # the sources a tokenizer applies to


def _load_tokenizer(path: str) -> Any:
    if not Path(path).expanduser().exists():
        raise UsageProblem(f"tokenizer {path} does not exist: pass a local tokenizer directory")
    tf = import_transformers()
    try:
        return tf.AutoTokenizer.from_pretrained(str(Path(path).expanduser()), local_files_only=True)
    except Exception as exc:
        raise UsageProblem(
            f"cannot load a tokenizer from {path} ({one_line(exc)}): pass a directory holding "
            "tokenizer.json or the tokenizer's files saved by save_pretrained"
        ) from None


# Files that say a directory holds a Hugging Face tokenizer (what AutoTokenizer reads).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# Weights beside a tokenizer in a model directory: not the tokenizer's, never hashed (GBs).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")


def model_tokenizer(model: str | None) -> str | None:
    """The tokenizer an ``hf:DIR`` model ships in DIR, if it has one: text data for a model
    with its own tokenizer is tokenized with it unless ``--tokenizer`` names another (fed
    byte values as ids, a pretrained model would fine-tune on unrelated tokens)."""
    if not model or not model.startswith("hf:"):
        return None
    directory = Path(model[3:]).expanduser()
    if directory.is_dir() and any((directory / name).is_file() for name in TOKENIZER_FILES):
        return model[3:]
    return None


def _tokenizer_fingerprint(path: str) -> str:
    """Content hash of the tokenizer's files: a different tokenizer saved at the same path
    must not reuse cached ids (a model directory's weights are not the tokenizer's)."""
    root = Path(path).expanduser().resolve()
    files = (
        sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in _WEIGHT_SUFFIXES)
        if root.is_dir()
        else [root]
    )
    digest = hashlib.sha1()
    for file in files:
        digest.update(str(file.relative_to(root) if root.is_dir() else file.name).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _cut(text: str) -> int:
    """Where a piece of ``text`` tokenized alone should end: just before a newline that
    follows a non-space character, so that no word and no run of whitespace is split (a
    pre-tokenizer such as GPT-2's sees the pieces it sees in the whole text); ``len(text)``
    when there is no such newline."""
    at = text.rfind("\n")
    while at > 0:
        if not text[at - 1].isspace():
            return at
        at = text.rfind("\n", 0, at - 1)
    return len(text)


_ESCAPED = re.compile("[\udc80-\udcff]")  # surrogateescape's stand-in for a byte not UTF-8


class _Utf8Text:
    """Decodes text files piece by piece, replacing each byte that is not UTF-8 by U+FFFD and
    counting them; refuses as soon as they are more than :data:`MAX_INVALID_SHARE` of
    ``total`` bytes (the files' size, known up front)."""

    def __init__(self, total: int, what: str, fix: str) -> None:
        self.total, self.what, self.fix = total, what, fix
        self.replaced = 0

    def pieces(self, path: str) -> Iterator[str]:
        """The text of ``path`` in pieces of about :data:`CHUNK_CHARS`, each cut by
        :func:`_cut` (a text without line ends: every 4 pieces)."""
        decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        pending = ""
        with open(path, "rb") as f:
            while True:
                data = f.read(CHUNK_CHARS)
                text, count = _ESCAPED.subn("\ufffd", decoder.decode(data, final=not data))
                self._count(count)
                pending += text
                if data and len(pending) < CHUNK_CHARS:
                    continue
                cut = _cut(pending) if data else len(pending)
                if data and cut == len(pending) and len(pending) < 4 * CHUNK_CHARS:
                    continue
                if cut:
                    yield pending[:cut]
                pending = pending[cut:]
                if not data:
                    return

    def _count(self, count: int) -> None:
        self.replaced += count
        if self.replaced > MAX_INVALID_SHARE * self.total:
            raise UsageProblem(
                f"{self.what} is not UTF-8 text: at least {self.replaced:,} of its "
                f"{self.total:,} bytes are not valid UTF-8 (over {MAX_INVALID_SHARE:.0%}), and "
                f"tokenizing would train on replacement characters: {self.fix}"
            )


def _tokenize_file(tokenizer: Any, text: _Utf8Text, path: str, out: BinaryIO, dtype: str) -> int:
    """Tokenize ``path`` piece by piece, writing the ids to ``out``; the number of ids."""
    count = 0
    for piece in text.pieces(path):
        ids = np.asarray(tokenizer.encode(piece, add_special_tokens=False), dtype=dtype)
        out.write(ids.tobytes())
        count += len(ids)
    return count


def tokenize_source(
    source: TokenSource,
    tokenizer_path: str,
    *,
    own: bool = False,
    model_vocab: int | None = None,
    model: str | None = None,
) -> TokenSource:
    """``source`` tokenized by the tokenizer at ``tokenizer_path`` (``own``: the model
    directory's own tokenizer, taken by default), the ids cached on disk. A tokenizer whose
    vocabulary exceeds ``model_vocab`` (``model``'s) is refused before any text is read."""
    if source.kind not in TEXT_KINDS:
        raise UsageProblem(f"--tokenizer applies to text data, not {source.kind}: drop it")
    tokenizer = _load_tokenizer(tokenizer_path)
    vocab = len(tokenizer)
    name = Path(tokenizer_path).name
    if model_vocab is not None and vocab > model_vocab:
        raise UsageProblem(
            f"tokenizer {name} has a vocabulary of {vocab:,} but {model or 'the model'} has "
            f"{model_vocab:,}: use --model-arg vocab_size={vocab} (or a matching tokenizer)"
        )
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    assert source.paths is not None
    files = list(dict.fromkeys(source.paths))  # one file split by position, or train and val
    fingerprint = "|".join(
        f"{p}:{Path(p).stat().st_size}:{Path(p).stat().st_mtime_ns}" for p in files
    )
    digest = hashlib.sha1(f"{fingerprint}|{_tokenizer_fingerprint(tokenizer_path)}".encode())
    base = cache_dir() / f"tok-{digest.hexdigest()[:16]}"
    outputs = [base.with_suffix(f".{dtype}")]
    if len(files) == 2:
        outputs = [base.with_suffix(f".train.{dtype}"), base.with_suffix(f".val.{dtype}")]
    counts = base.with_suffix(".json")
    if not (counts.exists() and all(p.exists() for p in outputs)):
        total = sum(Path(p).stat().st_size for p in files)
        # Once per text and tokenizer (the stdlib: minutes with a small BPE on two cores).
        print(
            f"tokenizing {source.label}, {total:,} bytes, with {tokenizer_path} (once: the "
            f"ids are cached in {cache_dir()})",
            file=sys.stderr,
            flush=True,
        )
        fix = "re-encode it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)" + (
            "" if own else ", or drop --tokenizer to train on its bytes"
        )
        text = _Utf8Text(total, source.label, fix)
        for path, output in zip(files, outputs, strict=True):
            with atomic_output(output) as out:
                _tokenize_file(tokenizer, text, path, out, dtype)
        if text.replaced:
            # The stdlib's own: a few test files are deliberately in other encodings.
            why = " (test files in other encodings)" if source.kind == "stdlib" else ""
            print(
                f"{source.label}: {text.replaced:,} of {total:,} bytes are not valid UTF-8{why} "
                "and were replaced by U+FFFD before tokenizing"
                + ("" if why else f"; to keep them, {fix}"),
                file=sys.stderr,
                flush=True,
            )
        with atomic_output(counts) as f:
            f.write(json.dumps({"bytes": total, "replaced": text.replaced}).encode())
    facts = json.loads(counts.read_text())
    n = sum(p.stat().st_size for p in outputs) // np.dtype(dtype).itemsize
    replaced = f" ({facts['replaced']:,} invalid UTF-8 bytes replaced)" if facts["replaced"] else ""
    return TokenSource(
        spec=source.spec,
        kind="tokenized",
        vocab_size=vocab,
        paths=(str(outputs[0]), str(outputs[-1])),
        split_at=int(n * (1 - VAL_FRACTION)) if len(outputs) == 1 else None,
        dtype=dtype,
        mask_token_id=getattr(tokenizer, "mask_token_id", None),
        description=f"{source.label}: {n:,} tokens from {facts['bytes']:,} bytes{replaced}, "
        f"tokenized by {name} (vocab {vocab}{', the model directory’s own' if own else ''})",
        label=source.label,
    )
