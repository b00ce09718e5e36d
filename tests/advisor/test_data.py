"""Token sources (``--data``) and the deterministic, resumable batch order."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from advisor.data import StepSampler, TokenSource, WindowDataset, make_loader, resolve_data
from advisor.data.sources import stdlib_files
from advisor.errors import UsageProblem
from advisor.models.objectives import IGNORE_INDEX, Objective

CAUSAL = Objective("causal_lm")
MLM = Objective("mlm", data_vocab_size=256, mask_token_id=255)
SNIPPETS = [
    "def add(x, y):\n    return x + y\n",
    "class Point:\n    def __init__(self, x):\n        self.x = x\n",
    "for i in range(10):\n    print(i * i)\n",
]


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache for the module: the stdlib corpus is built once (~1 s), never in ~/.cache."""
    path = tmp_path_factory.mktemp("advisor-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADVISOR_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def stdlib(cache: Path) -> TokenSource:
    return resolve_data("stdlib")


def one_line_problem(excinfo: pytest.ExceptionInfo[UsageProblem]) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message, repr(message)
    return message


def write_bin(path: Path, ids: np.ndarray) -> Path:
    path.write_bytes(ids.astype(np.uint16).tobytes())
    return path


# -- sources ----------------------------------------------------------------------------------


def test_stdlib_source_is_cached(stdlib: TokenSource, cache: Path) -> None:
    assert stdlib.vocab_size == 256 and stdlib.paths is not None
    files = [Path(p) for p in stdlib.paths]
    assert all(p.parent == cache for p in files)
    before = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files]
    again = resolve_data("stdlib")
    assert again == stdlib
    assert [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files] == before  # not rewritten


def test_stdlib_split_is_disjoint_by_file(stdlib: TokenSource) -> None:
    train, val = (bytes(stdlib.tokens(split)) for split in ("train", "val"))
    assert 0.03 < len(val) / (len(train) + len(val)) < 0.2
    sample = [p for p in stdlib_files() if p.stat().st_size > 4096][::40]
    where = [(p.read_bytes() in train, p.read_bytes() in val) for p in sample]
    assert all(in_train != in_val for in_train, in_val in where)  # each file in one split only
    assert any(in_val for _, in_val in where) and any(in_train for in_train, _ in where)


def test_stdlib_split_is_deterministic(
    stdlib: TokenSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path))
    rebuilt = resolve_data("stdlib")
    assert rebuilt.paths != stdlib.paths
    for split in ("train", "val"):
        assert np.array_equal(rebuilt.tokens(split), stdlib.tokens(split))


def test_text_file_bytes_split_at_the_end(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(1, 256)) * 4)  # any byte but NUL (which is not text)
    source = resolve_data(str(text))
    train, val = source.tokens("train"), source.tokens("val")
    assert (source.kind, source.vocab_size) == ("text", 256)
    assert len(train) + len(val) == 1020 and len(val) == pytest.approx(102, abs=1)
    assert np.array_equal(np.concatenate([train, val]), np.frombuffer(text.read_bytes(), np.uint8))


def test_bin_single_file_and_train_val_dir(tmp_path: Path) -> None:
    ids = np.arange(1000) * 7 % 5000
    single = resolve_data(str(write_bin(tmp_path / "tokens.bin", ids)))
    assert (single.kind, single.vocab_size) == ("bin", int(ids.max()) + 1)
    assert np.array_equal(np.concatenate([single.tokens("train"), single.tokens("val")]), ids)
    assert len(single.tokens("val")) == 100

    split_dir = tmp_path / "split"
    split_dir.mkdir()
    write_bin(split_dir / "train.bin", np.full(300, 60000))
    write_bin(split_dir / "val.bin", np.arange(50))
    both = resolve_data(str(split_dir))
    assert both.vocab_size == 60001  # the largest id of either file, + 1
    assert both.tokens("train").tolist() == [60000] * 300
    assert both.tokens("val").tolist() == list(range(50))


