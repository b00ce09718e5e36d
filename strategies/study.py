"""The search's study plumbing: the Optuna study a search runs in, and its trials' parameters.

Opening the storage (retrying the table-creation race of workers starting together, SQLite in
WAL mode), finishing trials a killed worker left RUNNING, the sampler that lets the loop choose
an enumerated trial's candidate, and the trial parameters <-> :class:`Candidate` mapping. Optuna
is imported inside the functions that need it, never at import time. The loop that drives the
study is :func:`strategies.search.run_search`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from strategies.errors import StrategyError
from strategies.space import Candidate, SearchSpace

if TYPE_CHECKING:
    import optuna

STALE_RUNNING_S = 600.0  # a RUNNING trial this old was left by a killed worker
OPEN_ATTEMPTS = 6
ATTR = "advisor"  # the one user attribute each trial carries (one storage write)


# -- parameters ---------------------------------------------------------------------------------


def _layout_name(parallelism: str, world_size: int) -> str:
    return f"{parallelism}/{world_size}"


def _micro_name(world_size: int) -> str:
    # Conditional parameter: the micro-batch sizes allowed depend on the world size.
    return f"micro_batch_size_w{world_size}"


def trial_params(candidate: Candidate) -> dict[str, Any]:
    return {
        "precision": candidate.precision,
        "activation_checkpointing": candidate.activation_checkpointing,
        "layout": _layout_name(candidate.parallelism, candidate.world_size),
        _micro_name(candidate.world_size): candidate.micro_batch_size,
        "num_workers": candidate.num_workers,
        "loss_chunks": candidate.loss_chunks,
        "compile": candidate.compile,
        # Conditional: only FSDP layouts turn it.
        **(
            {"fsdp_reshard_after_forward": candidate.fsdp_reshard_after_forward}
            if candidate.parallelism == "fsdp"
            else {}
        ),
    }


def suggest_candidate(trial: optuna.Trial, space: SearchSpace) -> Candidate:
    precision = trial.suggest_categorical("precision", list(space.precisions))
    checkpointing = trial.suggest_categorical("activation_checkpointing", list(space.checkpointing))
    layout = trial.suggest_categorical("layout", [_layout_name(p, w) for p, w in space.layouts])
    parallelism, world = layout.split("/")
    world_size = int(world)
    micro = trial.suggest_categorical(
        _micro_name(world_size), list(space.micro_batch_sizes(world_size))
    )
    workers = trial.suggest_categorical("num_workers", list(space.num_workers))
    chunks = trial.suggest_categorical("loss_chunks", list(space.loss_chunks))
    compiled = trial.suggest_categorical("compile", list(space.compile))
    reshard = True
    if parallelism == "fsdp":
        reshard = trial.suggest_categorical(
            "fsdp_reshard_after_forward", list(space.fsdp_reshard_after_forward)
        )
    return Candidate(
        precision=str(precision),
        activation_checkpointing=str(checkpointing),
        parallelism=parallelism,
        world_size=world_size,
        micro_batch_size=int(micro),
        grad_accum_steps=space.global_batch_size // (world_size * int(micro)),
        num_workers=int(workers),
        loss_chunks=int(chunks),
        fsdp_reshard_after_forward=bool(reshard),
        compile=bool(compiled),
    )


def candidate_from_params(params: Mapping[str, Any], space: SearchSpace) -> Candidate | None:
    try:
        parallelism, world = str(params["layout"]).split("/")
        world_size = int(world)
        micro = int(params[_micro_name(world_size)])
        candidate = Candidate(
            precision=str(params["precision"]),
            activation_checkpointing=str(params["activation_checkpointing"]),
            parallelism=parallelism,
            world_size=world_size,
            micro_batch_size=micro,
            grad_accum_steps=space.global_batch_size // (world_size * micro),
            num_workers=int(params["num_workers"]),
            loss_chunks=int(params.get("loss_chunks", 1)),  # studies from before the knob: 1
            fsdp_reshard_after_forward=bool(params.get("fsdp_reshard_after_forward", True)),
            compile=bool(params.get("compile", False)),  # studies from before the knob: eager
        )
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    return candidate if space.contains(candidate) else None


# -- study plumbing -------------------------------------------------------------------------------


def trial_key(trial: optuna.trial.FrozenTrial, space: SearchSpace) -> str | None:
    """The candidate key of a trial in any state (told, waiting in the queue, or running)."""
    attr = trial.user_attrs.get(ATTR)
    if isinstance(attr, dict) and "key" in attr:
        return str(attr["key"])
    params = trial.system_attrs.get("fixed_params") or trial.params
    candidate = candidate_from_params(params, space) if isinstance(params, dict) else None
    return candidate.key if candidate else None


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    from optuna.trial import TrialState

    return list(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def fail_stale(study: optuna.Study) -> None:
    """Finish RUNNING trials a killed worker left behind (pricing takes milliseconds: a trial
    still running after :data:`STALE_RUNNING_S` has no live worker)."""
    from optuna.trial import TrialState

    now = datetime.datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        start = trial.datetime_start
        if start is not None and (now - start).total_seconds() > STALE_RUNNING_S:
            with contextlib.suppress(Exception):  # another worker may finish it first
                study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)


def _constraints(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
    attr = trial.user_attrs.get(ATTR, {})
    return list(attr.get("constraint", [0.0])) if isinstance(attr, dict) else [0.0]


class EnumerationSampler(Protocol):
    next_params: dict[str, Any]


@functools.cache
def enumeration_sampler_class() -> type:
    """Optuna's BaseSampler for an enumerating study, built on first use (this module does not
    import Optuna at import time). Enqueued trials carry their parameters; a trial Optuna
    creates afresh takes ``next_params``, a candidate chosen by the loop."""
    import optuna

    class EnumerationSampler(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self.next_params: dict[str, Any] = {}

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            return {}

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
            return {}

        def sample_independent(
            self, study: Any, trial: Any, param_name: str, param_distribution: Any
        ) -> Any:
            if param_name in self.next_params:
                return self.next_params[param_name]
            return param_distribution.choices[0]  # a name the chosen layout does not use

    return EnumerationSampler


def open_study(
    storage: str,
    study_name: str,
    seed: int,
    enumerator: EnumerationSampler | None,
    *,
    direction: Literal["minimize", "maximize"] = "maximize",
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
) -> optuna.Study:
    """Create or load ``study_name``; ``sampler``/``pruner``/``direction`` for other studies
    than the config search's (``advisor tune``'s: minimise eval loss, with a pruner)."""
    import optuna

    problem = storage_problem(storage)
    if problem:
        raise StrategyError(problem)
    for attempt in range(OPEN_ATTEMPTS):
        try:
            rdb = optuna.storages.RDBStorage(storage, engine_kwargs=_engine_kwargs(storage))
            break
        except Exception as exc:  # sqlalchemy/driver errors: a bad URL, no server, no driver
            # Workers starting together on a fresh database race to create Optuna's tables
            # ("already exists", unique-key violations): the loser retries and finds them made.
            text = " ".join(str(exc).split())
            racing = type(exc).__name__ == "IntegrityError" or any(
                m in text for m in ("already exists", "duplicate key", "locked")
            )
            if racing and attempt + 1 < OPEN_ATTEMPTS:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise StrategyError(
                f"cannot open the study storage {redact(storage)!r}: {type(exc).__name__}: "
                f"{_shortened(text)} ({_storage_hint(storage, text)})"
            ) from None
    if storage.startswith("sqlite"):
        _use_wal(rdb)
    if sampler is None:
        sampler = _search_sampler(enumerator, seed)
    return optuna.create_study(
        storage=rdb,
        study_name=study_name,
        sampler=sampler,
        pruner=pruner,
        direction=direction,
        load_if_exists=True,
    )


def storage_problem(storage: str) -> str | None:
    """Why ``storage`` cannot hold a study, before anything opens it: empty, or an in-memory
    SQLite database (each connection gets its own, empty one: Optuna's tables are missing at
    the next connection, and neither a re-run nor another worker could open it)."""
    url = storage.strip()
    if not url:
        return "--storage is empty: leave it out for the default OUT/study.db, or give a URL"
    if url.startswith("sqlite") and (url.rstrip("/") == "sqlite:" or ":memory:" in url):
        return (
            f"--storage {url} is an in-memory database, which neither a re-run nor another "
            "worker can open: give a file (sqlite:///PATH/study.db) or a server's URL"
        )
    return None


def _shortened(text: str, limit: int = 200) -> str:
    """A driver's message for one line: without SQLAlchemy's "(Background on this error at:
    URL)" and cut at a word, not mid-word ("... Background on this error at: ht")."""
    text = text.split("(Background on this error at:")[0].strip()
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


