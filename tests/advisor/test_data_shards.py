"""Token shards as llm.c writes them (a 1 KiB header, then uint16 or uint32 ids) and directories
of shards (fineweb_train_000001.bin ...): the header is never read as tokens, a cut-short shard
is refused, and a directory's train and val shards each read as one stream."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from advisor.cli import main
from advisor.data import StepSampler, WindowDataset, make_loader, resolve_data, sources
from advisor.data.shards import (
    HEADER_BYTES,
    ShardedTokens,
    directory_shards,
    shard_header,
    shard_set,
    split_of,
)
from advisor.errors import UsageProblem
from advisor.models import build_model
from advisor.training import check_data
from strategies.config import TrainConfig

GPT2, LLAMA3 = (20240520, 1, np.uint16), (20240801, 7, np.uint32)


def write_shard(
    path: Path, ids: np.ndarray, fmt: tuple[int, int, type] = GPT2, count: int | None = None
) -> Path:
    """A shard as llm.c's write_datafile writes it (``count``: a header that lies)."""
    magic, version, dtype = fmt
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(ids) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype=dtype).tobytes())
    return path


def problem(path: Path) -> str:
    with pytest.raises(UsageProblem) as excinfo:
        shard_header(path)
    return str(excinfo.value)


@pytest.mark.parametrize("fmt", [GPT2, LLAMA3], ids=["gpt2-uint16", "llama3-uint32"])
def test_the_header_names_the_width_and_count_of_the_ids(tmp_path: Path, fmt: tuple) -> None:
    ids = np.arange(1000) * 37 % 50_000
    header = shard_header(write_shard(tmp_path / "s.bin", ids, fmt))
    assert header is not None
    assert header.dtype == np.dtype(fmt[2]).name and header.num_tokens == 1000
    read = np.memmap(tmp_path / "s.bin", dtype=header.dtype, mode="r", offset=HEADER_BYTES)
    assert np.array_equal(read, ids)


def test_a_file_without_the_magic_is_no_shard(tmp_path: Path) -> None:
    plain = tmp_path / "plain.bin"
    np.arange(600, dtype=np.uint16).tofile(plain)
    assert shard_header(plain) is None
    (tmp_path / "empty.bin").write_bytes(b"")
    assert shard_header(tmp_path / "empty.bin") is None


def test_a_cut_short_shard_is_refused_with_both_sizes(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "cut.bin", np.arange(100), count=1000)
    message = problem(path)
    assert "promises 1,000 uint16 tokens (3,024 bytes with the header)" in message
    assert "the file has 1,224 bytes" in message and "download it again" in message


def test_a_header_cut_short_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "head.bin"
    path.write_bytes(np.array([20240520, 1, 5], dtype="<i4").tobytes())
    assert "shorter than its 1024-byte header (12 bytes)" in problem(path)


def test_another_version_of_the_format_is_refused(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "v3.bin", np.arange(10), (20240520, 3, np.uint16))
    assert "GPT-2 token shard of version 3, not 1" in problem(path)


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("fineweb_train_000001.bin", "train"),
        ("fineweb_val_000000.bin", "val"),
        ("train.bin", "train"),
        ("VAL.BIN", "val"),
        ("shakespeare-validation.bin", "val"),
        ("tiny_valid.bin", "val"),
        ("interval_3.bin", None),
        ("retrain_1.bin", None),
        ("data_000.bin", None),
        ("train_val.bin", None),  # says both: neither
    ],
)
def test_a_shards_split_is_read_from_its_name(name: str, split: str | None) -> None:
    assert split_of(name) == split


