"""Two ``advisor tune`` workers share one study through ``--storage``: they split the trials
and write the same tuned plan. Parametrized over the storages (as tests/strategies/
test_postgres.py): SQLite (several processes on one host; always runs) and PostgreSQL (needs
``ADVISOR_TEST_POSTGRES_URL``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest

from advisor.tuning import ATTR, TuneRequest, prepare, tune
from profilers.rundir import RunDir
from tests.advisor.test_tuning import Scripted, write_plan

POSTGRES_URL = os.environ.get("ADVISOR_TEST_POSTGRES_URL")
TRIALS = 8
ROOT = Path(__file__).resolve().parents[2]


def _request(storage: str) -> TuneRequest:
    return TuneRequest(trials=TRIALS, tokens_per_trial=40 * 4 * 32, storage=storage)


def run_worker(plan: str, storage: str, out: str) -> None:
    """One worker (run in its own process). Both start together (a process may take seconds
    to import on a busy host) and a scripted trial takes up to ~0.5 s, so they overlap."""
    ready = Path(out).with_suffix(".ready")
    ready.touch()
    deadline = time.monotonic() + 120
    while len(list(ready.parent.glob("*.ready"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    tune(Path(plan), _request(storage), out=Path(out), runner=Scripted(delay_s=0.05))


def _storage(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    if not POSTGRES_URL:
        pytest.skip(
            "no PostgreSQL server: set ADVISOR_TEST_POSTGRES_URL=postgresql+psycopg2://user:pw@"
            "host/db (.ci/run installs and starts one)"
        )
    return POSTGRES_URL


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_workers_split_one_study_and_write_the_same_plan(kind: str, tmp_path: Path) -> None:
    storage = _storage(kind, tmp_path)
    # A fresh study on a long-lived server: the name hashes the plan, so vary the plan's seed.
    seed = uuid.uuid4().int % 10_000
    plan = write_plan(tmp_path / "plan", seed=seed)
    code = (
        "import sys; from tests.advisor.test_tuning_shared import run_worker; "
        "run_worker(*sys.argv[1:])"
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(plan), storage, str(tmp_path / name)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
    setup = prepare(plan, _request(storage), tmp_path / "a")
    study = optuna.load_study(study_name=setup.study_name, storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    # Each worker stops once the study holds TRIALS; two asking at the same moment may
    # each start one more, never more than one each.
    assert TRIALS <= len(finished) <= TRIALS + 1
    assert not [t for t in study.trials if not t.state.is_finished()]
    by_worker: dict[object, int] = {}
    for t in finished:
        by_worker[t.user_attrs[ATTR]["out"]] = by_worker.get(t.user_attrs[ATTR]["out"], 0) + 1
    assert set(by_worker) == {str(tmp_path / "a"), str(tmp_path / "b")}, by_worker
    plans = [json.loads(RunDir(tmp_path / n).tuned_plan.read_text()) for n in ("a", "b")]
    assert plans[0]["config"] == plans[1]["config"]
    summaries = [json.loads(RunDir(tmp_path / n).tune.study.read_text()) for n in ("a", "b")]
    assert summaries[0]["best_number"] == summaries[1]["best_number"]
    # Each worker's trials.jsonl lists the whole study, its own trials with their directory.
    lines = (RunDir(tmp_path / "a").tune.trials).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == len(study.trials)
    assert {bool(r["directory"]) for r in records} == {True, False}