def test_synthetic_source_uses_the_model_vocab() -> None:
    source = resolve_data("synthetic", model_vocab=50257)
    dataset = WindowDataset(source, "train", 32, 0, CAUSAL)
    window = dataset.window(3)
    assert window.shape == (33,) and int(window.min()) >= 0 and int(window.max()) < 50257
    assert int(window.max()) > 255  # not bytes


def test_bad_data_paths_are_usage_problems(tmp_path: Path) -> None:
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    (tmp_path / "short.txt").write_bytes(b"tiny")
    (tmp_path / "half").mkdir()
    write_bin(tmp_path / "half" / "train.bin", np.arange(10))
    cases = {
        str(tmp_path / "missing.txt"): "does not exist",
        str(tmp_path / "odd.bin"): "odd size",
        str(tmp_path / "half"): "train.bin and val.bin",
        str(tmp_path / "short.txt"): "shorter --seq-len",
    }
    for spec, hint in cases.items():
        with pytest.raises(UsageProblem) as excinfo:
            resolve_data(spec, min_tokens=65)
        assert hint in one_line_problem(excinfo), spec


def test_a_data_directory_missing_a_split_names_it_and_the_way_forward(tmp_path: Path) -> None:
    """It said "needs train.bin and val.bin" for a directory of one train.bin, whatever was
    missing, and not that the train.bin alone would do."""
    (tmp_path / "half").mkdir()
    write_bin(tmp_path / "half" / "train.bin", np.arange(10))
    (tmp_path / "none").mkdir()
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(str(tmp_path / "half"))
    assert one_line_problem(excinfo) == (
        f"directory {tmp_path / 'half'} has no val.bin: a --data directory holds train.bin and "
        "val.bin of uint16 token ids (nanoGPT's format), or shards named for their split "
        "(llm.c's fineweb_train_000001.bin ... and fineweb_val_000000.bin), or pass "
        f"{tmp_path / 'half' / 'train.bin'} alone (its last 10% is validation), or name the "
        "validation set with --val-data; a file of ids or text is passed as the file itself"
    )
    with pytest.raises(UsageProblem, match=r"has no train\.bin and val\.bin: a --data dir"):
        resolve_data(str(tmp_path / "none"))
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(UsageProblem, match=r"odd size \(3 bytes\): .* or save another dtype"):
        resolve_data(str(tmp_path / "odd.bin"))


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_a_bin_of_wider_ids_is_refused_with_how_to_write_it(tmp_path: Path, dtype: type) -> None:
    """np.uint32 ids read as uint16 trained on every second token being id 0, silently."""
    np.arange(1000, dtype=dtype).tofile(tmp_path / "wide.bin")
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(str(tmp_path / "wide.bin"))
    line = one_line_problem(excinfo)
    assert "looks like 32- or 64-bit token ids" in line and "dtype=np.uint16" in line
    split = tmp_path / "split"
    split.mkdir()
    write_bin(split / "train.bin", np.arange(1000))
    np.arange(1000, dtype=np.uint32).tofile(split / "val.bin")
    with pytest.raises(UsageProblem, match=r"val\.bin looks like"):
        resolve_data(str(split))
    # uint16 ids whose every second one is 0 by chance (a tiny file) are not refused
    write_bin(tmp_path / "small.bin", np.array([5, 0] * 10))
    assert resolve_data(str(tmp_path / "small.bin"), min_tokens=2).vocab_size == 6