def test_a_directory_lists_its_shards_by_split_in_name_order(tmp_path: Path) -> None:
    for name in ("f_train_2.bin", "f_train_1.bin", "f_val_0.bin", "notes.bin", "README.md"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub_train.bin").mkdir()
    found = directory_shards(tmp_path)
    assert [p.name for p in found["train"]] == ["f_train_1.bin", "f_train_2.bin"]
    assert [p.name for p in found["val"]] == ["f_val_0.bin"]
    assert [p.name for p in found[""]] == ["notes.bin"]


def test_sharded_tokens_read_as_one_stream_across_shard_ends() -> None:
    parts = [np.arange(0, 5), np.arange(5, 5), np.arange(5, 12), np.arange(12, 20)]
    tokens = ShardedTokens(parts)
    whole = np.arange(20)
    assert len(tokens) == 20
    for start in range(20):
        for stop in range(start, 21):
            assert np.array_equal(tokens[start:stop], whole[start:stop]), (start, stop)
    assert np.array_equal(tokens[-3:], whole[-3:])
    with pytest.raises(TypeError):
        tokens[3]  # type: ignore[index]
    with pytest.raises(ValueError):
        tokens[0:10:2]


def test_a_split_of_llmc_shards_reads_alike(tmp_path: Path) -> None:
    a = write_shard(tmp_path / "x_train_1.bin", np.arange(10), LLAMA3)
    b = write_shard(tmp_path / "x_train_2.bin", np.arange(7), LLAMA3)
    shards = shard_set([a, b])
    assert (shards.dtype, shards.offset, shards.num_tokens) == ("uint32", HEADER_BYTES, 17)
    assert shards.writer == "LLaMA 3" and shards.paths == (str(a), str(b))
    assert shards.counts == (10, 7)


def test_raw_uint16_shards_have_no_header(tmp_path: Path) -> None:
    a = tmp_path / "x_train_1.bin"
    np.arange(300, dtype=np.uint16).tofile(a)
    shards = shard_set([a])
    assert (shards.dtype, shards.offset, shards.num_tokens, shards.writer) == (
        "uint16",
        0,
        300,
        None,
    )
    assert shards.counts == (300,)


def test_shards_that_mix_formats_are_refused_naming_one_of_each(tmp_path: Path) -> None:
    a = write_shard(tmp_path / "x_train_1.bin", np.arange(10))
    b = tmp_path / "x_train_2.bin"
    np.arange(300, dtype=np.uint16).tofile(b)
    c = write_shard(tmp_path / "x_train_3.bin", np.arange(10), LLAMA3)
    with pytest.raises(UsageProblem) as excinfo:
        shard_set([a, b, c])
    assert str(excinfo.value) == (
        f"the shards of {tmp_path} mix formats (x_train_1.bin: llm.c GPT-2 shard; "
        "x_train_2.bin: raw uint16 ids; x_train_3.bin: llm.c LLaMA 3 shard): write them all "
        "with one writer"
    )


def test_a_raw_shard_of_odd_size_is_refused(tmp_path: Path) -> None:
    a = tmp_path / "x_train_1.bin"
    a.write_bytes(b"\x01\x02\x03")
    with pytest.raises(UsageProblem, match=r"odd size \(3 bytes\)"):
        shard_set([a])


# -- as --data and --val-data ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("advisor-cache")
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(path))
    return path


def ids(n: int, seed: int, vocab: int = 256) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n)


def test_an_llmc_shard_as_data_never_reads_its_header(tmp_path: Path) -> None:
    """Read as plain uint16 ids, its header trained as 512 tokens (the magic as id 55,240)."""
    tokens = ids(1000, 0)
    source = resolve_data(str(write_shard(tmp_path / "fineweb_val_000000.bin", tokens)))
    assert source.vocab_size == tokens.max() + 1
    assert np.array_equal(source.tokens("train")[:], tokens[:900])
    assert np.array_equal(source.tokens("val")[:], tokens[900:])
    assert source.description == "fineweb_val_000000.bin (1,000 tokens, an llm.c GPT-2 shard)"
    wide = resolve_data(str(write_shard(tmp_path / "l3.bin", tokens + 70_000, LLAMA3)))
    assert wide.dtype == "uint32" and wide.vocab_size == tokens.max() + 70_001


def test_a_directory_of_shards_reads_each_split_as_one_stream(tmp_path: Path) -> None:
    parts = [ids(300, 1), ids(200, 2), ids(250, 3)]
    write_shard(tmp_path / "fw_val_000000.bin", ids(120, 4))
    for i, part in enumerate(parts, 1):
        write_shard(tmp_path / f"fw_train_{i:06d}.bin", part)
    source = resolve_data(str(tmp_path))
    assert source.description == (
        f"{tmp_path}: 3 train shards + 1 val shard (750 + 120 tokens, llm.c GPT-2 shards)"
    )
    whole = np.concatenate(parts)
    train = source.tokens("train")
    assert len(train) == 750 and np.array_equal(train[0:750], whole)
    assert np.array_equal(source.tokens("val")[0:120], ids(120, 4))
    # Windows are drawn as from one file of the same ids (a window may span two shards).
    single = tmp_path.parent / f"{tmp_path.name}-whole"
    single.mkdir()
    whole.astype(np.uint16).tofile(single / "train.bin")
    ids(120, 4).astype(np.uint16).tofile(single / "val.bin")
    plain = resolve_data(str(single))
    objective = build_model("gpt-tiny", {"n_layer": 1}, meta=True).make_objective(256)
    for split in ("train", "val"):
        a = WindowDataset(source, split, 32, 7, objective)
        b = WindowDataset(plain, split, 32, 7, objective)
        batch_a, batch_b = a.__getitems__(list(range(64))), b.__getitems__(list(range(64)))
        assert torch.equal(batch_a["input_ids"], batch_b["input_ids"])
        assert torch.equal(a[5]["input_ids"], b[5]["input_ids"])


