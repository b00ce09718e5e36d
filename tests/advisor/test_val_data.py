"""``--val-data``: a validation set of its own (the whole of a file, read as ``--data`` is), the
eval loss computed on it, its refusals (one line, exit 2), a resume that keeps or changes it,
and its way through ``advisor run``, ``advisor tune`` and a launched rank's arguments."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from advisor.cli import main
from advisor.data import data_use, repetition_notice, resolve_data
from advisor.errors import UsageProblem
from advisor.trainer.loop import RunOptions
from advisor.training import resumed_options
from advisor.training import train as run_training
from strategies.config import TrainConfig
from tests.advisor.test_data import build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

TINY = TrainConfig(
    model="gpt-tiny",
    model_args={"n_layer": 1, "n_embd": 32},
    seq_len=32,
    global_batch_size=4,
    micro_batch_size=2,
    grad_accum_steps=2,
    warmup_steps=2,
)
TINY_FLAGS = [
    "--model",
    "gpt-tiny",
    "--model-arg",
    "n_layer=1",
    "--model-arg",
    "n_embd=32",
    "--seq-len",
    "32",
    "--global-batch-size",
    "4",
    "--micro-batch-size",
    "4",
]


@pytest.fixture(autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("advisor-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADVISOR_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Text and token-id files of each form, written once for the module."""
    root = tmp_path_factory.mktemp("val-data")
    rng = np.random.default_rng(0)
    paths = {
        "text": root / "train.txt",
        "val_text": root / "val.txt",
        "ids": root / "ids.bin",
        "val_ids": root / "val_ids.bin",
        "big_ids": root / "big_ids.bin",
        "short": root / "short.txt",
        "npy": root / "val.npy",
        "jsonl": root / "val.jsonl",
        "gzip": root / "val.txt.gz",
        "dir": root / "data",
        "val_dir": root / "val_only",
        "same_val_dir": root / "same_val",
        "const_dir": root / "const_val",
        "no_val_dir": root / "no_val",
    }
    paths["text"].write_bytes(bytes(rng.integers(97, 105, 2000, dtype=np.uint8)))
    paths["val_text"].write_text("z" * 500)
    rng.integers(0, 200, 3000).astype(np.uint16).tofile(paths["ids"])
    rng.integers(0, 200, 600).astype(np.uint16).tofile(paths["val_ids"])
    np.full(100, 300, dtype=np.uint16).tofile(paths["big_ids"])
    paths["short"].write_text("abc")
    paths["gzip"].write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(60)))
    np.save(paths["npy"], np.arange(100, dtype=np.int32))
    paths["jsonl"].write_text(
        json.dumps({"text": "hello " * 20}) + "\n" + json.dumps({"text": "x"})
    )
    for name in ("dir", "val_dir", "same_val_dir", "const_dir", "no_val_dir"):
        paths[name].mkdir()
    # ids under 16: a few steps learn that, and a validation set of id 200 then scores far worse
    train_ids = rng.integers(0, 16, 4000).astype(np.uint16)
    val_ids = rng.integers(0, 16, 1000).astype(np.uint16)
    train_ids.tofile(paths["dir"] / "train.bin")
    val_ids.tofile(paths["dir"] / "val.bin")
    val_ids.tofile(paths["same_val_dir"] / "val.bin")  # no train.bin: only val.bin is read
    rng.integers(0, 256, 500).astype(np.uint16).tofile(paths["val_dir"] / "val.bin")
    np.full(1000, 200, dtype=np.uint16).tofile(paths["const_dir"] / "val.bin")
    train_ids.tofile(paths["no_val_dir"] / "train.bin")
    return paths


# -- the source ----------------------------------------------------------------------------------


def test_the_whole_val_file_is_the_validation_set_and_a_single_file_trains_on_all_of_it(
    files: dict[str, Path],
) -> None:
    text, val = files["text"], files["val_text"]
    alone = resolve_data(str(text))
    assert alone.num_tokens("train") == 1800 and alone.val is None  # the last 10% held back
    source = resolve_data(str(text), val_data=str(val))
    assert np.array_equal(source.tokens("train"), np.frombuffer(text.read_bytes(), np.uint8))
    assert np.array_equal(source.tokens("val"), np.frombuffer(val.read_bytes(), np.uint8))
    assert source.description == alone.description  # the data is described as before
    assert source.val is not None and source.val.description == "val.txt (500 tokens)"


