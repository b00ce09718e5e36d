"""The Python API (``import advisor``): its public surface, model specs from callables, typed
records back, and the CLI's own one-line errors as exceptions."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import advisor
import advisor.api
from advisor.cli import main
from advisor.errors import UsageProblem
from profilers.rundir import RunDir, TrainDir
from strategies.config import ConfigError, TrainConfig
from strategies.plan_records import Plan
from tests.data.user_model import TinyLM, tiny_lm
from tests.reports.runs import write_training
from tests.strategies.profiles import hand_profile

ROOT = Path(__file__).resolve().parents[2]
# The smallest real training run: one gpt-tiny block on random tokens, two sequences a step.
TINY = TrainConfig(
    model="gpt-tiny",
    model_args={"n_layer": 1},
    data="synthetic",
    seq_len=32,
    global_batch_size=2,
    micro_batch_size=2,
)


def python(code: str) -> str:
    """Run ``code`` in a fresh interpreter from the repository root; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    return done.stdout


# -- the public surface -------------------------------------------------------------------------


def test_import_advisor_loads_no_torch() -> None:
    """``advisor --help`` relies on it; so does a notebook's first cell."""
    out = python("import sys, advisor; print('torch' in sys.modules, advisor.__version__)")
    assert out == f"False {advisor.__version__}\n"


def test_every_public_name_resolves_without_torch() -> None:
    out = python(
        "import sys, advisor\n"
        "missing = [n for n in advisor.__all__ if getattr(advisor, n, None) is None]\n"
        "print(missing, 'torch' in sys.modules)"
    )
    assert out == "[] False\n"


def test_the_public_surface() -> None:
    assert sorted(advisor.__all__) == sorted({"__version__", *advisor._OWNERS})
    assert set(advisor.__all__) <= set(dir(advisor))
    assert advisor.Plan is Plan and advisor.TrainConfig is TrainConfig
    assert advisor.ConfigError is ConfigError and advisor.UsageProblem is UsageProblem
    with pytest.raises(AttributeError, match="module 'advisor' has no attribute 'nope'"):
        advisor.nope  # noqa: B018


def test_the_api_names_stay_functions_after_the_library_modules_are_imported() -> None:
    """No library module shares an API function's name (``advisor/recommending.py`` is the
    library behind ``advisor.recommend``): importing them all leaves the functions in place."""
    out = python(
        "import advisor, advisor.api\n"
        "import advisor.recommending, advisor.profiling, advisor.training, advisor.exporters\n"
        "print(all(getattr(advisor, n) is getattr(advisor.api, n)"
        " for n in ('profile', 'recommend', 'predict', 'train', 'export')))"
    )
    assert out == "True\n"


# -- model specs from callables -----------------------------------------------------------------


def test_a_top_level_function_or_module_class_becomes_its_import_path() -> None:
    assert advisor.model_spec(tiny_lm) == "tests.data.user_model:tiny_lm"
    assert advisor.model_spec(TinyLM) == "tests.data.user_model:TinyLM"
    assert advisor.model_spec("gpt-tiny") == "gpt-tiny"


def test_a_new_process_builds_the_model_from_that_spec() -> None:
    """What each probe's child process and each torchrun rank does with the spec."""
    spec = advisor.model_spec(TinyLM)
    out = python(
        "from advisor.models import build_model\n"
        f"adapter = build_model({spec!r}, {{'vocab_size': 32, 'dim': 8, 'n_layers': 3}})\n"
        "print(type(adapter.module).__name__, adapter.vocab_size, adapter.blocks_path)"
    )
    assert out == "TinyLM 32 layers\n"