def test_a_directory_of_train_shards_without_val_needs_val_data(tmp_path: Path) -> None:
    data, val = tmp_path / "data", tmp_path / "held"
    data.mkdir()
    val.mkdir()
    write_shard(data / "fw_train_000001.bin", ids(300, 1))
    write_shard(data / "fw_train_000002.bin", ids(300, 2))
    (data / "notes.bin").write_bytes(b"")
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(str(data))
    message = str(excinfo.value)
    assert message.startswith(f"directory {data} has no val.bin: a --data directory holds")
    assert message.endswith(
        ", or name the validation set with --val-data (1 .bin files name neither split: "
        "notes.bin); a file of ids or text is passed as the file itself"
    )
    write_shard(val / "fw_val_000000.bin", ids(100, 3))
    write_shard(val / "fw_val_000001.bin", ids(100, 4))
    source = resolve_data(str(data), val_data=str(val))
    assert len(source.tokens("train")) == 600
    assert source.val is not None
    assert source.val.description == f"{val}: 2 val shards (200 tokens, llm.c GPT-2 shards)"
    assert np.array_equal(source.tokens("val")[0:200], np.concatenate([ids(100, 3), ids(100, 4)]))


def test_the_largest_id_of_a_large_file_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_shard(tmp_path / "big.bin", ids(1000, 5))
    monkeypatch.setattr(sources, "ID_CACHE_MIN_BYTES", 0)
    first = resolve_data(str(path)).vocab_size

    def no_scan(*args: object, **kwargs: object) -> tuple[int, int]:
        raise AssertionError("scanned again")

    monkeypatch.setattr(sources, "id_range", no_scan)
    assert resolve_data(str(path)).vocab_size == first
    # A file written again (another size) is scanned again.
    write_shard(path, ids(1200, 6))
    with pytest.raises(AssertionError, match="scanned again"):
        resolve_data(str(path))