def test_val_data_takes_every_file_form_of_data(files: dict[str, Path]) -> None:
    ids = str(files["ids"])
    npy = resolve_data(ids, val_data=str(files["npy"]))
    assert npy.tokens("val").tolist() == list(range(100))
    own = resolve_data(ids, val_data=str(files["val_ids"]))
    assert np.array_equal(own.tokens("val"), np.fromfile(files["val_ids"], np.uint16))
    # A directory: its val.bin, whether or not it holds a train.bin.
    directory = resolve_data(ids, val_data=str(files["val_dir"]))
    assert np.array_equal(directory.tokens("val"), np.fromfile(files["val_dir"] / "val.bin", "<u2"))
    assert directory.num_tokens("train") == 3000
    jsonl = resolve_data(str(files["text"]), val_data=f"{files['jsonl']}:text")
    assert bytes(jsonl.tokens("val")) == ("hello " * 20).encode() + b"\n\nx"


def test_a_directory_or_the_stdlib_keeps_its_train_part(files: dict[str, Path]) -> None:
    data = str(files["dir"])
    source = resolve_data(data, val_data=str(files["const_dir"]))
    assert np.array_equal(source.tokens("train"), resolve_data(data).tokens("train"))
    assert set(source.tokens("val").tolist()) == {200}


