"""``--data`` formats beyond text and ``.bin`` (``.npy``, JSON lines), files that are not text,
tokenized data's size and UTF-8, streamed tokenization, and a run that repeats its data."""

from __future__ import annotations

import gzip
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from advisor.cli import main
from advisor.data import data_use, repetition_notice, resolve_data
from advisor.data import tokenized as tokenized_module
from advisor.errors import UsageProblem
from tests.advisor.test_data import SNIPPETS, build_tokenizer


@pytest.fixture(autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("advisor-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADVISOR_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def problem(spec: str, **kwargs: Any) -> str:
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(spec, **kwargs)
    message = str(excinfo.value)
    assert message and "\n" not in message, repr(message)
    return message


def train(tmp_path: Path, data: Path) -> Result:
    args = ["train", "--steps", "1", "--quiet", "--out", str(tmp_path / "run"), "--data", str(data)]
    return CliRunner().invoke(main, args, prog_name="advisor")


def all_tokens(source: Any) -> np.ndarray:
    return np.concatenate([source.tokens("train"), source.tokens("val")])


# -- D2: .npy token ids, .BIN, files that are not text --------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint32])
def test_npy_is_read_as_token_ids_not_bytes(tmp_path: Path, dtype: type) -> None:
    """A .npy trained on its header and the bytes of its ids as tokens of vocab 256."""
    ids = (np.arange(5000) * 7 % 200).astype(dtype)
    np.save(tmp_path / "ids.npy", ids)
    source = resolve_data(str(tmp_path / "ids.npy"))
    assert source.vocab_size == 200
    assert np.array_equal(all_tokens(source), ids)
    assert len(source.tokens("val")) == 500  # the last 10%, as for a .bin
    assert source.description.startswith("ids.npy (5,000 tokens")


def test_npy_of_rows_is_read_row_after_row(tmp_path: Path) -> None:
    rows = np.arange(600, dtype=np.uint16).reshape(20, 30)
    np.save(tmp_path / "rows.npy", rows)
    source = resolve_data(str(tmp_path / "rows.npy"))
    assert np.array_equal(all_tokens(source), rows.reshape(-1))
    assert "20×30 read row by row" in source.description
    np.save(tmp_path / "fortran.npy", np.asfortranarray(rows))
    assert "np.ascontiguousarray" in problem(str(tmp_path / "fortran.npy"))


def test_npy_ids_larger_than_the_model_are_refused_as_for_a_bin(tmp_path: Path) -> None:
    np.save(tmp_path / "ids.npy", np.tile(np.arange(1000, dtype=np.uint16), 10))
    result = train(tmp_path, tmp_path / "ids.npy")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"error: data '{tmp_path / 'ids.npy'}' has token ids up to 999 but gpt-tiny has a "
        "vocabulary of 256: use --model-arg vocab_size=1000 (or a matching tokenizer)"
    ]


@pytest.mark.parametrize(
    ("array", "hint"),
    [
        (np.linspace(0, 1, 100), "not integer token ids"),
        (np.array([3, -1, 5] * 40, dtype=np.int32), "negative token ids"),
        (np.array(7, dtype=np.uint16), "a single number"),
    ],
    ids=["float", "negative", "scalar"],
)
def test_npy_that_is_not_token_ids_is_refused(tmp_path: Path, array: np.ndarray, hint: str) -> None:
    np.save(tmp_path / "bad.npy", array)
    assert hint in problem(str(tmp_path / "bad.npy"))


def test_npy_name_without_a_numpy_header_is_refused(tmp_path: Path) -> None:
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "raw.npy")
    assert "name raw uint16 ids .bin" in problem(str(tmp_path / "raw.npy"))


def test_numpy_file_under_another_name_is_read_as_ids(tmp_path: Path) -> None:
    ids = np.arange(300, dtype=np.uint16)
    with open(tmp_path / "ids.dat", "wb") as f:
        np.save(f, ids)
    assert np.array_equal(all_tokens(resolve_data(str(tmp_path / "ids.dat"))), ids)


def test_bin_suffix_in_any_case_holds_uint16_ids(tmp_path: Path) -> None:
    ids = np.arange(1000, dtype=np.uint16) % 300
    ids.tofile(tmp_path / "IDS.BIN")
    source = resolve_data(str(tmp_path / "IDS.BIN"))
    assert (source.kind, source.vocab_size) == ("bin", 300)
    assert np.array_equal(all_tokens(source), ids)


