"""Tokenize a text source once with a local Hugging Face tokenizer and cache the ids on disk."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from advisor.data.token_source import VAL_FRACTION, TokenSource, cache_dir
from advisor.errors import UsageProblem, one_line
from advisor.models.hf import import_transformers
from profilers.rundir import write_atomically

CHUNK_CHARS = 1 << 20  # tokenize in ~1 MB pieces to bound memory


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


def _encode(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = []
    for start in range(0, len(text), CHUNK_CHARS):
        ids.extend(tokenizer.encode(text[start : start + CHUNK_CHARS], add_special_tokens=False))
    return ids


def tokenize_source(source: TokenSource, tokenizer_path: str, *, own: bool = False) -> TokenSource:
    """``source`` tokenized by the tokenizer at ``tokenizer_path`` (``own``: the model
    directory's own tokenizer, taken by default), the ids cached on disk."""
    if source.kind not in ("stdlib", "text"):
        raise UsageProblem(f"--tokenizer applies to text data, not {source.kind}: drop it")
    tokenizer = _load_tokenizer(tokenizer_path)
    vocab = len(tokenizer)
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    assert source.paths is not None
    fingerprint = "|".join(
        f"{p}:{Path(p).stat().st_size}:{Path(p).stat().st_mtime_ns}" for p in source.paths
    )
    digest = hashlib.sha1(f"{fingerprint}|{_tokenizer_fingerprint(tokenizer_path)}".encode())
    key = digest.hexdigest()[:16]
    train_path = cache_dir() / f"tok-{key}.train.{dtype}"
    val_path = cache_dir() / f"tok-{key}.val.{dtype}"
    if not (train_path.exists() and val_path.exists()):
        # Once per text and tokenizer (the stdlib: minutes with a small BPE on two cores).
        print(
            f"tokenizing {source.description} with {tokenizer_path} (once: the ids are cached "
            f"in {cache_dir()})",
            file=sys.stderr,
            flush=True,
        )
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
        write_atomically(train_path, np.asarray(splits["train"], dtype=dtype).tobytes())
        write_atomically(val_path, np.asarray(splits["val"], dtype=dtype).tobytes())
    return TokenSource(
        spec=source.spec,
        kind="tokenized",
        vocab_size=vocab,
        paths=(str(train_path), str(val_path)),
        dtype=dtype,
        mask_token_id=getattr(tokenizer, "mask_token_id", None),
        description=f"{source.description}, tokenized by {Path(tokenizer_path).name} "
        f"(vocab {vocab}{', the model directory’s own' if own else ''})",
    )