def test_text_val_data_is_tokenized_with_the_train_datas_tokenizer(
    files: dict[str, Path], tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from transformers import AutoTokenizer

    tokenizer = build_tokenizer(tmp_path / "tokenizer")
    val = tmp_path / "val.txt"
    val.write_text("def f(x):\n    return x + 1\n" * 20)
    source = resolve_data(str(files["text"]), tokenizer=str(tokenizer), val_data=str(val))
    assert source.kind == "tokenized" and source.val is not None
    assert source.val.kind == "tokenized" and source.val.vocab_size == source.vocab_size
    expected = AutoTokenizer.from_pretrained(str(tokenizer)).encode(
        val.read_text(), add_special_tokens=False
    )
    assert source.tokens("val").tolist() == expected  # all of it, not its last 10%
    assert source.val.description.startswith("val.txt: ")


def test_the_repetition_notice_counts_the_val_sets_windows(files: dict[str, Path]) -> None:
    source = resolve_data(str(files["text"]), val_data=str(files["val_text"]))
    use = data_use(source, steps=1, global_batch_size=4, seq_len=32, eval_batches=200)
    assert use is not None and use.val_windows == 500 - 32
    notice = repetition_notice(source, use)
    assert notice == (
        "data train.txt: each evaluation draws 800 windows from 468 distinct validation windows "
        "of --val-data val.txt (fewer --eval-batches repeat less)"
    )


# -- refusals ------------------------------------------------------------------------------------


def train_cli(*args: str, out: Path) -> Result:
    return CliRunner().invoke(
        main,
        ["train", *TINY_FLAGS, "--steps", "1", "--quiet", "--out", str(out), *args],
        prog_name="advisor",
    )


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


FORMS = (
    "a text file, FILE.jsonl[:FIELD], a .bin of uint16 token ids, a .npy of integer token ids, "
    "or a directory holding val.bin or val shards"
)


def refusals(f: dict[str, Path]) -> list[tuple[str, str, str]]:
    """(--data, --val-data, the error line) of each refusal."""
    return [
        (
            str(f["text"]),
            "stdlib",
            f"--val-data stdlib is not a validation file: pass {FORMS}, or drop --val-data to "
            "evaluate on the validation split of --data",
        ),
        (
            str(f["text"]),
            "synthetic",
            f"--val-data synthetic is not a validation file: pass {FORMS}, or drop --val-data "
            "to evaluate on the validation split of --data",
        ),
        (
            "synthetic",
            str(f["val_text"]),
            f"--val-data {f['val_text']} with --data synthetic: random tokens have no "
            "validation file; pass the train data as --data FILE, or drop --val-data",
        ),
        (
            str(f["text"]),
            str(f["val_ids"]),
            f"--val-data {f['val_ids']} holds token ids (.bin) but --data {f['text']} is text: "
            "pass validation text (it is read as --data is, through the same tokenizer), or "
            "token ids for both",
        ),
        (
            str(f["ids"]),
            str(f["val_text"]),
            f"--val-data {f['val_text']} is text but --data {f['ids']} holds token ids (.bin): "
            "pass validation token ids from the same tokenizer (.bin or .npy), or text for both",
        ),
        (
            str(f["ids"]),
            str(f["big_ids"]),
            f"--val-data '{f['big_ids']}' has token ids up to 300 but gpt-tiny has a vocabulary "
            "of 256: pass validation ids from the train data's tokenizer (or --model-arg "
            "vocab_size=301)",
        ),
        (
            str(f["text"]),
            str(f["short"]),
            f"--val-data '{f['short']}' has 3 tokens, fewer than one window of 33: use more "
            "validation data or a shorter --seq-len",
        ),
        (
            str(f["text"]),
            str(f["text"].with_name("missing.txt")),
            f"--val-data '{f['text'].with_name('missing.txt')}' does not exist: pass {FORMS}",
        ),
        # the readers' refusals name the option that named the file, and what it takes
        (
            str(f["text"]),
            str(f["gzip"]),
            f"{f['gzip']} is gzip-compressed, not text: decompress it first; --val-data takes "
            f"{FORMS}",
        ),
        (
            str(f["text"]),
            f"{f['jsonl']}:body",
            f'{f["jsonl"]} line 1 has no "body" field (its keys: text): give each line a "body" '
            f"string, or name the field that holds the text: --val-data {f['jsonl']}:FIELD",
        ),
        (
            str(f["ids"]),
            str(f["no_val_dir"]),
            f"--val-data directory {f['no_val_dir']} has no val.bin: write the validation ids "
            "there as val.bin (uint16, nanoGPT's format) or as shards named for it (llm.c's "
            "fineweb_val_000000.bin), or pass the validation file itself",
        ),
    ]


def test_each_refusal_is_one_line_with_exit_2(files: dict[str, Path], tmp_path: Path) -> None:
    for number, (data, val, message) in enumerate(refusals(files)):
        out = tmp_path / f"run{number}"
        line = one_line_error(train_cli("--data", data, "--val-data", val, out=out))
        assert line == f"error: {message}"
        assert not out.exists()  # refused before the run directory (and the model) is made


def test_advisor_run_refuses_it_before_the_profile(files: dict[str, Path], tmp_path: Path) -> None:
    data, val, message = refusals(files)[3]
    out = tmp_path / "run"
    args = ["run", *TINY_FLAGS[:6], "--data", data, "--val-data", val, "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--quiet"], prog_name="advisor")
    assert one_line_error(result) == f"error: {message}"
    assert not (out / "profile.json").exists()


def test_advisor_tune_refuses_it_before_a_trial(files: dict[str, Path], tmp_path: Path) -> None:
    from tests.advisor.test_tuning import write_plan

    plan = write_plan(
        tmp_path, data=str(files["ids"]), parallelism="single", world_size=1, grad_accum_steps=2
    )
    args = ["tune", "--plan", str(plan), "--val-data", str(files["big_ids"]), "--quiet"]
    line = one_line_error(CliRunner().invoke(main, args, prog_name="advisor"))
    assert line == f"error: {refusals(files)[5][2]}"
    assert not (tmp_path / "tune").exists()


# -- training ------------------------------------------------------------------------------------


def train(data: Path, out: Path, val: Path | None = None, **kw: Any) -> Any:
    config = TINY.replace(data=str(data), lr=1e-2)
    options = RunOptions(
        out=out,
        steps=kw.pop("steps", 6),
        eval_every=0,
        eval_batches=2,
        progress=False,
        val_data=None if val is None else str(val),
        **kw,
    )
    return run_training(config, options)


def train_losses(out: Path) -> list[float]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["kind"] == "train"]