def _nested() -> Any:
    def factory() -> None:
        return None

    return factory


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            lambda: None,
            "is a lambda or a nested function or class, which the probes' child processes "
            "cannot import: define it at module top level in an importable file",
        ),
        (
            _nested(),
            "is a lambda or a nested function or class, which the probes' child processes "
            "cannot import: define it at module top level in an importable file",
        ),
        (
            functools.partial(tiny_lm, dim=8),
            "has no importable name (a functools.partial or a callable object): pass a "
            "function or nn.Module subclass defined at module top level, and its arguments as "
            "model_args",
        ),
        (3, "model must be a spec string (gpt-tiny, hf:NAME, FILE.py:factory, "),
        (
            TinyLM(64, 8, 1),
            "model is a built TinyLM instance, but the probes build their own copies in child "
            "processes: pass its class (model=MyModel, model_args={...}) or a factory function",
        ),
    ],
    ids=["lambda", "nested", "partial", "not-callable", "module-instance"],
)
def test_a_callable_a_child_cannot_import_is_refused(model: Any, message: str) -> None:
    with pytest.raises(UsageProblem) as caught:
        advisor.model_spec(model)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_factory_defined_in_main_is_refused() -> None:
    def factory() -> None:
        return None

    factory.__module__, factory.__qualname__ = "__main__", "factory"
    with pytest.raises(UsageProblem, match=r"^model factory is defined in __main__ .*: define it"):
        advisor.model_spec(factory)