@pytest.mark.parametrize(
    ("name", "content", "hint"),
    [
        ("ids.dat", np.arange(1000, dtype=np.uint16).tobytes(), "NUL bytes"),
        ("utf16.txt", "hello world\n".encode("utf-16") * 50, "re-encode it as UTF-8"),
        ("corpus.txt.gz", gzip.compress(b"hello world\n" * 100, mtime=0), "decompress it first"),
        ("table.parquet", b"PAR1" + b"x" * 200, "Parquet"),
    ],
    # Named ids: the contents must not name the test, or two xdist workers that collect in
    # different seconds see different tests (gzip stamps the time) and the run refuses to start.
    ids=["uint16-ids", "utf-16", "gzip", "parquet"],
)
def test_a_file_that_is_not_text_is_refused(
    tmp_path: Path, name: str, content: bytes, hint: str
) -> None:
    """Anything not .bin trained silently on its raw bytes as text."""
    (tmp_path / name).write_bytes(content)
    message = problem(str(tmp_path / name))
    assert hint in message
    assert message.endswith(
        '--data takes UTF-8 text, .jsonl lines with a "text" field, a .bin of uint16 token '
        "ids, a .npy of integer token ids, a directory with train.bin and val.bin (or shards "
        "named for their split), stdlib or synthetic"
    )


def test_a_zip_archive_is_refused(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "ids.npz", "w") as archive:
        archive.writestr("ids.npy", b"x" * 100)
    assert "zip archive" in problem(str(tmp_path / "ids.npz"))


def test_a_not_text_file_is_refused_by_the_cli_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "ids.dat").write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    result = train(tmp_path, tmp_path / "ids.dat")
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'ids.dat'} is not text")


# -- D3: JSON lines ------------------------------------------------------------------------------