def _storage_hint(storage: str, text: str) -> str:
    """The fix to name: the driver a bare postgresql:// lacks (SQLAlchemy 2.1 defaults to
    psycopg 3; the extra 'postgres' installs psycopg2), else what a URL looks like."""
    url = storage.strip().lower()
    if url.startswith("postgresql") and (
        "import DB access module" in text or "No module named" in text
    ):
        driver = url.split("://", 1)[0]
        if driver == "postgresql+psycopg2":  # named already: the driver is not installed
            return "psycopg2 is not installed: pip install 'transformer-advisor[postgres]'"
        return (
            f"no driver for {driver}://: write postgresql+psycopg2://user:pw@host/db, whose "
            "driver the extra 'postgres' installs"
        )
    return "an Optuna RDB URL such as sqlite:///study.db or postgresql+psycopg2://user:pw@host/db"


def _engine_kwargs(storage: str) -> dict[str, Any]:
    if storage.startswith("sqlite"):
        # Concurrent workers on one file wait for the lock instead of failing at once.
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True}


def _use_wal(rdb: optuna.storages.RDBStorage) -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit no longer fsyncs (measured: ~140
    -> ~30 ms per trial here); the database stays consistent after a crash (SQLite docs, "WAL
    mode"), at worst losing the last trials, which a resumed search re-tells."""
    from sqlalchemy import event

    def on_connect(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()
            if not mode or str(mode[0]).lower() != "wal":
                _switch_to_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    event.listen(rdb.engine, "connect", on_connect)
    rdb.engine.dispose()  # reconnect through the listener


# Tries at switching a database to WAL while other connections hold it, each waiting at most
# WAL_WAIT_MS for them, 0.1 s more apart each time (about 10 s in all).
WAL_ATTEMPTS = 10
WAL_WAIT_MS = 500


def _switch_to_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode=WAL`` on a fresh connection, retried a few times while other
    connections hold the file, then left: WAL is a speed-up, not needed for correctness.

    Switching needs the file to itself. A second ``advisor tune`` worker starting on a fresh
    shared study failed at once in CI with 'database is locked' from this switch; a
    connection that waits on another's open read transaction waits out the whole busy timeout
    (60 s) before failing so. WAL stays set in the file, so one worker's switch serves all;
    one that never gets it goes on in rollback-journal mode (slower commits, same results)."""
    import sqlite3

    (previous,) = cursor.execute("PRAGMA busy_timeout").fetchone()
    cursor.execute(f"PRAGMA busy_timeout = {WAL_WAIT_MS}")
    try:
        for attempt in range(WAL_ATTEMPTS):
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                time.sleep(0.1 * (attempt + 1))
    finally:
        cursor.execute(f"PRAGMA busy_timeout = {int(previous)}")


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def redact(url: str) -> str:
    """The URL without its password, for plan.json and messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url


def _search_sampler(
    enumerator: EnumerationSampler | None, seed: int
) -> optuna.samplers.BaseSampler:
    """The config search's sampler: the enumerator when the space is enumerated, else TPE
    (with the feasibility constraint where this Optuna has no ``Trial.set_constraint``)."""
    import optuna

    if enumerator is not None:
        return cast("optuna.samplers.BaseSampler", enumerator)
    if hasattr(optuna.trial.Trial, "set_constraint"):
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constraints_func=_constraints)
