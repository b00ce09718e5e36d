"""File formats ``--data`` reads besides plain text and ``.bin``: ``.npy`` token ids, JSON lines,
and the refusal of files that are neither (an archive, UTF-16, a Parquet table ...) — before,
any such file trained silently on its raw bytes.

* ``.npy`` (or any file starting with NumPy's magic): integer token ids, memory-mapped; any
  shape, read in C order (a 2-D array row after row); the last 10% is the validation split.
* ``.jsonl`` / ``.json`` lines: one JSON object per line, its ``"text"`` string (or the field
  named by ``FILE.jsonl:FIELD``) a document; documents are joined by a blank line (as the
  stdlib's files are) into a text cached once, then read as text is (bytes, or a tokenizer).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from advisor.data.token_source import (
    BYTE_VOCAB,
    VAL_FRACTION,
    TokenSource,
    atomic_output,
    cache_dir,
)
from advisor.errors import UsageProblem

ACCEPTED = (
    '--data takes UTF-8 text, .jsonl lines with a "text" field, a .bin of uint16 token ids, '
    "a .npy of integer token ids, a directory with train.bin and val.bin (or shards named for "
    "their split), stdlib or synthetic"
)
JSONL_SUFFIXES = (".jsonl", ".json")
DOCUMENT_SEPARATOR = b"\n\n"  # between JSONL documents, as after each stdlib file
SNIFF_BYTES = 8192  # a file with a NUL byte in its first 8 KB is not text
NUMPY_MAGIC = b"\x93NUMPY"

# (magic at the start of the file, what it is, the fix): files refused as text.
_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (b"PK\x03\x04", "a zip archive (.npz, .pt, .zip)", "extract the token ids or text first"),
    (b"\x1f\x8b", "gzip-compressed", "decompress it first"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first"),
    (b"PAR1", "a Parquet file", "write its text column as .jsonl"),
    (b"ARROW1", "an Arrow file", "write its text column as .jsonl"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file", "save its token ids with np.save as .npy"),
    (b"\xff\xfe", "UTF-16 text", "re-encode it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text", "re-encode it as UTF-8"),
)


def refuse_binary(path: Path, accepted: str = ACCEPTED) -> None:
    """Refuse a file read as text that is not text: a known binary format's magic, or a NUL
    byte in its first :data:`SNIFF_BYTES` (UTF-16, token ids under another name). ``accepted``
    ends the message: what the option that named the file takes."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    for magic, what, fix in _MAGIC:
        if head.startswith(magic):
            raise UsageProblem(f"{path} is {what}, not text: {fix}; {accepted}")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise UsageProblem(
            f"{path} is a Python pickle, not text: save its token ids with np.save as .npy; "
            f"{accepted}"
        )
    if b"\x00" in head:
        raise UsageProblem(
            f"{path} is not text (NUL bytes in its first {SNIFF_BYTES // 1024} KB): save token "
            f"ids as .bin or .npy, re-encode UTF-16 text as UTF-8; {accepted}"
        )


def is_npy(path: Path) -> bool:
    if path.suffix.lower() == ".npy":
        return True
    with open(path, "rb") as f:
        return f.read(len(NUMPY_MAGIC)) == NUMPY_MAGIC


def id_range(ids: np.ndarray, chunk: int = 1 << 24) -> tuple[int, int]:
    """(smallest, largest) id, read in chunks: a token file may be many GB."""
    low, high = 0, 0
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        low, high = min(low, int(part.min())), max(high, int(part.max()))
    return low, high