def test_training_on_a_directory_of_shards(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        write_shard(data / f"fw_train_{i + 1:06d}.bin", ids(400, i))
    write_shard(data / "fw_val_000000.bin", ids(200, 9))
    out = tmp_path / "run"
    args = ["train", "--model", "gpt-tiny", "--model-arg", "n_layer=1", "--seq-len", "32"]
    args += ["--global-batch-size", "4", "--micro-batch-size", "4", "--steps", "2"]
    args += ["--data", str(data)]
    args += ["--quiet", "--out", str(out)]
    result = CliRunner().invoke(main, args, prog_name="advisor")
    assert result.exit_code == 0, result.output
    config = json.loads((out / "train_config.json").read_text())
    assert (
        config["data"]
        == f"{data}: 3 train shards + 1 val shard (1,200 + 200 tokens, llm.c GPT-2 shards)"
    )


def test_train_bin_and_val_bin_are_the_splits_whatever_else_is_there(tmp_path: Path) -> None:
    """A train_small.bin beside them was read as a second train shard (review, 2026-12-07)."""
    (tmp_path / "train.bin").write_bytes(ids(500, 1).astype(np.uint16).tobytes())
    (tmp_path / "val.bin").write_bytes(ids(100, 2).astype(np.uint16).tobytes())
    (tmp_path / "train_small.bin").write_bytes(ids(30, 3).astype(np.uint16).tobytes())
    (tmp_path / "val_old.bin").write_bytes(ids(30, 4).astype(np.uint16).tobytes())
    source = resolve_data(str(tmp_path))
    assert source.description == f"{tmp_path}/{{train,val}}.bin (500 + 100 tokens)"
    assert source.shards is None and len(source.tokens("train")) == 500
    other = tmp_path.parent / f"{tmp_path.name}-other.bin"
    other.write_bytes(ids(500, 5).astype(np.uint16).tobytes())
    with_val = resolve_data(str(other), val_data=str(tmp_path))
    assert with_val.val is not None and with_val.val.description.endswith("val.bin (100 tokens)")


def test_a_profile_needs_the_train_split_only(tmp_path: Path) -> None:
    """A profile never evaluates: a directory of train shards (a run whose --val-data names
    the validation set) and a file whose last 10% is shorter than a window profile."""
    write_shard(tmp_path / "fw_train_000001.bin", ids(400, 1))
    assert len(resolve_data(str(tmp_path), min_tokens=33, need_val=False).tokens("train")) == 400
    with pytest.raises(UsageProblem, match=r"has no val\.bin"):
        resolve_data(str(tmp_path), min_tokens=33)
    small = write_shard(tmp_path.parent / f"{tmp_path.name}-small.bin", ids(200, 2))
    assert resolve_data(str(small), min_tokens=33, need_val=False).num_tokens("train") == 180
    with pytest.raises(UsageProblem, match="has 20 val tokens, fewer than one window of 33"):
        resolve_data(str(small), min_tokens=33)


def test_a_file_rewritten_with_its_mtime_kept_is_scanned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cp -p, rsync -a and tar keep the modification time: the cached largest id went stale
    and training failed with an IndexError instead of the vocabulary message."""
    monkeypatch.setattr(sources, "ID_CACHE_MIN_BYTES", 0)
    path = write_shard(tmp_path / "big.bin", np.full(1000, 100))
    stat = path.stat()
    assert resolve_data(str(path)).vocab_size == 101
    write_shard(path, np.full(1000, 60_000))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns
    assert resolve_data(str(path)).vocab_size == 60_001


def test_llmc_evaluation_examples_are_no_token_stream(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "hellaswag_val.bin", np.arange(10), (20240522, 1, np.uint16))
    assert problem(path) == (
        f"{path} holds llm.c evaluation examples (magic 20240522: multiple-choice items such "
        "as HellaSwag's), not a token stream: pass token shards (llm.c's "
        "fineweb_val_000000.bin) or token ids"
    )


def test_val_data_that_the_run_trains_on_is_refused(tmp_path: Path) -> None:
    single = write_shard(tmp_path / "single.bin", ids(1000, 1))
    data = tmp_path / "dir"
    data.mkdir()
    write_shard(data / "fw_train_000001.bin", ids(400, 2))
    write_shard(data / "fw_val_000000.bin", ids(400, 3))
    for spec, val in ((single, single), (data, data / "fw_train_000001.bin")):
        with pytest.raises(UsageProblem) as excinfo:
            resolve_data(str(spec), val_data=str(val))
        assert str(excinfo.value) == (
            f"--val-data {val} is data that --data {spec} trains on: its eval loss would "
            "measure training data; pass a held-out file, or drop --val-data to evaluate on "
            "the validation split of --data"
        )
    # the directory's own val shards as --val-data: what it evaluates on anyway
    assert resolve_data(str(data), val_data=str(data)).val is not None


def test_a_val_data_file_that_cannot_be_read_is_named_as_val_data(tmp_path: Path) -> None:
    train = tmp_path / "train.txt"
    train.write_text("text to train on. " * 50)
    jsonl = tmp_path / "v.jsonl"
    jsonl.write_text('{"body": "held out"}\n')
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(str(train), val_data=f"{jsonl}:text")
    assert f"--val-data {jsonl}:FIELD" in str(excinfo.value)
    assert "--data " not in str(excinfo.value)
    binary = tmp_path / "v.txt"
    binary.write_bytes(b"\x1f\x8b" + b"\x00" * 100)
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(str(train), val_data=str(binary))
    assert str(excinfo.value).endswith(
        "; --val-data takes a text file, FILE.jsonl[:FIELD], a .bin of uint16 token ids, a .npy "
        "of integer token ids, or a directory holding val.bin or val shards"
    )


def test_a_run_checks_its_data_before_the_profile_that_reads_train_only(tmp_path: Path) -> None:
    """advisor run's profile stage refused train shards that --val-data completed (review,
    2026-12-07): the profile reads the train split only; the run checks both first."""
    data, held = tmp_path / "data", tmp_path / "held"
    data.mkdir()
    held.mkdir()
    write_shard(data / "fw_train_000001.bin", ids(400, 1))
    write_shard(held / "fw_val_000000.bin", ids(400, 2))
    config = TrainConfig(data=str(data), seq_len=32, model_args={"n_layer": 1})
    source = check_data(config, str(held))
    assert source.val is not None and source.val.description.startswith(f"{held}: 1 val shard")
    with pytest.raises(UsageProblem, match=r"has no val\.bin: .* or name the validation set"):
        check_data(config, None)


def test_loader_workers_read_shards_and_a_nested_val_set_as_in_process(tmp_path: Path) -> None:
    data, held = tmp_path / "data", tmp_path / "held"
    data.mkdir()
    held.mkdir()
    for i in range(3):
        write_shard(data / f"fw_train_{i + 1:06d}.bin", ids(50, i))
    write_shard(held / "fw_val_000000.bin", ids(60, 8))
    write_shard(held / "fw_val_000001.bin", ids(60, 9))
    source = resolve_data(str(data), val_data=str(held))
    objective = build_model("gpt-tiny", {"n_layer": 1}, meta=True).make_objective(256)
    for split in ("train", "val"):
        dataset = WindowDataset(source, split, 32, 3, objective)

        def batches(workers: int, dataset: WindowDataset = dataset) -> list[torch.Tensor]:
            sampler = StepSampler(start_step=0, num_steps=4, micro_batch=4, accum=1)
            loader = make_loader(
                dataset, sampler, micro_batch=4, num_workers=workers, pin_memory=False
            )
            return [batch["input_ids"] for batch in loader]

        in_process = batches(0)
        assert len(in_process) == 4
        assert all(torch.equal(a, b) for a, b in zip(in_process, batches(2), strict=True))