DOCS = [f"sample number {i} about cats and dogs" for i in range(300)]


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_trains_on_the_text_field_not_the_json_syntax(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", [{"text": d, "id": i} for i, d in enumerate(DOCS)])
    source = resolve_data(str(data))
    joined = "\n\n".join(DOCS).encode()
    assert np.array_equal(all_tokens(source), np.frombuffer(joined, np.uint8))
    assert source.vocab_size == 256
    assert (
        source.description == f"data.jsonl (300 documents of field 'text', {len(joined):,} tokens)"
    )
    assert resolve_data(str(data)) == source  # extracted once, then cached


def test_json_lines_named_json_and_another_field(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "data.json", [{"body": d} for d in DOCS])
    source = resolve_data(f"{data}:body")
    assert bytes(all_tokens(source)) == "\n\n".join(DOCS).encode()
    message = problem(str(data))
    assert message == (
        f'{data} line 1 has no "text" field (its keys: body): give each line a "text" string, '
        f"or name the field that holds the text: --data {data}:FIELD"
    )


@pytest.mark.parametrize(
    ("lines", "hint"),
    [
        ('{"text": "a"}\n["a list"]\n', "line 2 is a JSON list, not an object"),
        ('{"text": "a"}\n\n{"text": "b"\n', "line 3 is not valid JSON"),
        ('{"text": "a"}\n{"text": 7}\n', 'line 2: "text" is a int, not a string'),
        ('[{"text": "a"},\n{"text": "b"}]\n', "holds a JSON array, not JSON lines"),
    ],
    ids=["list", "invalid", "not-a-string", "array"],
)
def test_a_bad_jsonl_line_is_named(tmp_path: Path, lines: str, hint: str) -> None:
    (tmp_path / "bad.jsonl").write_text(lines)
    assert hint in problem(str(tmp_path / "bad.jsonl"))


def test_jsonl_through_a_tokenizer_is_tokenized_like_text(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    docs = SNIPPETS * 30
    data = write_jsonl(tmp_path / "code.jsonl", [{"text": d} for d in docs])
    source = resolve_data(str(data), tokenizer=str(tokenizer_dir), min_tokens=17)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert source.kind == "tokenized"
    assert tokenizer.decode(all_tokens(source).tolist()) == "\n\n".join(docs)
    assert "{" not in tokenizer.decode(all_tokens(source).tolist())


# -- D5, D6, D7: tokenized data ------------------------------------------------------------------


def test_tokenized_data_is_described_by_its_token_count(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """It said 'code.txt (N tokens), tokenized by …' with N the file's bytes."""
    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    source = resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17)
    n, size = len(all_tokens(source)), text.stat().st_size
    assert n < size / 2
    assert source.description == (
        f"code.txt: {n:,} tokens from {size:,} bytes, tokenized by {tokenizer_dir.name} "
        f"(vocab {source.vocab_size})"
    )
    again = resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17)
    assert again.description == source.description  # from the cache


def test_a_few_invalid_utf8_bytes_are_counted_on_stderr(
    tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = ("".join(SNIPPETS) * 30).encode()
    text = tmp_path / "latin.txt"
    text.write_bytes(body + b"caf\xe9\n" * 3)  # 3 bytes of Latin-1: well under 1%
    source = resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17)
    size = text.stat().st_size
    err = capsys.readouterr().err
    assert f"latin.txt: 3 of {size:,} bytes are not valid UTF-8 and were replaced" in err
    assert "(3 invalid UTF-8 bytes replaced)" in source.description


def test_text_that_is_mostly_not_utf8_is_refused_under_a_tokenizer(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """Half of bytes(range(256)) became U+FFFD silently."""
    text = tmp_path / "latin.txt"
    text.write_bytes(bytes(range(1, 256)) * 40)
    message = problem(str(text), tokenizer=str(tokenizer_dir))
    assert message.startswith("latin.txt is not UTF-8 text: at least ")
    assert message.endswith(
        "re-encode it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8), or drop --tokenizer to train "
        "on its bytes"
    )
    assert resolve_data(str(text)).kind == "text"  # its bytes, without a tokenizer


class Watched:
    """A tokenizer that records the longest text it was asked to encode."""

    def __init__(self, inner: Any, *, refuse: bool = False) -> None:
        self.inner, self.refuse, self.longest = inner, refuse, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, piece: str, **kwargs: Any) -> list[int]:
        assert not self.refuse, "tokenized the text before checking the vocabulary"
        self.longest = max(self.longest, len(piece))
        return list(self.inner.encode(piece, **kwargs))


def watch_tokenizer(monkeypatch: pytest.MonkeyPatch, *, refuse: bool = False) -> list[Watched]:
    watched: list[Watched] = []
    real_load = tokenized_module._load_tokenizer

    def load(path: str) -> Watched:
        watched.append(Watched(real_load(path), refuse=refuse))
        return watched[-1]

    monkeypatch.setattr(tokenized_module, "_load_tokenizer", load)
    return watched


def test_a_tokenizer_larger_than_the_model_is_refused_before_tokenizing(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was refused after the whole text was tokenized (minutes for the stdlib)."""
    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    watch_tokenizer(monkeypatch, refuse=True)
    message = problem(str(text), tokenizer=str(tokenizer_dir), model_vocab=256, model="gpt-tiny")
    assert message == (
        f"tokenizer {tokenizer_dir.name} has a vocabulary of 300 but gpt-tiny has 256: use "
        "--model-arg vocab_size=300 (or a matching tokenizer)"
    )


def test_tokenizing_in_pieces_cut_at_line_ends_gives_the_ids_of_the_whole(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text was read whole and its ids held in a list (~29x the file); it is tokenized
    in pieces now, and a piece never cuts a word or a run of whitespace."""
    from transformers import AutoTokenizer

    whole = ("".join(SNIPPETS) + "\n\n   \n" + "word " * 50 + "\n") * 20
    text = tmp_path / "code.txt"
    text.write_text(whole)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    monkeypatch.setattr(tokenized_module, "CHUNK_CHARS", 200)
    watched = watch_tokenizer(monkeypatch)
    source = resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17)
    assert all_tokens(source).tolist() == tokenizer.encode(whole, add_special_tokens=False)
    assert 0 < watched[0].longest <= 5 * 200 < len(whole)


def test_tokenizing_holds_a_piece_of_the_text_not_all_of_it(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole text and a Python list of all its ids (~29x the file) were held at once."""
    import tracemalloc

    warm = tmp_path / "warm.txt"  # transformers' lazy imports allocate on first use
    warm.write_text("".join(SNIPPETS) * 30)
    resolve_data(str(warm), tokenizer=str(tokenizer_dir), min_tokens=17)
    text = tmp_path / "big.txt"
    text.write_text("".join(SNIPPETS) * 20_000)  # 2.5 MB
    monkeypatch.setattr(tokenized_module, "CHUNK_CHARS", 1 << 14)
    tracemalloc.start()
    try:
        source = resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(all_tokens(source)) > 500_000
    assert peak < text.stat().st_size / 4, f"peak {peak:,} B for {text.stat().st_size:,} B"


# -- D4: a run that repeats its data -------------------------------------------------------------


def test_a_run_that_draws_its_data_many_times_is_told(tmp_path: Path) -> None:
    """33 tokens, one window of 32: 30 steps of 2 drew the one window 60 times, silently."""
    split = tmp_path / "tiny"
    split.mkdir()
    for name in ("train.bin", "val.bin"):
        np.arange(33, dtype=np.uint16).tofile(split / name)
    source = resolve_data(str(split), min_tokens=33)
    use = data_use(source, steps=30, global_batch_size=2, seq_len=32, eval_batches=2)
    assert use is not None
    assert (use.train_tokens, use.drawn_tokens, use.val_windows, use.eval_windows) == (
        33,
        1920,
        1,
        4,
    )
    assert use.passes == pytest.approx(1920 / 33)
    notice = repetition_notice(source, use)
    assert notice == (
        f"data {split}: the run draws 1,920 tokens from 33 train tokens, about 58.2 passes "
        "(windows at random positions, with replacement; more data or fewer --steps repeat "
        "less); each evaluation draws 4 windows from 1 distinct validation windows (fewer "
        "--eval-batches repeat less)"
    )


def test_a_run_within_its_data_or_on_synthetic_data_is_not_told(tmp_path: Path) -> None:
    ids = tmp_path / "ids.bin"
    np.arange(100_000, dtype=np.uint16).tofile(ids)
    source = resolve_data(str(ids))
    use = data_use(source, steps=10, global_batch_size=8, seq_len=128, eval_batches=2)
    assert use is not None and use.passes < 1
    assert repetition_notice(source, use) is None
    synthetic = resolve_data("synthetic", model_vocab=256)
    assert data_use(synthetic, steps=10**6, global_batch_size=8, seq_len=128) is None
