"""The Python API: ``advisor.profile``, ``advisor.recommend``, ``advisor.predict``,
``advisor.train``, ``advisor.export`` — the very library functions the CLI calls, with keyword
options named like its flags (``--global-batch-size`` → ``global_batch_size=``).

    profile = advisor.profile(model="gpt-tiny", seq_len=128, out="runs/p")   → Profile
    plan = advisor.recommend(profile, global_batch_size=8)                   → Plan
    cost = advisor.predict(profile, plan, micro_batch_size=4)                → Prediction
    advisor.export(plan, "hf")                                               → Export
    tuned = advisor.tune(plan, trials=12, out="runs/p")                      → TuneResult
    result = advisor.train(plan, steps=50, out="runs/x")                     → TrainSummary
    advisor.load_profile("runs/p"), advisor.load_plan("runs/p")              → Profile, Plan

Records are the frozen dataclasses the CLI writes to disk (profile.json, plan.json); errors
are the exceptions the CLI prints as one line (:class:`advisor.errors.UsageProblem`,
``strategies.config.ConfigError``, ``strategies.errors.StrategyError`` ...). The library
never prints: progress goes to the callbacks given. Each call leaves the caller's process as
it found it (its environment variables, signal handlers, working directory).

A model is a spec string (``gpt-tiny``, ``hf:NAME``, ``FILE.py:factory``,
``package.module:factory``) or a factory function / ``nn.Module`` subclass. Probes build the
model in child processes from a picklable spec string, so a callable is passed on by its
importable name (``module:qualname``, see :func:`model_spec`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.errors import UsageProblem
from advisor.trainer.options import DEFAULT_EVAL_BATCHES, DEFAULT_KEEP_CHECKPOINTS
from advisor.training import TrainSummary
from profilers.defaults import DEFAULT_MEMORY_BUDGET, DEFAULT_PROFILE_BUDGET_S
from profilers.workload import PRECISIONS
from strategies.budgets import DEFAULT_VALIDATE_ROUNDS, DEFAULT_VALIDATE_TOP_K
from strategies.config import DEFAULT_DATA, DEFAULT_MODEL, DEFAULT_SEQ_LEN, TrainConfig
from strategies.tuning import DEFAULT_TUNE_TRIALS

if TYPE_CHECKING:
    from advisor.exporters import Export
    from advisor.tuning import TuneProgress, TuneResult
    from profilers.profile_record import Profile
    from strategies.plan_records import Plan
    from strategies.prediction import Prediction

DEVICES = ("auto", "cpu", "cuda")

# What a model may be: a spec string, or a factory (a function returning an nn.Module, or an
# nn.Module subclass) defined at module top level.
ModelLike = str | Callable[..., Any]


# -- model specs ------------------------------------------------------------------------------


def model_spec(model: ModelLike) -> str:
    """The spec string of ``model``: a string as given; a factory function or ``nn.Module``
    subclass as ``module:qualname``, which a new process imports (probes run in child
    processes, ddp/fsdp through torchrun). A lambda, a nested function or class, a callable
    object or one defined in ``__main__`` (a script, a notebook) has no such name: that is a
    :class:`UsageProblem` naming the fix (define it at module top level in an importable file).
    """
    if isinstance(model, str):
        return model
    if not callable(model):
        raise UsageProblem(
            f"model must be a spec string (gpt-tiny, hf:NAME, FILE.py:factory, "
            f"package.module:factory), a factory function or an nn.Module subclass, not "
            f"{type(model).__name__}"
        )
    if any(
        c.__name__ == "Module" and c.__module__.startswith("torch.nn") for c in type(model).__mro__
    ):
        raise UsageProblem(
            f"model is a built {type(model).__name__} instance, but the probes build their own "
            "copies in child processes: pass its class (model=MyModel, model_args={...}) or a "
            "factory function"
        )
    module = getattr(model, "__module__", None)
    qualname = getattr(model, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise UsageProblem(
            f"model {model!r} has no importable name (a functools.partial or a callable "
            "object): pass a function or nn.Module subclass defined at module top level, and "
            "its arguments as model_args"
        )
    shown = f"{module}.{qualname}"
    if "." in qualname or "<" in qualname:
        raise UsageProblem(
            f"model {shown} is a lambda or a nested function or class, which the probes' child "
            "processes cannot import: define it at module top level in an importable file"
        )
    if module == "__main__":
        raise UsageProblem(
            f"model {qualname} is defined in __main__ (a script or a notebook), which the "
            "probes' child processes cannot import: define it at module top level in an "
            "importable file (e.g. my_models.py beside it) and import it from there"
        )
    try:
        found = getattr(importlib.import_module(module), qualname, None)
    except ImportError:
        found = None
    if found is not model:
        raise UsageProblem(
            f"{module}:{qualname} does not import back as this model (redefined or replaced "
            "since): define it once at module top level in an importable file"
        )
    top = module.partition(".")[0]
    _check_importable_by_new_processes(top, os.getcwd(), os.environ.get("PYTHONPATH", ""))
    return f"{module}:{qualname}"


_FIND_SPEC = (
    "import importlib.util, json, sys\n"
    "s = importlib.util.find_spec(sys.argv[1])\n"
    "print(json.dumps(None if s is None else [s.origin, list(s.submodule_search_locations or [])]))"
)


def _where(origin: str | None, locations: Sequence[str]) -> list[Any]:
    """Where a module was found, as real paths (sys.path entries may be relative)."""

    def real(path: str | None) -> str | None:
        return os.path.realpath(path) if path and path not in ("built-in", "frozen") else path

    return [real(origin), sorted(os.path.realpath(p) for p in locations)]


@functools.lru_cache(maxsize=64)
def _check_importable_by_new_processes(top: str, cwd: str, pythonpath: str) -> None:
    """A new ``python`` started here (what torchrun and the launcher start) finds module
    ``top`` where this process found it. Asked of a real new interpreter: sys.path differs
    between them (a notebook's or a test's own additions are not inherited). Cached per
    (module, cwd, PYTHONPATH); a failure is asked again."""
    spec = importlib.util.find_spec(top)
    here = None if spec is None else _where(spec.origin, spec.submodule_search_locations or [])
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FIND_SPEC, top],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd,
            check=False,
        )
        found = json.loads(done.stdout) if done.returncode == 0 else None
        there = None if found is None else _where(found[0], found[1])
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError, TypeError):
        there = None
    if there != here:
        location = here[0] if here and here[0] else top
        raise UsageProblem(
            f"module {top} ({location}) is importable here but not by the new processes that "
            f"probe and train the model: run from its directory or add that directory to "
            "PYTHONPATH"
        )


def _model_and_args(
    model: ModelLike, model_args: Mapping[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    if model_args is not None and not isinstance(model_args, Mapping):
        raise UsageProblem(
            f"model_args must be a mapping of config fields, e.g. {{'n_layer': 2}}, not "
            f"{type(model_args).__name__}"
        )
    return model_spec(model), dict(model_args or {})


# -- small checks of keyword values (the CLI's click types do these for its flags) ------------


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise UsageProblem(f"{name}={value!r} is unknown: use one of {', '.join(choices)}")


def _check_int(name: str, value: int | None, minimum: int) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise UsageProblem(f"{name} must be {kind}, got {value!r}")


def _check_number(name: str, value: float | None) -> None:
    """A number of the kind a float flag takes (its range is the layer below's to check)."""
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise UsageProblem(f"{name} must be a number, got {value!r}")


def _check_bool(name: str, value: bool) -> None:
    if not isinstance(value, bool):
        raise UsageProblem(f"{name} must be True or False, got {value!r}")


def _check_mapping(name: str, value: Any, example: str) -> dict[str, Any]:
    """A mapping keyword (``only=``, ``hyperparameters=``) as a dict; a string or a list of
    pairs is a UsageProblem showing the mapping it means."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageProblem(f"{name} must be a mapping, e.g. {example}, not {type(value).__name__}")
    return dict(value)


def _say_on_stderr(message: str, *_: Any) -> None:
    print(message, file=sys.stderr, flush=True)


def _takes(callback: Callable[..., Any], arguments: int) -> bool:
    """Whether ``callback`` can be called with ``arguments`` positional arguments (a builtin
    without a signature is given the benefit of the doubt)."""
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*(["line"] * arguments))
    except TypeError:
        return False
    return True


_TUNE_PROGRESS = ("message", "trial_started", "trial_evaluated", "trial_finished")


def _progress(name: str, progress: Any, *, form: str = "(message)", or_else: str = "") -> Any:
    """``progress`` as one rule for every function: None or False, silent; True, lines on
    stderr; else the callback the function documents, called as ``progress FORM`` (or, for
    tune, ``or_else``, a TuneProgress): one whose signature does not take that call is a
    UsageProblem before any work (it was a TypeError from deep inside, after the run had
    started)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return _say_on_stderr
    if name == "tune" and all(callable(getattr(progress, m, None)) for m in _TUNE_PROGRESS):
        return progress
    if callable(progress):
        if _takes(progress, form.count(",") + 1):
            return progress
        raise UsageProblem(
            f"{name}(progress={_shown(progress)}): it is called as progress{form}, which its "
            "signature does not accept: give it those parameters"
        )
    raise UsageProblem(
        f"{name}(progress={progress!r}): pass True (lines on stderr), False or None (silent), "
        f"or a callable{form}{or_else}"
    )


def _notes_for(progress: Any) -> Callable[[str], None] | None:
    """Where a run's notes go: a callback gets ``note: ...`` lines, ``progress=True`` prints
    them on stderr as the CLI does, and a silent call raises them as :class:`AdvisorNote`
    warnings (they were printed on stderr whatever ``progress`` said)."""
    if callable(progress):
        return lambda text: progress(f"note: {_api_terms(text)}")
    if progress is True:
        return None
    return _warn_note


def _warn_note(text: str) -> None:
    import warnings

    from advisor.errors import AdvisorNote

    warnings.warn(_api_terms(text), AdvisorNote, stacklevel=2)


def _api_terms(text: str) -> str:
    """A message's CLI flags as this API's keywords (``--warmup-steps 20`` → ``warmup_steps=20``,
    ``--only X`` → ``only key X``); other flags as they are."""
    return _FLAG.sub(_keyword, text)


def _shown(value: Any) -> str:
    """A callable as its name (a lambda's repr carries an address)."""
    name = getattr(value, "__qualname__", None)
    return name if isinstance(name, str) else repr(value)


def _check_config_keys(config: Mapping[str, Any]) -> None:
    """Keyword arguments meant as TrainConfig keys: a UsageProblem listing the valid ones."""
    unknown = sorted(set(config) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise UsageProblem(
            f"unknown TrainConfig key(s) {', '.join(unknown)}: use "
            + ", ".join(f.name for f in dataclasses.fields(TrainConfig))
        )


def _path(value: str | os.PathLike[str] | None, name: str = "out") -> Path | None:
    if value is None:
        return None
    return _given_path(value, name)


def _given_path(value: Any, name: str) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise UsageProblem(f"{name} must be a path (a str or a pathlib.Path), not {value!r}")
    return Path(value)


def _val_data(value: str | os.PathLike[str] | None) -> str | None:
    """``val_data=``: the CLI's --val-data SPEC (a path, or ``"FILE.jsonl:FIELD"``) as given."""
    if value is None:
        return None
    _given_path(value, "val_data")  # a str or an os.PathLike, else refused
    return os.fspath(value)


def _out_dir(value: str | os.PathLike[str] | None) -> Path | None:
    """``out=`` of a function that writes a directory: a file in the way is a UsageProblem
    before any work (it was a FileExistsError, for profile after its probes had run)."""
    directory = _path(value)
    if directory is not None:
        blocked = next((p for p in (directory, *directory.parents) if p.exists()), None)
        if blocked is not None and not blocked.is_dir():
            raise UsageProblem(
                f"out={str(directory)!r}: {blocked} is a file, not a directory: choose another out"
            )
    return directory


@contextlib.contextmanager
def _kept_environment() -> Iterator[None]:
    """The caller's ``os.environ`` as it was when the call returns: the launcher set
    OMP_NUM_THREADS=1 and TORCHELASTIC_SIGNALS_TO_HANDLE in the caller's process for its
    ranks, and a later ``advisor.profile`` in the same notebook probed on one thread."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def _profile_source(profile: Any) -> Profile | Path:
    """A Profile, or the path of a profile.json or of its directory."""
    from profilers.profile_record import Profile

    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, (str, os.PathLike)):
        return Path(profile)
    raise UsageProblem(
        f"profile must be a Profile (advisor.profile's or advisor.load_profile's) or the path "
        f"of a profile.json or of its directory, not {type(profile).__name__}"
    )


def _plan_source(plan: Any, *, configs: bool = True) -> Plan | TrainConfig | Path | None:
    """A plan as the functions take it: a Plan, its ``to_dict()`` (as a Plan), a TrainConfig
    (``configs``), the path of a plan.json, or the run directory holding one (its plan.json,
    as :func:`load_plan` reads it), or None. Anything else is a UsageProblem naming them."""
    from strategies.plan_records import Plan

    if plan is None or isinstance(plan, Plan) or (configs and isinstance(plan, TrainConfig)):
        return plan
    if isinstance(plan, Mapping):
        try:
            return Plan.from_dict(plan)
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageProblem(
                f"plan is a mapping but not a plan's to_dict() ({' '.join(str(exc).split())}): "
                "pass a Plan, its to_dict(), or the path of a plan.json"
            ) from None
    if isinstance(plan, (str, os.PathLike)):
        # A run directory as it is: train decides between its plan.json and a tuned_plan.json
        # (advisor.training._plan_config), predict reads its plan.json (the two price alike).
        return Path(plan)
    raise _not_a_plan(plan, configs=configs)


def _not_a_plan(plan: Any, *, configs: bool) -> UsageProblem:
    kinds = "a Plan, a TrainConfig" if configs else "a Plan"
    return UsageProblem(
        f"plan must be {kinds}, a plan's to_dict(), or the path of a plan.json or of its run "
        f"directory, not {type(plan).__name__}"
    )


# The CLI flags that messages of the layers below name, as this API's keyword arguments.
_KEYWORDS = {
    "--only": "only",
    "--model-arg": "model_args",
    "--nodes": "nodes",
    "--network": "network",
    "--target": "target",
    "--world-size": "world_size",
    "--budget-s": "budget_s",
    "--seq-len": "seq_len",
    "--global-batch-size": "global_batch_size",
    "--memory-budget": "memory_budget",
    "--steps": "steps",
    "--device": "device",
    "--checkpointing": "checkpointing",
    "--params": "params",
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--rdzv-endpoint": "rdzv_endpoint",
    "--val-data": "val_data",
}
_FLAG = re.compile(r"--[a-z][a-z-]*(?: [^\s(]+)?")


def _keyword(match: re.Match[str]) -> str:
    flag, _, value = match.group(0).partition(" ")
    name = _KEYWORDS.get(flag)
    if name is None:
        # A TrainConfig key's flag (--micro-batch-size, --warmup-steps ...): the key.
        key = flag[2:].replace("-", "_")
        if key not in {f.name for f in dataclasses.fields(TrainConfig)}:
            return match.group(0)
        name = key
    if name in ("only", "model_args"):  # a mapping: the message names one of its keys
        return f"{name} key {value}" if value else name
    if name == "device" and value:  # --device cuda: device='cuda', as the keyword is written
        return f"{name}={value!r}"
    if any(ch.isdigit() for ch in value):  # --target h100-80gb, --nodes 2: a value
        return f"{name}={value}"
    return f"{name} {value}" if value else name


@contextlib.contextmanager
def _in_api_terms() -> Any:
    """Errors of the layers below that open with a CLI flag (``--only X: ...``, ``--budget-s
    must ...``) say it with this API's keyword arguments (``only key X: ...``, ``budget_s
    must ...``); the exception and its type are kept."""
    from strategies.config import ConfigError
    from strategies.errors import StrategyError

    try:
        yield
    except (UsageProblem, StrategyError, ConfigError) as exc:
        message = str(exc)
        if message.startswith("--") and len(exc.args) == 1:
            exc.args = (_api_terms(message),)
        raise


# -- loading records ------------------------------------------------------------------------


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a profile.json (or the directory holding one) written by ``advisor profile``."""
    from advisor.recommending import read_profile

    return read_profile(_given_path(path, "path"))


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a plan.json (or RUN/plan.json) written by ``advisor recommend`` (or a
    tuned_plan.json of ``advisor tune``); a missing or unreadable plan is a UsageProblem."""
    from advisor.exporters import load_plan as read_plan

    return read_plan(_given_path(path, "path"))


# -- the four steps -------------------------------------------------------------------------


def _not_while_a_child_imports_the_script() -> None:
    """Exit at once from a call made as a child process imports the caller's script: the
    probes and the validation run in children started with ``spawn``, which imports the
    parent's main file in each. An unguarded call there started a profile of its own in every
    child, and the parent's probes timed out with no word of why; the parent now raises
    :class:`profilers.isolate.MainScriptReimported` (a ValueError) naming the fix."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        from profilers.isolate import MAIN_REIMPORTED, MAIN_REIMPORTED_EXIT

        print(f"error: {MAIN_REIMPORTED}", file=sys.stderr, flush=True)
        os._exit(MAIN_REIMPORTED_EXIT)


def profile(
    model: ModelLike = DEFAULT_MODEL,
    *,
    model_args: Mapping[str, Any] | None = None,
    data: str = DEFAULT_DATA,
    tokenizer: str | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    device: str = "auto",
    budget_s: float = DEFAULT_PROFILE_BUDGET_S,
    precisions: Sequence[str] | None = None,
    checkpointing: Sequence[str] | None = None,
    comm: bool = True,
    trace_for: str | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: Callable[[str, float], None] | bool | None = None,
) -> Profile:
    """Measure ``model`` with short probes on this machine (``advisor profile``).

    ``model``: a spec string or a factory (see :func:`model_spec`); ``model_args`` override its
    config fields or are passed to the factory (``--model-arg``). ``data``: stdlib, synthetic,
    a text file, a ``.bin`` of uint16 token ids. ``budget_s``: the time all probes share (they
    fill it). ``precisions``: profile only these (default: all the device runs).
    ``checkpointing``: the activation-checkpointing settings to measure (default: none, full,
    ops and the middle blocks:K; add ``ops-half`` for torchtitan's 'op' policy). ``comm``:
    run the communication probe. ``trace_for``: ``"cuda"`` traces memory as a CUDA GPU holds
    it whatever device probes (a CPU profile for a what-if, ``--target``); default: the probed
    device's kind. ``out``: where profile.json and probes.csv are written
    (default ``runs/profile-TIMESTAMP``). ``progress``: True prints each probe's line on
    stderr, or a callback ``progress(message, fraction_of_budget)``.

    Returns the :class:`profilers.profile_record.Profile` also saved in ``out``.
    """
    _not_while_a_child_imports_the_script()
    from advisor.profiling import ProfileRequest
    from advisor.profiling import profile as run_profile
    from advisor.training import default_out

    spec, args = _model_and_args(model, model_args)
    _check_choice("device", device, DEVICES)
    if trace_for is not None:
        from profilers.defaults import TRACE_TARGETS

        _check_choice("trace_for", trace_for, TRACE_TARGETS)
    _check_int("seq_len", seq_len, 1)
    _check_number("budget_s", budget_s)
    _check_bool("comm", comm)
    if isinstance(precisions, str):
        precisions = (precisions,)
    for precision in precisions or ():
        _check_choice("precision", precision, PRECISIONS)
    if isinstance(checkpointing, str):  # one setting, not its letters
        checkpointing = (checkpointing,)
    directory = _out_dir(out)
    request = ProfileRequest(
        model=spec,
        model_args=args,
        data=data,
        tokenizer=tokenizer,
        seq_len=seq_len,
        device=device,
        budget_s=budget_s,
        precisions=tuple(precisions) if precisions else None,
        checkpointing=tuple(checkpointing) if checkpointing else None,
        comm=comm,
        trace_for=trace_for,
    )
    say = _progress("profile", progress, form="(message, fraction_of_budget)")
    with _in_api_terms(), _kept_environment():
        return run_profile(request, directory or default_out("profile"), say)


def recommend(
    profile: Profile | str | os.PathLike[str],
    *,
    global_batch_size: int,
    memory_budget: float = DEFAULT_MEMORY_BUDGET,
    world_size: int | None = None,
    trials: int | None = None,
    validate_top: int = DEFAULT_VALIDATE_TOP_K,
    validate_rounds: int = DEFAULT_VALIDATE_ROUNDS,
    storage: str | None = None,
    study_name: str | None = None,
    target: str | None = None,
    nodes: int = 1,
    network: str | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    only: Mapping[str, Any] | None = None,
    device: str = "auto",
    steps: int | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | bool | None = None,
) -> Plan:
    """Pick the fastest config that fits at ``global_batch_size`` (``advisor recommend``):
    cost model + Optuna search over precision, checkpointing, micro-batch × accumulation and
    layout, the best ``validate_top`` measured by short real runs (one that fails is replaced
    by the next ranked, up to ``validate_top`` replacements).

    ``profile``: a Profile, or the path of a profile.json or of its directory. ``memory_budget``:
    the fraction of device memory (CPU: RAM) a plan may use. ``world_size``: the most ranks to
    consider. ``trials``: the trial budget of a sampled search. ``validate_rounds``: how often
    close contenders are re-measured. ``target``/``nodes``/``network``: a what-if plan for
    hardware that is not here (never validated; labelled an estimate). ``hyperparameters``:
    TrainConfig keys the plan carries unchanged (``strategies.config.HYPERPARAMETER_KEYS``: lr,
    min_lr, warmup_steps, weight_decay, grad_clip, seed ...). ``only``: per knob, the values
    the search may turn (``--only``; e.g. ``{"checkpointing": ["none", "full"], "compile":
    False}``; knobs in ``strategies.restrict.KNOB_NAMES``). ``device``: where validation
    runs (auto: the profiled device). ``steps``: the optimizer steps the plan will train
    (``--steps``; default advisor train's 300): a compiled candidate's compile time is amortised
    over them when ranking.

    ``out``: where plan.json, trials.csv and the study (study.db) go; default: the profile's
    directory when ``profile`` is a path, else nothing is saved and the study lives in a
    temporary directory for this call (pass ``out`` or ``storage`` to resume it). Re-running
    with the same ``out``/``storage`` resumes the study. ``progress``: True prints its lines on
    stderr, or a callback ``progress(message)``.

    Returns the :class:`strategies.plan_records.Plan`; raises ``NothingFits`` (a
    StrategyError) when no candidate fits the budget.
    """
    _not_while_a_child_imports_the_script()
    from advisor.recommending import recommend as run_recommend
    from profilers.profile_record import Profile
    from profilers.rundir import profile_path
    from strategies.config import DEFAULT_STEPS
    from strategies.search import default_storage
    from strategies.space import SearchRequest

    _check_choice("device", device, DEVICES)
    _check_int("global_batch_size", global_batch_size, 1)
    _check_int("validate_top", validate_top, 0)
    _check_int("validate_rounds", validate_rounds, 1)
    _check_int("steps", steps, 1)
    _check_number("memory_budget", memory_budget)
    hyperparameters = _check_mapping("hyperparameters", hyperparameters, "{'lr': 3e-4}")
    only = _check_mapping("only", only, "{'precision': ['bf16'], 'compile': False}")
    source = _profile_source(profile)
    directory = _out_dir(out)
    say = _progress("recommend", progress)
    with _in_api_terms():
        request = SearchRequest(
            global_batch_size=global_batch_size,
            memory_budget=memory_budget,
            world_size=world_size,
            trials=trials,
            target=target,
            nodes=nodes,
            network=network,
            study_name=study_name,
            config_overrides=hyperparameters,
            only=only,
            run_steps=DEFAULT_STEPS if steps is None else steps,
        )
    with contextlib.ExitStack() as stack:
        stack.enter_context(_kept_environment())
        if directory is None and storage is None:
            if isinstance(source, Profile):
                temporary = stack.enter_context(tempfile.TemporaryDirectory(prefix="advisor-"))
                storage = default_storage(Path(temporary))
            else:
                directory = profile_path(source).parent
        with _in_api_terms():
            return run_recommend(
                source,
                request,
                validate_top_k=validate_top,
                validation_rounds=validate_rounds,
                storage=storage,
                out=directory,
                device=device,
                progress=say,
            )


def predict(
    profile: Profile | str | os.PathLike[str],
    plan: Plan | Mapping[str, Any] | TrainConfig | str | os.PathLike[str] | None = None,
    *,
    memory_budget: float = DEFAULT_MEMORY_BUDGET,
    target: str | None = None,
    nodes: int = 1,
    network: str | None = None,
    steps: int | None = None,
    **config: Any,
) -> Prediction:
    """What one config would cost (``advisor predict``): peak memory, step time and tokens/s
    with their 90% intervals, whether it fits, and the breakdown.

    ``profile``: a Profile, or the path of a profile.json or of its directory. ``plan``: a
    Plan (or its ``to_dict()``), a TrainConfig, or the path of a plan.json or of its run
    directory (its plan.json) to price (None: the profile's model and sequence length at the
    defaults); ``config``: TrainConfig keys over it, as the CLI's flags
    (``micro_batch_size=8``, ``precision="bf16"``, ``activation_checkpointing="full"``
    ...). The model is the profile's (a plan's must match it, as its sequence length must).
    ``memory_budget``: the fraction of device memory a plan may use (``fits``).
    ``target``/``nodes``/``network``: an estimate for hardware that is not here. ``steps``: the
    run's length, over which a compiled config's compile time is amortised.

    Returns a :class:`strategies.prediction.Prediction` (``.step_time_s``,
    ``.tokens_per_s``, ``.step_time_interval_s``, ``.fits``, ``.breakdown``, ``.to_dict()``);
    raises ``Unpredictable`` when the profile lacks a measurement the config needs (the
    message names the probe that would add it) and ``ConfigError`` for an inconsistent config.
    """
    from advisor.recommending import predict_config, profiled_config, read_profile
    from advisor.training import keeping_the_global_batch
    from strategies.config import compose_config, load_plan_config
    from strategies.plan_records import Plan

    _check_int("nodes", nodes, 1)
    _check_int("steps", steps, 1)
    _check_number("memory_budget", memory_budget)
    source = _profile_source(profile)
    plan = _plan_source(plan)
    prof = read_profile(source)
    _check_config_keys(config)
    fixed = {"model", "model_args", "seq_len"} & set(config)
    if fixed:
        raise UsageProblem(
            f"{', '.join(sorted(fixed))}: the profile's, not a knob to price: profile that "
            "model and sequence length to price them"
        )
    base = profiled_config(prof)
    if plan is not None:
        chosen = (
            plan.config
            if isinstance(plan, Plan)
            else plan
            if isinstance(plan, TrainConfig)
            else load_plan_config(Path(plan))
        )
        if (chosen.model, chosen.model_args) != (base.model, base.model_args):
            # It was priced as the profile's model, without a word.
            raise UsageProblem(
                f"the plan trains {_model_shown(chosen)} but the profile measured "
                f"{_model_shown(base)}: price it with a profile of its model "
                "(advisor.profile(model=..., model_args=...))"
            )
        knobs = {k: v for k, v in chosen.to_dict().items() if k not in {"model", "model_args"}}
        base = compose_config(base, knobs)
        config = keeping_the_global_batch(chosen, config)  # as advisor.train(plan, ...) does
    with _in_api_terms():
        prediction, _label = predict_config(
            prof,
            compose_config(base, config),
            memory_budget=memory_budget,
            target=target,
            nodes=nodes,
            network=network,
            steps=steps,
        )
    return prediction


def _model_shown(config: TrainConfig) -> str:
    args = " ".join(f"{k}={v}" for k, v in sorted(config.model_args.items()))
    return f"{config.model} ({args})" if args else config.model


def train(
    plan: Plan | Mapping[str, Any] | TrainConfig | str | os.PathLike[str] | None = None,
    *,
    steps: int | None = None,
    tokens: int | None = None,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS,
    eval_every: int | None = None,
    eval_batches: int = DEFAULT_EVAL_BATCHES,
    val_data: str | os.PathLike[str] | None = None,
    device: str = "auto",
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    progress: Callable[[str], None] | bool = False,
    **config: Any,
) -> TrainSummary:
    """Train a plan end to end (``advisor train``): metrics.jsonl and checkpoints in ``out``.

    ``plan``: a Plan (or its ``to_dict()``), a TrainConfig, the path of a plan.json or of its
    run directory (its plan.json), or None (the defaults; with ``resume``, the run's saved
    config). ``config``: TrainConfig keys over it, as the CLI's
    flags (``micro_batch_size=4``, ``precision="bf16"``, ``lr=3e-4``, ``model=my_factory``,
    ``model_args={...}``); the global batch stays consistent (micro × accumulation × world).
    ``steps`` or ``tokens``: the run's length (default 300 steps). ``out``: the run directory
    (default ``runs/train-TIMESTAMP``); ``resume``: continue the run in ``out`` from its last
    checkpoint. ``checkpoint_every``/``keep_checkpoints``/``eval_every``/``eval_batches``: as the
    CLI's flags. ``val_data``: the file the evaluations read (``--val-data``: text, a
    ``.jsonl`` (``"FILE.jsonl:FIELD"``), a ``.bin`` or ``.npy`` of token ids, or a directory's
    ``val.bin`` or val shards; all of it), instead of the data's validation split; a resume
    without it keeps the run's own. ddp/fsdp plans run through torchrun (``nnodes``, ``node_rank``,
    ``rdzv_endpoint`` for several machines), and report as a run in this process does (notes,
    the return value); the ranks' own stdout goes to ``OUT/stdout.log``, not to the caller's.
    ``progress``: True prints the per-step lines on stderr, or a callback ``progress(message)``
    receives them. A run's notes (it is not what it seems to ask for: its data repeated, a
    warm-up as long as the run) go to the callback as ``note: ...`` lines, on stderr with
    True, else as :class:`advisor.errors.AdvisorNote` warnings. The caller's environment
    variables are as they were when it returns (the launcher sets some for its ranks).

    Returns a :class:`advisor.training.TrainSummary`; raises ``TrainingDiverged`` on a NaN/inf
    loss (the last good checkpoint is kept).
    """
    _not_while_a_child_imports_the_script()
    from advisor.launch import LaunchSpec
    from advisor.trainer.options import RunOptions, run_steps
    from advisor.training import default_out, needs_launch, resolve_train_config
    from advisor.training import train as run_training
    from strategies.plan_records import Plan

    _check_choice("device", device, DEVICES)
    for name, value, minimum in (
        ("steps", steps, 1),
        ("tokens", tokens, 1),
        ("checkpoint_every", checkpoint_every, 1),
        ("keep_checkpoints", keep_checkpoints, 1),
        ("eval_every", eval_every, 0),
        ("eval_batches", eval_batches, 1),
        ("nnodes", nnodes, 1),
        ("node_rank", node_rank, 0),
    ):
        _check_int(name, value, minimum)
    _check_bool("resume", resume)
    if steps is not None and tokens is not None:
        raise UsageProblem("give steps or tokens, not both")
    directory = _out_dir(out)
    if resume and directory is None:
        raise UsageProblem("resume=True needs out= naming the run to continue")
    _check_config_keys(config)
    if "model" in config:
        config["model"] = model_spec(config["model"])
    if config.get("model_args") is not None:
        config["model_args"] = _model_and_args(DEFAULT_MODEL, config["model_args"])[1]
    say = _progress("train", progress)  # a callback of the wrong shape: refused here
    if callable(progress):  # a ddp/fsdp run calls it from two threads (steps, rank notes)
        progress = say = _one_call_at_a_time(progress)
    source = _plan_source(plan)
    base = source.config if isinstance(source, Plan) else source
    with _in_api_terms():
        resolved = resolve_train_config(base, directory, resume, config)
    options = RunOptions(
        out=directory or default_out("train"),
        steps=run_steps(steps, tokens, resume=resume),
        tokens=tokens,
        resume=resume,
        checkpoint_every=checkpoint_every,
        eval_every=eval_every,
        eval_batches=eval_batches,
        val_data=_val_data(val_data),
        keep_checkpoints=keep_checkpoints,
        device=device,
        progress=progress is True,  # the per-step display; a callback gets the lines alone
        on_line=progress if callable(progress) else None,
        on_note=_notes_for(progress),
    )
    spec = None
    if needs_launch(resolved):
        with _in_api_terms():
            spec = LaunchSpec(
                world_size=resolved.world_size,
                nnodes=nnodes,
                node_rank=node_rank,
                rdzv_endpoint=rdzv_endpoint,
            )
    with _in_api_terms(), _kept_environment():
        if spec is None:
            result = run_training(resolved, options, launch=None, say=say)
            assert result is not None  # trained in this process
            return TrainSummary.from_result(resolved, result)
        with _reported_by_the_ranks(
            options.on_note, live=progress is True or callable(progress)
        ) as rank0:
            run_training(resolved, options, launch=spec, say=say)
    summary = TrainSummary.from_run_dir(resolved, options.out)
    if rank0.get("already_complete") is True:
        summary = dataclasses.replace(summary, already_complete=True)
    return summary


def _one_call_at_a_time(callback: Callable[[str], Any]) -> Callable[[str], Any]:
    """``callback`` behind a lock: the caller's function is never entered by two threads at
    once (a single-process run calls it from one)."""
    import threading

    lock = threading.Lock()

    def serialized(message: str) -> Any:
        with lock:
            return callback(message)

    return serialized


@contextlib.contextmanager
def _reported_by_the_ranks(
    on_note: Callable[[str], None] | None, *, live: bool
) -> Iterator[dict[str, Any]]:
    """While ranks launched through torchrun train, what rank 0 reports to this process
    (advisor.cli.train's records, in a temporary file named to the ranks by an environment
    variable, which the caller's :func:`_kept_environment` takes back): its notes reach
    ``on_note`` as a run in this process gives them (None: printed on stderr as the CLI does),
    and its result's fields fill the dict yielded. The ranks' own stdout goes to the run
    directory's stdout.log, not to the caller's: the library prints nothing.

    ``live``: notes as they come, from a thread (a callback gets the step lines so too);
    else once the ranks are done, in the caller's thread (warnings: where it can catch them).
    Notes come whether the job succeeded or not."""
    import threading

    from advisor.cli.train import API_REPORT_ENV
    from advisor.training import json_lines_after

    handle, name = tempfile.mkstemp(prefix="advisor-ranks-", suffix=".jsonl")
    os.close(handle)
    path = Path(name)
    os.environ[API_REPORT_ENV] = name
    result: dict[str, Any] = {}
    offset = 0
    lock = threading.Lock()

    def note(text: str) -> None:
        if on_note is None:
            print(f"note: {text}", file=sys.stderr, flush=True)
        else:
            on_note(text)

    def drain() -> None:
        nonlocal offset
        with lock:
            records, offset = json_lines_after(path, offset)
            for record in records:
                if isinstance(record, dict) and isinstance(record.get("note"), str):
                    note(record["note"])
                elif isinstance(record, dict) and isinstance(record.get("result"), dict):
                    result.update(record["result"])

    done = threading.Event()

    def follow() -> None:
        while not done.wait(0.5):
            drain()

    thread = threading.Thread(target=follow, name="advisor-rank-notes", daemon=True)
    if live:
        thread.start()
    try:
        yield result
    finally:
        done.set()
        if live:
            thread.join(timeout=5)
        try:
            drain()
        finally:
            path.unlink(missing_ok=True)


def export(
    plan: Plan | Mapping[str, Any] | str | os.PathLike[str],
    to: str,
    *,
    steps: int | None = None,
    out: str | os.PathLike[str] | None = None,
) -> Export:
    """The plan's config in another training stack's own format (``advisor export``).

    ``plan``: a Plan (or its ``to_dict()``), or the path of a plan.json or of its run
    directory (a run that advisor tune tuned exports its ``tuned_plan.json``, tuned at the
    config of its ``plan.json``; the export's ``notes`` say so). ``to``: one of
    ``advisor.exporters.FORMATS`` (hf, accelerate, lightning, deepspeed, torchtitan).
    ``steps``: the optimizer steps the lr schedule spans (default: for a path, the length of
    the run's own training when RUN/train trained this plan; else, and for a Plan record,
    which carries no run, advisor train's default 300). Returns an ``Export``: ``settings``
    (the native keyword arguments / config as a dict), ``text`` (the file, with a header
    naming the plan), ``unmapped`` (knobs the stack cannot express), ``launch`` (its launch
    line, where it has one). ``out``: also write the file there (an existing directory, or a
    path ending in ``/``: under the export's own file name), and the header beside it as
    ``FILE.advisor.txt`` when the file cannot hold one (hf's JSON).
    """
    from advisor.exporters import export_plan, write_export
    from strategies.plan_records import Plan

    _check_int("steps", steps, 1)
    directory = _path(out)
    # A path as given: export_plan picks a run directory's tuned plan where it has one.
    chosen = (
        Path(plan) if isinstance(plan, (str, os.PathLike)) else _plan_source(plan, configs=False)
    )
    if not isinstance(chosen, (Plan, Path)):  # None or a TrainConfig: no plan to export
        raise _not_a_plan(plan, configs=False)
    with _in_api_terms():
        result = export_plan(chosen, to, steps=steps)
    if directory is not None:
        # A trailing separator names a directory (made if missing), as the CLI's --out DIR/.
        into_directory = str(out).endswith(("/", os.sep))
        write_export(result, directory, into_directory=into_directory)
    return result


def tune(
    plan: Plan | Mapping[str, Any] | str | os.PathLike[str],
    *,
    trials: int = DEFAULT_TUNE_TRIALS,
    tokens_per_trial: int | None = None,
    params: str | None = None,
    storage: str | None = None,
    out: str | os.PathLike[str] | None = None,
    device: str = "auto",
    seed: int | None = None,
    val_data: str | os.PathLike[str] | None = None,
    progress: TuneProgress | Callable[[str], None] | bool | None = None,
) -> TuneResult:
    """Tune lr / warm-up / weight decay at the plan's config (``advisor tune``).

    ``plan``: a Plan (or its ``to_dict()``), or the path of a plan.json or of its run
    directory. ``trials``: the
    study's size; ``tokens_per_trial``: what each trial trains (default 300 of the plan's
    steps); ``params``: ``"lr,warmup,wd"`` or with ranges ``"lr=1e-4:1e-2,wd=0:0.2"``;
    ``storage``: an Optuna RDB URL (default ``sqlite:///OUT/study.db``), shared by workers;
    ``out``: where ``tuned_plan.json`` and ``tune/`` go (default: the plan's directory; needed
    for a Plan record, which is written there as ``tune/plan.json`` first); ``seed``: the
    sampler's (default: fresh per worker); ``val_data``: the file the trials are scored on
    (as ``train``'s; default: the plan's data's validation split); ``progress``: True
    prints advisor tune's lines on stderr (a trial's parameters as it starts, its result as
    it ends), a callback ``progress(message)`` receives them, or an
    :class:`advisor.tuning.TuneProgress` gets each event. Returns a
    :class:`advisor.tuning.TuneResult` (``.plan`` is the tuned Plan, ``.trials`` every trial,
    ``.summary`` the study)."""
    _not_while_a_child_imports_the_script()
    from advisor.tuning import TuneRequest
    from advisor.tuning import tune as run_tune
    from profilers.rundir import PLAN, RunDir
    from profilers.rundir import write_atomically as write
    from strategies.plan_records import Plan

    _check_choice("device", device, DEVICES)
    _check_int("trials", trials, 1)
    _check_int("tokens_per_trial", tokens_per_trial, 1)
    directory = _out_dir(out)
    shown = _progress("tune", progress, or_else=" or an advisor.tuning.TuneProgress")
    if shown is not None and not hasattr(shown, "trial_finished"):
        # The CLI's lines, without its bar: one per trial, on stderr or to the callback.
        shown = _tune_lines(shown, trials)
    # A path as given (tune reads a run directory's plan.json itself).
    chosen = (
        Path(plan) if isinstance(plan, (str, os.PathLike)) else _plan_source(plan, configs=False)
    )
    if isinstance(chosen, Plan):
        if directory is None:
            raise UsageProblem("tune(plan=Plan(...)) needs out= naming where the study goes")
        source = RunDir(directory).tune.root / PLAN
        source.parent.mkdir(parents=True, exist_ok=True)
        write(source, json.dumps(chosen.to_dict(), indent=1) + "\n")
    elif isinstance(chosen, Path):
        source = chosen
    else:  # None or a TrainConfig: tune needs a plan's record
        raise _not_a_plan(plan, configs=False)
    request = TuneRequest(
        trials=trials,
        tokens_per_trial=tokens_per_trial,
        params=params,
        storage=storage,
        device=device,
        seed=seed,
        val_data=_val_data(val_data),
    )
    with _in_api_terms(), _kept_environment():
        return run_tune(source, request, out=directory, progress=shown)


def _tune_lines(say: Callable[[str], None], trials: int) -> TuneProgress:
    """advisor tune's lines (a trial's parameters as it starts, its result as it ends), each
    given to ``say``: what ``tune(progress=True)`` prints and a ``callable(message)`` gets."""
    from advisor.cli.tune import CliTuneProgress

    class Lines(CliTuneProgress):
        def _echo(self, text: str) -> None:
            say(text)

    return Lines(quiet=False, trials=trials)
