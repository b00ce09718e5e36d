"""A shared SQLite study opened while another worker reads it: switching the file to WAL
needs it to itself, and SQLite answers 'database is locked' at once while a read transaction
is open (no busy wait): a second `advisor tune` worker on a fresh study failed so in CI."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import optuna
import pytest

import strategies.study as study_module
from strategies.study import _use_wal, open_study


def _journal_mode(db: Path) -> str:
    with sqlite3.connect(db) as connection:
        return str(connection.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def test_a_connection_opened_while_another_reads_the_file_still_switches_it_to_wal(
    tmp_path: Path,
) -> None:
    db, url = tmp_path / "study.db", f"sqlite:///{tmp_path / 'study.db'}"
    storage = optuna.storages.RDBStorage(url)  # Optuna's tables, in rollback-journal mode
    reader = sqlite3.connect(db, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM studies").fetchall()  # a read transaction holds the file
    release = threading.Timer(0.5, reader.rollback)
    release.start()
    try:
        _use_wal(storage)
        with storage.engine.connect():  # a worker's new connection switches the file
            pass
    finally:
        release.join()
        reader.close()
    assert _journal_mode(db) == "wal"
    storage.engine.dispose()


def test_a_shared_sqlite_study_opens_in_wal(tmp_path: Path) -> None:
    study = open_study(f"sqlite:///{tmp_path / 'study.db'}", "shared", 0, None)
    assert study.study_name == "shared"
    assert _journal_mode(tmp_path / "study.db") == "wal"


def test_a_file_held_all_along_is_left_in_rollback_mode_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WAL is a speed-up: a connection that cannot switch after its tries goes on (before, it
    waited out the 60 s busy timeout and failed the worker)."""
    monkeypatch.setattr(study_module, "WAL_ATTEMPTS", 2)
    monkeypatch.setattr(study_module, "WAL_WAIT_MS", 100)
    db, url = tmp_path / "study.db", f"sqlite:///{tmp_path / 'study.db'}"
    storage = optuna.storages.RDBStorage(url, engine_kwargs=study_module._engine_kwargs(url))
    reader = sqlite3.connect(db)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM studies").fetchall()
    try:
        _use_wal(storage)
        with storage.engine.connect() as connection:
            raw = connection.connection.dbapi_connection
            assert raw is not None
            # the connection keeps the storage's own busy timeout (60 s) for its work
            assert raw.execute("PRAGMA busy_timeout").fetchone()[0] == 60_000
    finally:
        reader.close()
    assert _journal_mode(db) == "delete"
    storage.engine.dispose()


@pytest.mark.parametrize(
    ("storage", "said"),
    [
        # in memory: each connection its own empty database (a traceback, exit 1, in recommend)
        ("sqlite://", "is an in-memory database"),
        ("sqlite:///:memory:", "is an in-memory database"),
        ("  ", "--storage is empty"),
        # SQLAlchemy 2.1's default PostgreSQL driver is psycopg 3, which the extra lacks
        (
            "postgresql://u:s3cret@127.0.0.1:1/db",
            "no driver for postgresql://: write postgresql+psycopg2://user:pw@host/db",
        ),
    ],
)
def test_a_storage_no_study_can_live_in_is_named_with_its_fix(storage: str, said: str) -> None:
    from strategies.errors import StrategyError

    with pytest.raises(StrategyError) as caught:
        open_study(storage, "s", 0, None)
    assert said in str(caught.value)
    assert "s3cret" not in str(caught.value)  # the password stays out of the message


def test_a_drivers_long_message_is_cut_at_a_word_without_sqlalchemys_link() -> None:
    text = "word " * 60 + "(Background on this error at: https://sqlalche.me/e/20/e3q8)"
    short = study_module._shortened(text)
    assert short.endswith("word ...") and "Background" not in short and len(short) <= 204


def test_a_named_driver_that_is_missing_is_told_to_install_it() -> None:
    """postgresql+psycopg2:// without psycopg2 was told to write postgresql+psycopg2://."""
    hint = study_module._storage_hint("postgresql+psycopg2://u@h/db", "No module named 'psycopg2'")
    assert hint == "psycopg2 is not installed: pip install 'transformer-advisor[postgres]'"