def test_a_module_only_this_process_can_import_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On sys.path here (a notebook's sys.path.append), not for a new ``python`` from the cwd:
    torchrun's ranks and the launcher could not import it."""
    (tmp_path / "api_private_models.py").write_text("def factory():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import api_private_models

    with pytest.raises(UsageProblem) as caught:
        advisor.model_spec(api_private_models.factory)
    assert str(caught.value) == (
        f"module api_private_models ({tmp_path / 'api_private_models.py'}) is importable here "
        "but not by the new processes that probe and train the model: run from its directory "
        "or add that directory to PYTHONPATH"
    )
    monkeypatch.chdir(tmp_path)  # run from its directory: now a new process finds it too
    assert advisor.model_spec(api_private_models.factory) == "api_private_models:factory"


# -- errors: the CLI's own lines ----------------------------------------------------------------


def cli_error(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    return result.stderr.removeprefix("error: ").rstrip("\n")


@pytest.mark.parametrize(
    ("kwargs", "flags"),
    [
        ({"model": "gpt-nano"}, ["--model", "gpt-nano"]),
        ({"data": "missing.txt"}, ["--data", "missing.txt"]),
        ({"seq_len": 100_000}, ["--seq-len", "100000"]),
        ({"model_args": {"n_layers": 2}}, ["--model-arg", "n_layers=2"]),
    ],
    ids=["unknown-model", "missing-data", "seq-len-above-max", "unknown-model-arg"],
)
def test_profile_raises_the_cli_message(
    kwargs: dict[str, Any], flags: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "p"
    with pytest.raises(UsageProblem) as caught:
        advisor.profile(**kwargs, comm=False, out=out)
    # The same message, naming the keyword argument where the CLI's names its flag.
    cli = cli_error("profile", *flags, "--no-comm", "--out", str(out))
    if cli.startswith("--"):
        for flag, keyword in (
            ("--model-arg n_layers", "model_args key n_layers"),
            ("--seq-len 100000", "seq_len=100000"),
            ("--seq-len", "seq_len"),
            ("--model-arg", "model_args"),
        ):
            cli = cli.replace(flag, keyword)
    assert str(caught.value) == cli
    assert not (out / "profile.json").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precisions": "fp64"}, "precision='fp64' is unknown: use one of fp32, bf16, fp16"),
        ({"precisions": ["fp32", "int8"]}, "precision='int8' is unknown: use one of fp32, "),
        ({"device": "mps"}, "device='mps' is unknown: use one of auto, cpu, cuda"),
        ({"trace_for": "gpu"}, "trace_for='gpu' is unknown: use one of cpu, cuda"),
        ({"seq_len": 0}, "seq_len must be a positive integer, got 0"),
        ({"model_args": ["n_layer=2"]}, "model_args must be a mapping of config fields, e.g. "),
    ],
)
def test_profile_checks_its_keywords(kwargs: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(UsageProblem) as caught:
        advisor.profile(**kwargs, out=tmp_path)
    assert str(caught.value).startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_recommend_and_train_raise_the_cli_messages(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(UsageProblem) as caught:
        advisor.recommend(missing, global_batch_size=8)
    assert str(caught.value) == cli_error(
        "recommend", "--profile", str(missing), "--global-batch-size", "8"
    )
    plan = tmp_path / "plan.json"
    with pytest.raises(ConfigError) as config_error:
        advisor.train(plan, steps=1, out=tmp_path / "t")
    assert str(config_error.value) == cli_error(
        "train", "--plan", str(plan), "--steps", "1", "--out", str(tmp_path / "t")
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps must be a positive integer, got 0"),
        ({"eval_every": -1}, "eval_every must be an integer >= 0, got -1"),
        ({"device": "tpu"}, "device='tpu' is unknown: use one of auto, cpu, cuda"),
        ({"resume": True}, "resume=True needs out= naming the run to continue"),
        ({"micro_batch": 4}, "unknown TrainConfig key(s) micro_batch: use model, model_args, "),
    ],
)
def test_train_checks_its_keywords(kwargs: dict[str, Any], message: str) -> None:
    """What click's types check for the CLI's flags, checked for the keywords."""
    with pytest.raises(UsageProblem) as caught:
        advisor.train(TINY, **kwargs)
    assert str(caught.value).startswith(message)


# -- records back -------------------------------------------------------------------------------


def test_recommend_a_profile_object_saves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan = advisor.recommend(hand_profile(), global_batch_size=8, validate_top=0)
    assert isinstance(plan, Plan)
    config = plan.config
    assert config.global_batch_size == 8
    assert config.micro_batch_size * config.grad_accum_steps * config.world_size == 8
    assert plan.measured is None and plan.predicted.tokens_per_s > 0
    assert list(tmp_path.iterdir()) == []


def test_recommend_a_profile_path_writes_beside_it_and_resumes(tmp_path: Path) -> None:
    hand_profile().save(tmp_path)
    messages: list[str] = []
    plan = advisor.recommend(
        tmp_path, global_batch_size=8, validate_top=0, progress=messages.append
    )
    run = RunDir(tmp_path)
    assert run.plan.is_file() and run.trials.is_file() and run.study.is_file()
    assert advisor.load_plan(tmp_path).to_dict() == plan.to_dict()
    assert any(m.startswith("search: ") for m in messages)
    again = advisor.recommend(tmp_path / "profile.json", global_batch_size=8, validate_top=0)
    assert again.config == plan.config
    assert again.search["trials_before"] == plan.search["num_evaluated"]


def test_progress_means_one_thing_in_every_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """profile(progress=False) raised a bare TypeError from its budget clock after it had
    started; progress was a callable in profile/recommend, a bool in train, an object in tune.
    Now each takes True (lines on stderr), False/None (silent) or its callback; anything else
    is a UsageProblem before work starts."""
    advisor.recommend(hand_profile(), global_batch_size=8, validate_top=0, progress=True)
    assert "search: " in capsys.readouterr().err
    advisor.recommend(hand_profile(), global_batch_size=8, validate_top=0, progress=False)
    assert capsys.readouterr().err == ""
    calls: list[tuple[Any, dict[str, Any]]] = [
        (advisor.profile, {"out": tmp_path / "p"}),
        (advisor.recommend, {"profile": hand_profile(), "global_batch_size": 8}),
        (advisor.train, {"plan": TINY, "out": tmp_path / "t"}),
        (advisor.tune, {"plan": tmp_path / "plan.json"}),
    ]
    for function, args in calls:
        with pytest.raises(UsageProblem) as caught:
            function(**args, progress="yes")
        assert str(caught.value).startswith(f"{function.__name__}(progress='yes'): pass True ")
    assert not (tmp_path / "p").exists() and not (tmp_path / "t").exists()
    with pytest.raises(UsageProblem, match=r"or a callable\(message\) or an advisor.tuning.TuneP"):
        advisor.tune(tmp_path / "plan.json", progress=object())  # type: ignore[arg-type]


def test_recommend_carries_the_hyperparameters(tmp_path: Path) -> None:
    plan = advisor.recommend(
        hand_profile(), global_batch_size=8, validate_top=0, hyperparameters={"lr": 3e-4}
    )
    assert plan.config.lr == 3e-4


def test_predict_prices_a_plan_as_recommend_did_and_a_config_as_the_cli_does(
    tmp_path: Path,
) -> None:
    profile = hand_profile()
    plan = advisor.recommend(profile, global_batch_size=8, validate_top=0)
    assert advisor.predict(profile, plan).to_dict() == plan.predicted.to_dict()
    profile.save(tmp_path)
    flags: dict[str, Any] = {"micro_batch_size": 2, "grad_accum_steps": 4, "precision": "bf16"}
    cost = advisor.predict(tmp_path, **flags)
    result = CliRunner().invoke(
        main,
        [
            *("predict", "--profile", str(tmp_path), "--micro-batch-size", "2"),
            *("--grad-accum-steps", "4", "--precision", "bf16"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["predicted"] == json.loads(json.dumps(cost.to_dict()))
    assert cost.step_time_interval_s is not None and cost.fits is True
    bigger = advisor.predict(profile, plan, micro_batch_size=8, grad_accum_steps=1)
    assert (
        bigger.peak_memory_bytes
        > advisor.predict(profile, plan, micro_batch_size=1, grad_accum_steps=8).peak_memory_bytes
    )


def test_predict_estimates_a_target_and_refuses_what_it_cannot_price() -> None:
    profile = hand_profile()
    estimate = advisor.predict(profile, target="h100-80gb", micro_batch_size=8)
    assert estimate.estimate is True
    with pytest.raises(UsageProblem, match=r"unknown TrainConfig key\(s\) micro_batch: use"):
        advisor.predict(profile, micro_batch=8)
    with pytest.raises(UsageProblem, match=r"^model, seq_len: the profile's, not a knob"):
        advisor.predict(profile, model="gpt-small", seq_len=64)
    with pytest.raises(advisor.StrategyError, match="unknown target device 'h900'"):
        advisor.predict(profile, target="h900")


def test_load_plan_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UsageProblem, match=r"^no plan at .*: pass a run directory holding"):
        advisor.load_plan(tmp_path)
    (tmp_path / "plan.json").write_text("{")
    with pytest.raises(UsageProblem, match=r"is not readable JSON .*: regenerate it with"):
        advisor.load_plan(tmp_path / "plan.json")


def test_train_returns_a_summary_of_its_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = advisor.train(TINY, steps=2, out=out, eval_every=0, lr=2e-3)
    assert isinstance(result, advisor.TrainSummary)
    assert result.out == out and result.steps == 2 and result.config.lr == 2e-3
    assert result.tokens == 2 * TINY.tokens_per_step
    records = result.metrics().train
    assert [r.step for r in records] == [1, 2]
    assert result.final_loss == records[-1].loss and math.isfinite(result.final_loss)
    assert result.eval_loss is not None
    assert result.checkpoint is not None and result.checkpoint.is_dir()
    saved = json.loads(TrainDir(out).train_config.read_text())
    assert saved["config"] == result.config.to_dict()
    # Resumed with nothing left to do: said so, from the saved config.
    again = advisor.train(out=out, resume=True, steps=2)
    assert again.already_complete and again.steps == 2 and again.config == result.config


def test_train_progress_callback_gets_the_step_lines(tmp_path: Path) -> None:
    """advisor.train(progress=callback) gave the callback nothing (the audit of 2026-12-07: 0
    messages over 12 steps), though the docstring promises the per-step lines."""
    lines: list[str] = []
    advisor.train(TINY, steps=4, out=tmp_path / "run", eval_every=0, progress=lines.append)
    steps = [line for line in lines if line.startswith("step ")]
    assert steps and steps[-1].startswith("step 4/4  loss "), lines


def test_train_progress_callback_follows_launched_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ddp plan's ranks print to their own stderr: the callback gets rank 0's steps from
    metrics.jsonl as they are written."""
    config = TINY.replace(parallelism="ddp", world_size=2, micro_batch_size=1)
    out = tmp_path / "run"

    def fake_launch(spec: Any, args: list[str]) -> None:
        write_training(out, config, 3, 3)

    monkeypatch.setattr("advisor.launch.launch", fake_launch)
    lines: list[str] = []
    advisor.train(config, steps=3, out=out, progress=lines.append)
    assert [line.split("  ")[0] for line in lines if line.startswith("step ")] == [
        "step 1",
        "step 2",
        "step 3",
    ], lines


def test_train_a_model_class_with_its_arguments(tmp_path: Path) -> None:
    result = advisor.train(
        TINY,
        steps=1,
        out=tmp_path / "run",
        model=TinyLM,
        model_args={"vocab_size": 256, "dim": 8, "n_layers": 1},
    )
    assert result.config.model == "tests.data.user_model:TinyLM"
    assert result.config.model_args == {"vocab_size": 256, "dim": 8, "n_layers": 1}
    assert math.isfinite(result.final_loss)


def test_train_runs_a_ddp_plan_through_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ddp plan goes to the launcher, with the config as its plan; the summary is read from
    the files rank 0 wrote (here written by a stand-in launcher)."""
    config = TINY.replace(parallelism="ddp", world_size=2, micro_batch_size=1)
    out = tmp_path / "run"
    launched: list[Any] = []

    def fake_launch(spec: Any, args: list[str]) -> None:
        launched.append((spec, args))
        write_training(out, config, 3, 3)

    monkeypatch.setattr("advisor.launch.launch", fake_launch)
    result = advisor.train(config, steps=3, out=out)
    ((spec, args),) = launched
    assert spec.world_size == 2 and spec.nnodes == 1
    assert args[:4] == ["train", "--plan", str(TrainDir(out).launch_config), "--out"]
    assert json.loads(TrainDir(out).launch_config.read_text())["config"] == config.to_dict()
    last = result.metrics().train[-1]
    assert (result.steps, result.tokens, result.final_loss) == (3, last.tokens, last.loss)
    assert result.checkpoint == TrainDir(out).checkpoint_dirs()[-1]


# -- export (advisor.exporters) ----------------------------------------------------------------


@pytest.fixture
def saved_plan(tmp_path: Path) -> Plan:
    hand_profile().save(tmp_path / "run")
    return advisor.recommend(tmp_path / "run", global_batch_size=8, validate_top=0)


def test_export_returns_the_stacks_settings(tmp_path: Path, saved_plan: Plan) -> None:
    result = advisor.export(saved_plan, "deepspeed", steps=50)
    assert isinstance(result, advisor.Export) and result.format == "deepspeed"
    assert result.settings["train_batch_size"] == saved_plan.config.global_batch_size == 8
    assert json.loads(result.text)["train_batch_size"] == 8
    # From the run directory: the same settings (the header names the file).
    from_file = advisor.export(tmp_path / "run", "deepspeed", steps=50)
    assert from_file.settings == result.settings
    assert str(tmp_path / "run" / "plan.json") in from_file.text


def test_export_writes_the_file_and_its_sidecar(tmp_path: Path, saved_plan: Plan) -> None:
    target = tmp_path / "out" / "args.json"
    result = advisor.export(saved_plan, "hf", out=target)
    assert target.read_text() == result.text
    assert json.loads(target.read_text()) == result.settings
    note = target.with_name("args.json.advisor.txt")
    assert result.sidecar and note.read_text() == result.sidecar
    # A directory: the export's own file name inside it.
    advisor.export(saved_plan, "torchtitan", out=tmp_path / "out")
    assert (tmp_path / "out" / advisor.export(saved_plan, "torchtitan").filename).is_file()


def test_export_raises_the_cli_message(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(UsageProblem) as caught:
        advisor.export(missing, "hf")
    assert str(caught.value) == cli_error("export", str(missing), "--to", "hf")
    with pytest.raises(UsageProblem, match=r"^unknown export format 'keras': use one of hf, "):
        advisor.export(missing, "keras")


def test_export_out_ending_in_a_slash_is_a_new_directory(tmp_path: Path, saved_plan: Plan) -> None:
    """As the CLI's --out DIR/: a trailing slash names a directory, made if missing."""
    result = advisor.export(saved_plan, "deepspeed", out=f"{tmp_path / 'newdir'}/")
    assert (tmp_path / "newdir").is_dir()
    assert (tmp_path / "newdir" / result.filename).read_text() == result.text


def test_export_takes_a_plans_dict_and_refuses_anything_else(saved_plan: Plan) -> None:
    from_dict = advisor.export(saved_plan.to_dict(), "hf")
    assert from_dict.settings == advisor.export(saved_plan, "hf").settings
    with pytest.raises(UsageProblem, match=r"^plan is a mapping but not a plan's to_dict\(\)"):
        advisor.export({"config": {}}, "hf")
    with pytest.raises(UsageProblem, match=r"^plan must be a Plan, a plan's to_dict\(\), or the "):
        advisor.export(42, "hf")  # type: ignore[arg-type]


def test_recommend_steps_is_the_clis_steps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--steps N ranks compiled candidates over N steps; steps= does the same."""
    import advisor.recommending

    seen: list[int] = []

    def fake(source: Any, request: Any, **kwargs: Any) -> None:
        seen.append(request.run_steps)

    monkeypatch.setattr(advisor.recommending, "recommend", fake)
    hand_profile().save(tmp_path)
    advisor.recommend(tmp_path, global_batch_size=8, steps=40)
    advisor.recommend(tmp_path, global_batch_size=8)
    assert seen == [40, 300]
    with pytest.raises(UsageProblem, match=r"^steps must be a positive integer, got 0"):
        advisor.recommend(tmp_path, global_batch_size=8, steps=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 2}, "nodes and network plan for hardware you don't have: they need target "),
        ({"only": {"precisionn": ["bf16"]}}, "only key precisionn: not a knob the search turns"),
        ({"global_batch_size": "8"}, "global_batch_size must be a positive integer, got '8'"),
        ({"global_batch_size": 0}, "global_batch_size must be a positive integer, got 0"),
    ],
)
def test_recommend_errors_name_its_keywords_not_cli_flags(
    kwargs: dict[str, Any], message: str, tmp_path: Path
) -> None:
    hand_profile().save(tmp_path)
    with pytest.raises((UsageProblem, ValueError)) as caught:
        advisor.recommend(tmp_path, **{"global_batch_size": 8, **kwargs})
    assert str(caught.value).startswith(message)
    assert "--" not in str(caught.value).split(":")[0]


# -- what a user passes by mistake: one line naming the fix, before any work ------------------


@pytest.mark.parametrize(
    ("function", "kwargs", "message"),
    [
        ("profile", {"budget_s": "30"}, "budget_s must be a number, got '30'"),
        ("profile", {"comm": "no"}, "comm must be True or False, got 'no'"),
        ("profile", {"out": 7}, "out must be a path (a str or a pathlib.Path), not 7"),
        ("profile", {"out": "FILE"}, "out='FILE': FILE is a file, not a directory: choose "),
        ("profile", {"checkpointing": "fulll"}, "checkpointing fulll: unknown activation_"),
        ("recommend", {"profile": None}, "profile must be a Profile (advisor.profile's or "),
        ("recommend", {"memory_budget": "0.9"}, "memory_budget must be a number, got '0.9'"),
        ("recommend", {"only": "precision=bf16"}, "only must be a mapping, e.g. {'precision': "),
        ("recommend", {"hyperparameters": ["lr"]}, "hyperparameters must be a mapping, e.g. "),
        ("recommend", {"out": "FILE"}, "out='FILE': FILE is a file, not a directory"),
        ("predict", {"profile": {}}, "profile must be a Profile (advisor.profile's or "),
        ("predict", {"plan": 3}, "plan must be a Plan, a TrainConfig, a plan's to_dict(), or "),
        ("train", {"plan": 3}, "plan must be a Plan, a TrainConfig, a plan's to_dict(), or "),
        ("train", {"out": "FILE"}, "out='FILE': FILE is a file, not a directory: choose "),
        ("train", {"model_args": ["n_layer=1"]}, "model_args must be a mapping of config "),
        ("train", {"nnodes": 0}, "nnodes must be a positive integer, got 0"),
        ("train", {"steps": 2, "tokens": 64}, "give steps or tokens, not both"),
        ("tune", {"plan": None}, "plan must be a Plan, a plan's to_dict(), or the path of "),
        ("tune", {"plan": TINY}, "plan must be a Plan, a plan's to_dict(), or the path of "),
        ("load_profile", {"path": None}, "path must be a path (a str or a pathlib.Path), not "),
        ("load_plan", {"path": None}, "path must be a path (a str or a pathlib.Path), not "),
    ],
)
def test_a_wrong_kind_of_argument_is_a_usage_problem(
    function: str, kwargs: dict[str, Any], message: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """Each was a TypeError from pathlib or a comparison deep inside (budget_s='30', out=7,
    profile=None ...), a FileExistsError after the probes had run (out= a file), a bare
    ValueError from dict() (only='precision=bf16'), or silently wrong (checkpointing='full'
    profiled the settings 'f', 'u', 'l', 'l'; comm='no' ran the probe; nnodes=0 trained)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("")
    defaults: dict[str, dict[str, Any]] = {
        "profile": {"model": "gpt-tiny", "comm": False, "out": tmp_path / "p"},
        "recommend": {"profile": hand_profile(), "global_batch_size": 8, "validate_top": 0},
        "predict": {"profile": hand_profile()},
        "train": {"plan": TINY, "steps": 1, "out": tmp_path / "t"},
        "tune": {"out": tmp_path / "u"},
        "load_profile": {},
        "load_plan": {},
    }
    call = functools.partial(getattr(advisor, function), **{**defaults[function], **kwargs})
    with pytest.raises(UsageProblem) as caught:
        call()
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]  # nothing started


@pytest.mark.parametrize(
    ("function", "kwargs", "form"),
    [
        ("profile", {"model": "gpt-tiny", "comm": False}, "(message, fraction_of_budget)"),
        ("recommend", {"profile": hand_profile(), "global_batch_size": 8}, "(message)"),
        ("train", {"plan": TINY, "steps": 1}, "(message)"),
    ],
)
def test_a_progress_callback_of_the_wrong_shape_is_refused_before_any_work(
    function: str, kwargs: dict[str, Any], form: str, tmp_path: Path
) -> None:
    """profile(progress=lambda m: ...) raised a TypeError from its budget clock after the
    probes had started; train(progress=lambda: ...) one from the metrics writer, its run
    directory made."""
    for wrong in (lambda: None, lambda a, b, c: None):
        with pytest.raises(UsageProblem) as caught:
            getattr(advisor, function)(**kwargs, out=tmp_path / "o", progress=wrong)
        assert str(caught.value) == (
            f"{function}(progress={wrong.__qualname__}): it is called as progress{form}, which "
            "its signature does not accept: give it those parameters"
        )
    assert list(tmp_path.iterdir()) == []
    # What the documented forms take: print, list.append, a function with defaults.
    assert advisor.api._progress(function, print, form=form) is print
    assert advisor.api._progress("train", [].append) is not None
    assert advisor.api._progress("profile", lambda m, f=0.0, *rest: None, form=form)


def test_predict_and_train_take_a_run_directory_or_a_plans_dict(
    tmp_path: Path, saved_plan: Plan
) -> None:
    """A run directory (as load_plan, export and tune take) was 'plan file RUN does not
    exist' (it does: it is a directory); a plan's to_dict() a TypeError from pathlib."""
    run = tmp_path / "run"
    profile = advisor.load_profile(run)
    priced = advisor.predict(profile, saved_plan)
    assert advisor.predict(run, run) == priced
    assert advisor.predict(str(run), str(run / "plan.json")) == priced
    assert advisor.predict(profile, saved_plan.to_dict()) == priced
    with pytest.raises(ConfigError, match=r"^plan file .*nowhere.json does not exist: pass"):
        advisor.predict(profile, run / "nowhere.json")


def test_train_takes_a_run_directory(tmp_path: Path) -> None:
    searched = advisor.recommend(hand_profile(), global_batch_size=8, validate_top=0)
    plan = Plan.from_dict({**searched.to_dict(), "config": TINY.to_dict()})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "plan.json").write_text(json.dumps(plan.to_dict()))
    result = advisor.train(tmp_path / "run", steps=2, out=tmp_path / "t", warmup_steps=1)
    assert result.config == TINY.replace(warmup_steps=1)
    again = advisor.train(plan.to_dict(), steps=2, out=tmp_path / "t2", warmup_steps=1)
    assert again.final_loss == result.final_loss


def test_tune_progress_callback_gets_the_clis_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """progress=print was refused by tune alone (it wanted a TuneProgress object): the callback
    now gets the lines tune(progress=True) prints."""
    import advisor.tuning

    seen: list[Any] = []

    def fake_tune(source: Path, request: Any, *, out: Any, progress: Any) -> None:
        seen.append(progress)
        progress.message("study s: 1 trials")
        progress.trial_started(0, {"lr": 1e-3}, 10)

    monkeypatch.setattr(advisor.tuning, "tune", fake_tune)
    lines: list[str] = []
    advisor.tune(tmp_path / "plan.json", progress=lines.append)
    assert lines == ["study s: 1 trials", "trial 0: lr=0.001"]
    silent = advisor.tuning.SilentProgress()
    advisor.tune(tmp_path / "plan.json", progress=silent)
    assert seen[-1] is silent


def test_predict_refuses_a_plan_of_another_model() -> None:
    """The docstring says a plan's model must be the profile's: a plan of another model was
    priced as the profile's model, without a word."""
    profile = hand_profile()
    plan = advisor.recommend(profile, global_batch_size=8, validate_top=0)
    other = plan.config.replace(model="gpt-small", model_args={})
    with pytest.raises(UsageProblem, match=r"^the plan trains gpt-small but the profile measured"):
        advisor.predict(profile, other)


def test_a_runs_notes_reach_the_caller_not_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The library never prints: a run's notes (here, a warm-up as long as the run) were
    printed on stderr whatever progress said. A silent call raises them as AdvisorNote
    warnings, a callback gets them as 'note: ...' lines, both in keyword terms."""
    from advisor.errors import AdvisorNote

    with pytest.warns(AdvisorNote, match=r"^warmup_steps=20 is not below the run's length \(2\)"):
        advisor.train(TINY, steps=2, out=tmp_path / "silent", eval_every=0, warmup_steps=20)
    assert capfd.readouterr().err == ""
    lines: list[str] = []
    advisor.train(
        TINY, steps=2, out=tmp_path / "told", eval_every=0, warmup_steps=20, progress=lines.append
    )
    assert [line for line in lines if line.startswith("note: ")] == [
        next(line for line in lines if line.startswith("note: warmup_steps=20 is not below"))
    ]
    assert capfd.readouterr().err == ""