@pytest.mark.parametrize("name", ["empty.txt", "empty.bin"])
def test_empty_data_file_is_a_usage_problem(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(UsageProblem):
        resolve_data(str(tmp_path / name))


def test_tokenizer_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    bin_file = write_bin(tmp_path / "ids.bin", np.arange(100))
    for spec in ("synthetic", str(bin_file)):
        with pytest.raises(UsageProblem) as excinfo:
            resolve_data(spec, tokenizer=str(tmp_path))
        assert "drop it" in one_line_problem(excinfo)


# -- tokenizer ------------------------------------------------------------------------------


def build_tokenizer(directory: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE trained offline on a few snippets, saved as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["[UNK]", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(SNIPPETS * 20, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", mask_token="[MASK]"
    )
    wrapped.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def test_text_through_a_local_tokenizer(tokenizer_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    source = resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert source.kind == "tokenized"
    assert source.vocab_size == len(tokenizer)
    assert source.mask_token_id == tokenizer.mask_token_id
    ids = np.concatenate([source.tokens("train"), source.tokens("val")])
    assert len(ids) < len(text.read_bytes()) / 2  # merges learned from the snippets
    assert tokenizer.decode(ids.tolist()) == text.read_text()
    assert resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17) == source


def test_an_hf_model_directory_tokenizes_text_with_its_own_tokenizer(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """Fine-tuning hf:DIR without --tokenizer fed a pretrained model byte values as token ids
    (ids 0-255 of its vocabulary: unrelated tokens), silently; DIR's own tokenizer is the
    default now, for text data only, and --tokenizer still names another."""
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(tokenizer_dir, model_dir)
    (model_dir / "model.safetensors").write_bytes(b"x" * 64)  # weights: never hashed
    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    by_default = resolve_data(str(text), min_tokens=17, model=f"hf:{model_dir}")
    named = resolve_data(str(text), tokenizer=str(tokenizer_dir), min_tokens=17)
    assert by_default.kind == "tokenized" and by_default.vocab_size == named.vocab_size
    assert np.array_equal(by_default.tokens("train"), named.tokens("train"))
    assert by_default.description.endswith("the model directory’s own)")
    (model_dir / "model.safetensors").write_bytes(b"y" * 64)  # new weights, same tokenizer
    assert resolve_data(str(text), min_tokens=17, model=f"hf:{model_dir}").paths == (
        by_default.paths
    )
    # not for other models, a config file, token ids or synthetic data
    assert resolve_data(str(text), min_tokens=17, model="gpt-tiny").kind == "text"
    config_only = f"hf:{model_dir / 'tokenizer_config.json'}"
    assert resolve_data(str(text), min_tokens=17, model=config_only).kind == "text"
    assert resolve_data("synthetic", model=f"hf:{model_dir}").kind == "synthetic"
    ids = tmp_path / "ids.bin"
    np.arange(64, dtype=np.uint16).tofile(ids)
    assert resolve_data(str(ids), model=f"hf:{model_dir}").kind == "bin"


def test_missing_or_invalid_tokenizer(tmp_path: Path) -> None:
    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    (tmp_path / "not-a-tokenizer").mkdir()
    cases = {"no-such-dir": "does not exist", "not-a-tokenizer": "cannot load a tokenizer"}
    for name, hint in cases.items():
        with pytest.raises(UsageProblem, match=hint):
            resolve_data(str(text), tokenizer=str(tmp_path / name))


def test_invalid_tokenizer_message_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    (tmp_path / "not-a-tokenizer").mkdir()
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(str(text), tokenizer=str(tmp_path / "not-a-tokenizer"))
    one_line_problem(excinfo)


def test_tokenizer_without_transformers_names_the_extra(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(UsageProblem) as excinfo:
        resolve_data(str(text), tokenizer=str(tokenizer_dir))
    assert "pip install 'transformer-advisor[hf]'" in one_line_problem(excinfo)


def test_replacing_the_tokenizer_invalidates_the_cache(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    text = tmp_path / "code.txt"
    text.write_text("".join(SNIPPETS) * 30)
    directory = build_tokenizer(tmp_path / "tok", vocab_size=300)
    first = resolve_data(str(text), tokenizer=str(directory))
    build_tokenizer(directory, vocab_size=270)  # same path, fewer merges
    second = resolve_data(str(text), tokenizer=str(directory))
    assert second.vocab_size < first.vocab_size
    assert len(second.tokens("train")) > len(first.tokens("train"))


# -- deterministic order ----------------------------------------------------------------------


def items(dataset: WindowDataset, indices: list[int]) -> list[dict[str, torch.Tensor]]:
    return [dataset[i] for i in indices]


def same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("objective", [CAUSAL, MLM], ids=["causal", "mlm"])
def test_window_item_is_a_pure_function_of_seed_and_index(
    stdlib: TokenSource, objective: Objective
) -> None:
    indices = [0, 1, 7, 10**9]
    first = items(WindowDataset(stdlib, "train", 32, 3, objective), indices)
    fresh = items(WindowDataset(stdlib, "train", 32, 3, objective), indices[::-1])[::-1]
    assert same(first, fresh)  # and independent of the order items are read in
    assert first[0]["input_ids"].shape == (32,)
    assert not same(first, items(WindowDataset(stdlib, "train", 32, 4, objective), indices))
    assert not same(first, items(WindowDataset(stdlib, "val", 32, 3, objective), indices))
    if objective.kind == "mlm":
        assert (first[0]["labels"] == IGNORE_INDEX).any()


def test_windows_are_real_text_of_the_split(stdlib: TokenSource) -> None:
    dataset = WindowDataset(stdlib, "val", 64, 0, CAUSAL)
    val = bytes(stdlib.tokens("val"))
    for i in range(5):
        item = dataset[i]
        assert torch.equal(item["input_ids"][1:], item["labels"][:-1])
        window = bytes(item["input_ids"].tolist()) + bytes(item["labels"][-1:].tolist())
        assert window in val


def test_loader_order_is_the_same_with_worker_processes(stdlib: TokenSource) -> None:
    dataset = WindowDataset(stdlib, "train", 16, 11, MLM)

    def batches(num_workers: int) -> list[dict[str, torch.Tensor]]:
        sampler = StepSampler(start_step=0, num_steps=3, micro_batch=2, accum=2)
        loader = make_loader(
            dataset, sampler, micro_batch=2, num_workers=num_workers, pin_memory=False
        )
        return list(loader)

    in_process = batches(0)
    assert len(in_process) == 6 and in_process[0]["input_ids"].shape == (2, 16)
    assert same(in_process, batches(2))


@pytest.mark.parametrize(
    "layouts",
    [
        [(8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 4, 2), (4, 1, 2), (1, 1, 8)],
        [(3, 2, 1), (3, 1, 2), (1, 3, 2), (6, 1, 1)],
    ],
    ids=["global8", "global6"],
)
def test_every_split_of_the_global_batch_reads_the_same_samples(
    layouts: list[tuple[int, int, int]],
) -> None:
    num_steps = 3

    def per_step(micro: int, accum: int, world: int) -> list[list[int]]:
        steps: list[list[int]] = [[] for _ in range(num_steps)]
        for rank in range(world):
            sampler = StepSampler(
                start_step=0,
                num_steps=num_steps,
                micro_batch=micro,
                accum=accum,
                rank=rank,
                world=world,
            )
            indices = list(sampler)
            assert len(indices) == len(sampler) == num_steps * micro * accum
            for s in range(num_steps):
                steps[s] += indices[s * micro * accum : (s + 1) * micro * accum]
        return [sorted(step) for step in steps]

    reference = per_step(*layouts[0])
    assert all(len(set(step)) == len(step) for step in reference)  # no sample twice
    assert len({i for step in reference for i in step}) == num_steps * len(reference[0])
    for layout in layouts[1:]:
        assert per_step(*layout) == reference, layout


def test_resume_from_step_k_yields_the_same_tail(stdlib: TokenSource) -> None:
    dataset = WindowDataset(stdlib, "train", 16, 5, MLM)

    def run(start: int, num: int) -> list[dict[str, torch.Tensor]]:
        sampler = StepSampler(start_step=start, num_steps=num, micro_batch=2, accum=3)
        return list(make_loader(dataset, sampler, micro_batch=2, num_workers=0, pin_memory=False))

    full = run(0, 5)
    resumed = run(2, 3)
    assert same(resumed, full[2 * 3 :])
    assert not same(full[:3], full[3:6])
