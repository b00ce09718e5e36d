"""Tokenize a text source once with a local Hugging Face tokenizer and cache the ids on disk."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from advisor.data.sources import VAL_FRACTION, TokenSource, _atomic_write, cache_dir
from advisor.errors import UsageProblem
from advisor.models.hf import INSTALL_HINT, _transformers

CHUNK_CHARS = 1 << 20  # tokenize in ~1 MB pieces to bound memory


def _load_tokenizer(path: str) -> Any:
    if not Path(path).expanduser().exists():
        raise UsageProblem(f"tokenizer {path} does not exist: pass a local tokenizer directory")
    tf = _transformers()
    try:
        return tf.AutoTokenizer.from_pretrained(str(Path(path).expanduser()), local_files_only=True)
    except Exception as exc:
        raise UsageProblem(
            f"cannot load a tokenizer from {path} ({type(exc).__name__}: {exc}): pass a directory "
            f"holding tokenizer.json or the tokenizer's files ({INSTALL_HINT})"
        ) from None


def _encode(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = []
    for start in range(0, len(text), CHUNK_CHARS):
        ids.extend(tokenizer.encode(text[start : start + CHUNK_CHARS], add_special_tokens=False))
    return ids


def tokenize_source(source: TokenSource, tokenizer_path: str) -> TokenSource:
    if source.kind not in ("stdlib", "text"):
        raise UsageProblem(f"--tokenizer applies to text data, not {source.kind}: drop it")
    tokenizer = _load_tokenizer(tokenizer_path)
    vocab = len(tokenizer)
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    assert source.paths is not None
    fingerprint = "|".join(
        f"{p}:{Path(p).stat().st_size}:{Path(p).stat().st_mtime_ns}" for p in source.paths
    )
    key = hashlib.sha1(f"{fingerprint}|{Path(tokenizer_path).resolve()}".encode()).hexdigest()[:16]
    train_path = cache_dir() / f"tok-{key}.train.{dtype}"
    val_path = cache_dir() / f"tok-{key}.val.{dtype}"
    if not (train_path.exists() and val_path.exists()):
        if source.split_at is not None:
            text = Path(source.paths[0]).read_bytes().decode("utf-8", errors="replace")
            ids = _encode(tokenizer, text)
            cut = int(len(ids) * (1 - VAL_FRACTION))
            splits = {"train": ids[:cut], "val": ids[cut:]}
        else:
            splits = {
                name: _encode(tokenizer, Path(p).read_bytes().decode("utf-8", errors="replace"))
                for name, p in zip(("train", "val"), source.paths, strict=True)
            }
        _atomic_write(train_path, np.asarray(splits["train"], dtype=dtype).tobytes())
        _atomic_write(val_path, np.asarray(splits["val"], dtype=dtype).tobytes())
    return TokenSource(
        spec=source.spec,
        kind="tokenized",
        vocab_size=vocab,
        paths=(str(train_path), str(val_path)),
        dtype=dtype,
        mask_token_id=getattr(tokenizer, "mask_token_id", None),
        description=f"{source.description}, tokenized by {Path(tokenizer_path).name} "
        f"(vocab {vocab})",
    )