def npy_source(spec: str, path: Path) -> TokenSource:
    """A ``.npy`` of integer token ids, memory-mapped in place (``np.load(mmap_mode="r")``)."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        detail = " ".join(str(exc).split())
        raise UsageProblem(
            f"{path} is not a readable .npy file ({detail}): save token ids with "
            "np.save(path, np.asarray(ids, dtype=np.uint16)), or name raw uint16 ids .bin"
        ) from None
    if not isinstance(array, np.memmap | np.ndarray) or array.dtype.kind not in "iu":
        raise UsageProblem(
            f"{path} holds {array.dtype} values, not integer token ids: save them with "
            "np.save(path, np.asarray(ids, dtype=np.uint16)) (uint32 above 65,535)"
        )
    if array.ndim == 0:
        raise UsageProblem(f"{path} holds a single number, not token ids: save a 1-D array")
    if array.ndim > 1 and not array.flags.c_contiguous:
        raise UsageProblem(
            f"{path} is a Fortran-order {array.ndim}-D array: save it with "
            "np.save(path, np.ascontiguousarray(ids)) so that its rows read in order"
        )
    flat = array.reshape(-1)
    low, high = id_range(flat) if len(flat) else (0, -1)
    if low < 0:
        raise UsageProblem(f"{path} holds negative token ids (down to {low}): ids must be >= 0")
    shape = "" if array.ndim == 1 else f", {'×'.join(map(str, array.shape))} read row by row"
    return TokenSource(
        spec=spec,
        kind="npy",
        vocab_size=high + 1,
        paths=(str(path), str(path)),
        split_at=int(len(flat) * (1 - VAL_FRACTION)),
        dtype=array.dtype.str,
        offset=int(array.offset) if isinstance(array, np.memmap) else 0,
        description=f"{path.name} ({len(flat):,} tokens, {array.dtype.name}{shape})",
        label=path.name,
    )


def jsonl_spec(spec: str) -> tuple[Path, str] | None:
    """``FILE.jsonl`` → (FILE.jsonl, "text"); ``FILE.jsonl:FIELD`` → (FILE.jsonl, FIELD);
    None for a spec that names no JSON lines file."""
    path = Path(spec).expanduser()
    if path.suffix.lower() in JSONL_SUFFIXES and path.is_file():
        return path, "text"
    head, sep, field = spec.rpartition(":")
    path = Path(head).expanduser()
    if sep and field and path.suffix.lower() in JSONL_SUFFIXES and path.is_file():
        return path, field
    return None


def _documents(path: Path, field: str, flag: str) -> int:
    """Write ``path``'s documents, joined by :data:`DOCUMENT_SEPARATOR`, to the cache's text
    file for (path, field), reading one line at a time; the number of documents. ``flag``: the
    option that named the file (``--data``, ``--val-data``), for the hints."""
    hint = f'give each line a "{field}" string, or name the field that holds the text: {flag} '
    hint += f"{path}:FIELD"
    documents = 0
    with open(path, "rb") as f, atomic_output(_jsonl_cache(path, field)) as out:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                if number == 1 and line.lstrip().startswith(b"["):
                    raise UsageProblem(
                        f"{path} holds a JSON array, not JSON lines: write one object per line "
                        f'(a .jsonl file, e.g. {{"{field}": "..."}})'
                    ) from None
                reason = " ".join(str(exc).split())
                raise UsageProblem(
                    f"{path} line {number} is not valid JSON ({reason}): {hint}"
                ) from None
            if not isinstance(record, dict):
                raise UsageProblem(
                    f"{path} line {number} is a JSON {type(record).__name__}, not an object: {hint}"
                )
            if field not in record:
                keys = ", ".join(sorted(record)[:8]) or "none"
                raise UsageProblem(
                    f'{path} line {number} has no "{field}" field (its keys: {keys}): {hint}'
                )
            text = record[field]
            if not isinstance(text, str):
                raise UsageProblem(
                    f'{path} line {number}: "{field}" is a {type(text).__name__}, not a string: '
                    f"{hint}"
                )
            if not text:
                continue
            out.write((DOCUMENT_SEPARATOR if documents else b"") + text.encode(errors="replace"))
            documents += 1
    return documents


def _jsonl_cache(path: Path, field: str) -> Path:
    stat = path.resolve().stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{field}"
    return cache_dir() / f"jsonl-{hashlib.sha1(key.encode()).hexdigest()[:16]}.txt"


def jsonl_source(spec: str, path: Path, field: str, flag: str = "--data") -> TokenSource:
    """JSON lines: the documents' text, extracted once into the cache, read as a text file
    (``flag``: the option that named it, for the refusals' hints)."""
    text_path = _jsonl_cache(path, field)
    counts = text_path.with_suffix(".json")
    if text_path.exists() and counts.exists():
        documents = int(json.loads(counts.read_text())["documents"])
    else:
        documents = _documents(path, field, flag)
        with atomic_output(counts) as f:
            f.write(json.dumps({"documents": documents}).encode())
    n = text_path.stat().st_size
    return TokenSource(
        spec=spec,
        kind="jsonl",
        vocab_size=BYTE_VOCAB,
        paths=(str(text_path), str(text_path)),
        split_at=int(n * (1 - VAL_FRACTION)),
        description=f"{path.name} ({documents:,} documents of field '{field}', {n:,} tokens)",
        label=f"{path.name} ({documents:,} documents of field '{field}')",
    )