def test_the_eval_loss_is_computed_on_the_val_file(files: dict[str, Path], tmp_path: Path) -> None:
    """A directory's train part is the same with --val-data, so the runs train alike: the eval
    loss is then the val file's alone (a copy of the data's val.bin gives the same loss
    exactly; one id the train data never holds, a far higher one)."""
    data = files["dir"]
    plain = train(data, tmp_path / "plain")
    same = train(data, tmp_path / "same", val=files["same_val_dir"])
    const = train(data, tmp_path / "const", val=files["const_dir"])
    assert train_losses(tmp_path / "same") == train_losses(tmp_path / "plain")
    assert train_losses(tmp_path / "const") == train_losses(tmp_path / "plain")
    assert same.eval_loss == plain.eval_loss
    assert const.eval_loss > plain.eval_loss + 1.0, (const.eval_loss, plain.eval_loss)
    saved = json.loads((tmp_path / "const" / "train_config.json").read_text())
    assert saved["options"]["val_data"] == str(files["const_dir"])
    assert saved["val_data"] == f"{files['const_dir'] / 'val.bin'} (1,000 tokens)"
    plain_saved = json.loads((tmp_path / "plain" / "train_config.json").read_text())
    assert "val_data" not in plain_saved and "val_data" not in plain_saved["options"]


def val_notes(notes: list[str]) -> list[str]:
    """The notes about the validation data (a longer resume also says its schedule ended)."""
    return [n for n in notes if n.startswith(("validation data", "--val-data"))]


def test_a_resume_keeps_the_runs_val_data_or_says_what_another_changes(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    train(files["text"], out, val=files["val_text"], steps=2)
    kept = resumed_options(RunOptions(out=out, resume=True))
    assert kept.val_data == str(files["val_text"])
    said: list[str] = []
    result = train(files["text"], out, steps=3, resume=True, on_note=said.append)
    assert result.steps == 3 and not val_notes(said)  # kept: nothing to say
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["options"]["val_data"] == str(files["val_text"])
    # Another one: allowed, and said.
    train(files["text"], out, val=files["jsonl"], steps=4, resume=True, on_note=said.append)
    assert val_notes(said) == [
        f"validation data changed since {out} last started (then: val.txt (500 tokens); now: "
        "val.jsonl (2 documents of field 'text', 123 tokens)): the evaluations from here on "
        "read the new data, so their losses do not compare with the earlier ones"
    ]


def test_a_resume_that_adds_val_data_says_the_train_steps_now_read_all_of_a_file(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    train(files["text"], out, steps=2)
    said: list[str] = []
    train(files["text"], out, val=files["val_text"], steps=3, resume=True, on_note=said.append)
    assert val_notes(said) == [
        f"--val-data {files['val_text']}: {out} started without it, evaluating on the "
        f"validation split of {files['text']}; the evaluations from here on read val.txt (500 "
        "tokens), so their losses do not compare with the earlier ones; the train steps now "
        f"read the whole of {files['text']} (its last 10%, held back for validation until now, "
        "included), so they will not match an uninterrupted run"
    ]


# -- its way to child processes ------------------------------------------------------------------


def test_train_args_carry_it_and_the_cli_reads_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    options = RunOptions(out=Path("out"), steps=5, val_data="docs.jsonl:body")
    args = options.train_args(Path("plan.json"))
    assert args[args.index("--val-data") + 1] == "docs.jsonl:body"
    assert "--val-data" not in RunOptions(out=Path("out"), steps=5).train_args(Path("p.json"))
    seen: list[RunOptions] = []
    monkeypatch.setattr("advisor.cli.train.resolve_train_config", lambda *a: TINY)
    monkeypatch.setattr(
        "advisor.cli.train.run_training", lambda config, options, **kw: seen.append(options)
    )
    result = CliRunner().invoke(main, args, prog_name="advisor")
    assert result.exit_code == 0, result.output
    assert seen == [options]


def test_tune_passes_it_to_every_trial_in_a_study_of_its_own(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from advisor.tuning import TuneRequest, prepare
    from tests.advisor.test_tuning import write_plan

    plan = write_plan(
        tmp_path, data=str(files["text"]), parallelism="single", world_size=1, grad_accum_steps=2
    )
    val = str(files["val_text"])
    request = TuneRequest(trials=2, tokens_per_trial=40 * 128, val_data=val)
    assert request.command(plan, tmp_path)[-4:-2] == ["--val-data", val]
    with_val = prepare(plan, request, None)
    without = prepare(plan, TuneRequest(trials=2, tokens_per_trial=40 * 128), None)
    assert with_val.study_name.startswith(without.study_name + "-val-")
    # The CLI's flag reaches the request; the request's, each trial's options.
    asked: list[Any] = []
    monkeypatch.setattr("advisor.tuning.tune", lambda plan, request, **kw: asked.append(request))
    monkeypatch.setattr("advisor.cli.tune.summarize", lambda result: None)
    args = ["tune", "--plan", str(plan), "--val-data", val, "--quiet"]
    assert CliRunner().invoke(main, args, prog_name="advisor").exit_code == 0
    assert asked[0].val_data == val
    started: list[list[str]] = []

    class Child:
        returncode = 0

        def __init__(self, argv: list[str], **kw: Any) -> None:
            started.append(argv)

        def poll(self) -> int:
            return 0

        def wait(self, timeout: float | None = None) -> int:
            return 0

    from advisor.tuning import ChildTrainer, TrialSpec
    from profilers.rundir import TrainDir

    monkeypatch.setattr("advisor.tuning.subprocess.Popen", Child)
    (tmp_path / "trial").mkdir()
    spec = TrialSpec(
        number=0,
        config=TINY,
        steps=4,
        eval_every=2,
        directory=TrainDir(tmp_path / "trial"),
        plan=plan,
        val_data=val,
    )
    ChildTrainer()(spec, lambda point: False)
    assert started[0][started[0].index("--val-data") + 1] == val


def test_the_api_takes_val_data(files: dict[str, Path], tmp_path: Path) -> None:
    import advisor

    summary = advisor.train(
        TINY.replace(data=str(files["dir"])),
        steps=2,
        eval_every=0,
        eval_batches=1,
        val_data=files["const_dir"],  # a pathlib.Path
        warmup_steps=1,
        out=tmp_path / "run",
    )
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["options"]["val_data"] == str(files["const_dir"]) and summary.eval_loss
    with pytest.raises(UsageProblem, match=r"^val_data stdlib is not a validation file: pass "):
        advisor.train(TINY, steps=1, val_data="stdlib", out=tmp_path / "other")
    with pytest.raises(UsageProblem, match=r"^val_data must be a path"):
        advisor.train(TINY, steps=1, val_data=3, out=tmp_path / "other")  # type: ignore[arg-type]


def test_the_report_names_the_val_data_and_its_commands_pass_it(
    files: dict[str, Path], tmp_path: Path
) -> None:
    from reports import write_report

    out = tmp_path / "run"
    train(files["text"], out, val=files["val_text"], steps=2)
    page = write_report(out).read_text()
    assert "validation data</dt><dd>val.txt (500 tokens)<span" in page
    assert f"--eval-batches 2 --val-data {files['val_text']} --out {out}" in page


def test_advisor_run_records_it_and_a_resume_without_it_keeps_it(tmp_path: Path) -> None:
    from advisor.run import RunRequest, _RunLog, _with_recorded_val_data

    request = RunRequest(data="train.txt", val_data="val.txt")
    assert request.command(tmp_path)[-4:] == ["--val-data", "val.txt", "--out", str(tmp_path)]
    _RunLog(tmp_path, request).record(_stage())
    resumed = _with_recorded_val_data(tmp_path, RunRequest(data="train.txt", resume=True))
    assert resumed.val_data == "val.txt"
    other = RunRequest(data="train.txt", resume=True, val_data="other.txt")
    assert _with_recorded_val_data(tmp_path, other).val_data == "other.txt"
    # Without it, run.json is as it was: no val_data key.
    _RunLog(tmp_path, RunRequest()).record(_stage())
    assert "val_data" not in json.loads((tmp_path / "run.json").read_text())["request"]


def _stage() -> Any:
    from advisor.run import StageResult

    return StageResult(name="profile", status="running")
