"""Ctrl-C during 'advisor profile' keeps what was measured (profilers.stopping): the profile
ends within seconds with its finished probes, the ones it cut short are skipped rows that say
so, profile.json and probes.csv are written, the command line names them, recommend plans from
them, and 'advisor run --resume' profiles again. Before, the first Ctrl-C lost everything.

One real profile, stopped by a Ctrl-C once its core (memory traces and timed steps) is done,
is shared by the tests that read it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from advisor.profiling import ProfileRequest
from profilers.profile_record import ProbeRow, Profile, interrupted_probes, load_profile
from profilers.profiler import ProfileInterrupted
from profilers.stopping import INTERRUPTED, stopped
from tests.advisor.test_cli_interrupts import invoke, one_line
from tests.strategies.profiles import hand_profile

SEQ_LEN = 32
# fp32 without checkpointing, no collectives: the core's share of 10 s (and what the child
# processes' start-up adds to it) measures memory at two sizes and times steps.
REQUEST = ProfileRequest(
    model="gpt-tiny",
    seq_len=SEQ_LEN,
    device="cpu",
    budget_s=10.0,
    precisions=("fp32",),
    checkpointing=("none",),
    comm=False,
)


# The same workload as advisor run asks for it.
RUN_FIELDS = ("model", "seq_len", "device", "budget_s", "precisions", "checkpointing", "comm")

# A row that is not ok, recorded before the Ctrl-C: it keeps its status and reason.
PLANTED = ProbeRow(probe="device", name="planted", status="error", reason="planted before Ctrl-C")


@dataclasses.dataclass(frozen=True)
class Interrupted:
    error: ProfileInterrupted
    out: Path
    before: list[ProbeRow]  # the probe rows written before the Ctrl-C
    handler_after: object  # the SIGINT handler once profile() had raised
    stopped_after: str | None
    said: list[str]  # the profile's progress lines


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Interrupted]:
    """advisor.profiling.profile with a Ctrl-C as the refinements begin (after the core)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set in the main thread only")
    import profilers.profiler
    from advisor.profiling import profile

    original = profilers.profiler.refine_phase
    before: list[ProbeRow] = []

    def ctrl_c_then_refine(run: Any, *args: Any, **kwargs: Any) -> Any:
        run.rows.append(PLANTED)
        before.extend(run.rows)
        signal.raise_signal(signal.SIGINT)  # the handler runs before this returns
        return original(run, *args, **kwargs)

    out = tmp_path_factory.mktemp("interrupted") / "profile"
    said: list[str] = []
    saved = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(profilers.profiler, "refine_phase", ctrl_c_then_refine)
            try:
                profile(REQUEST, out, lambda message, _spent: said.append(message))
            except KeyboardInterrupt as exc:  # not pytest.raises: a plain one would end the session
                error: KeyboardInterrupt = exc
            else:
                pytest.fail("the profile ended as if no Ctrl-C had come")
            handler_after = signal.getsignal(signal.SIGINT)
        if not isinstance(error, ProfileInterrupted):
            pytest.fail(f"the first Ctrl-C abandoned the profile: {error!r}")
        yield Interrupted(error, out, before, handler_after, stopped(), said)
    finally:
        if saved is not None:
            signal.signal(signal.SIGINT, saved)


def test_ctrl_c_ends_the_profile_and_saves_what_it_measured(interrupted: Interrupted) -> None:
    error, out = interrupted.error, interrupted.out
    assert isinstance(error, KeyboardInterrupt)  # what a caller without a handler for it gets
    assert error.saved_to == out
    saved = load_profile(out)
    assert saved.probes == error.profile.probes
    assert saved.workload["model"] == "gpt-tiny" and saved.workload["seq_len"] == SEQ_LEN
    assert INTERRUPTED in (out / "probes.csv").read_text()
    # the Ctrl-C handler is Python's own again, and the stop is forgotten
    assert interrupted.handler_after is signal.default_int_handler
    assert interrupted.stopped_after is None
    assert "Ctrl-C: ending with what was measured (Ctrl-C again abandons it)" in interrupted.said


def test_the_rows_before_the_ctrl_c_are_kept_and_those_it_cut_short_say_so(
    interrupted: Interrupted,
) -> None:
    probes = load_profile(interrupted.out).probes
    before = interrupted.before
    assert list(probes[: len(before)]) == before  # unchanged
    assert PLANTED in probes[: len(before)]
    core = [r for r in before if r.status == "ok"]
    assert any(r.probe == "memory" for r in core), before
    assert any(r.probe == "throughput" for r in core), before
    after = probes[len(before) :]
    cut = [r for r in after if r.reason == INTERRUPTED]
    assert cut, after  # the refinements and the phases after them had no time
    assert all(r.status == "skipped" for r in cut), cut
    # What the stop did not cause keeps its own reason (the communication probe turned off),
    # and no row after it blames the budget or a stopped child/trace in other words.
    own = [r for r in after if r.status != "ok" and r.reason != INTERRUPTED]
    assert all("budget" not in r.reason and INTERRUPTED not in r.reason for r in own), own
    assert any(r.probe == "communication" for r in own), own
    assert interrupted_probes(probes) == len(cut) + sum(r.reason == INTERRUPTED for r in before)


def test_the_core_it_measured_is_fitted(interrupted: Interrupted) -> None:
    saved = load_profile(interrupted.out)
    fp32 = ("fp32", "none")
    assert fp32 in {(m.precision, m.activation_checkpointing) for m in saved.fits.memory}
    assert fp32 in {(t.precision, t.activation_checkpointing) for t in saved.fits.time}


def test_recommend_plans_from_it_and_says_it_was_cut_short(
    interrupted: Interrupted, tmp_path: Path
) -> None:
    from advisor.recommending import recommend
    from strategies.space import SearchRequest

    said: list[str] = []
    plan = recommend(
        interrupted.out,
        SearchRequest(global_batch_size=8),
        validate_top_k=0,
        out=tmp_path / "plan",
        progress=said.append,
    )
    assert plan.candidate is not None and plan.candidate.precision == "fp32"
    cut = interrupted_probes(interrupted.error.profile.probes)
    notes = [m for m in said if m.startswith("note: Ctrl-C stopped this profile")]
    assert len(notes) == 1 and f"({cut} probes cut short)" in notes[0], said


def test_advisor_run_resumed_profiles_again(interrupted: Interrupted, tmp_path: Path) -> None:
    from advisor.run import RunRequest, reusable_profile
    from profilers.rundir import RunDir

    request = RunRequest(**{k: getattr(REQUEST, k) for k in RUN_FIELDS})
    assert RunDir(interrupted.out).profile.is_file()
    assert reusable_profile(interrupted.out, request) is False
    # the same profile with nothing cut short is reused (the workload is the request's)
    finished = tmp_path / "finished"
    finished.mkdir()
    data = json.loads(RunDir(interrupted.out).profile.read_text())
    for row in data["probes"]:
        if row["reason"] == INTERRUPTED:
            row["reason"] = "time budget spent"
    RunDir(finished).profile.write_text(json.dumps(data))
    shutil.copy(RunDir(interrupted.out).probes, RunDir(finished).probes)
    assert data["fits"]["time"], "the fixture's core timed nothing (a profile that priced no "
    "step is profiled again: tests/advisor/test_run_lifecycle2.py)"
    assert reusable_profile(finished, request) is True


# -- the command line ----------------------------------------------------------------------------


def _cut_short() -> Profile:
    profile = hand_profile()
    row = ProbeRow(probe="throughput", name="fp32/none/b=2", status="skipped", reason=INTERRUPTED)
    return dataclasses.replace(profile, probes=(row,))


@pytest.fixture
def profile_stopped_by_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """advisor.profiling.profile as it ends on Ctrl-C: the profile saved, then the interrupt."""
    import advisor.profiling

    outs: list[Path] = []

    def stopped_by_ctrl_c(request: ProfileRequest, out: Path, progress: object = None) -> None:
        error = ProfileInterrupted(_cut_short())
        error.profile.save(out)
        error.saved_to = out
        outs.append(out)
        raise error

    monkeypatch.setattr(advisor.profiling, "profile", stopped_by_ctrl_c)
    return outs


def test_advisor_profile_names_the_profile_it_kept(
    tmp_path: Path, profile_stopped_by_ctrl_c: list[Path]
) -> None:
    out = tmp_path / "out"
    line = one_line(invoke("profile", "--out", str(out), "--quiet"), 130)
    assert profile_stopped_by_ctrl_c == [out]
    assert line.startswith("error: interrupted (Ctrl-C): ")
    assert f"what was measured is saved in {out}/profile.json" in line
    assert "recommend can plan from it" in line and "nothing was saved" not in line


def test_advisor_profile_stopped_before_anything_was_kept_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import advisor.profiling

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(advisor.profiling, "profile", ctrl_c)
    line = one_line(invoke("profile", "--out", str(tmp_path / "out"), "--quiet"), 130)
    assert line.startswith("error: interrupted (Ctrl-C): nothing was saved")
    assert "profile.json" not in line


def test_advisor_run_stopped_in_its_profile_says_resume(
    tmp_path: Path, profile_stopped_by_ctrl_c: list[Path]
) -> None:
    """advisor run profiles again on --resume (reusable_profile): the profile's kept-files hint
    would send the user elsewhere."""
    out = tmp_path / "run"
    line = one_line(invoke("run", "--quiet", "--out", str(out)), 130)
    assert profile_stopped_by_ctrl_c  # it was the profile stage that was stopped
    assert "the same command plus --resume continues it" in line
    assert "profile.json" not in line
    stages = json.loads((out / "run.json").read_text())["stages"]
    assert stages["profile"]["detail"] == INTERRUPTED


# -- the plan --------------------------------------------------------------------------------------


def test_a_profile_cut_short_before_it_timed_anything_says_to_let_it_finish(
    tmp_path: Path,
) -> None:
    """No candidate can be priced (no step-time fit): the error says the Ctrl-C is why, not
    a larger --budget-s."""
    from advisor.recommending import recommend
    from strategies.cost import cost_model_from_profile
    from strategies.errors import StrategyError
    from strategies.space import SearchRequest

    cut = _cut_short()
    untimed = dataclasses.replace(cut, fits=dataclasses.replace(cut.fits, time=()))
    assert cost_model_from_profile(untimed, 0.9).interrupted_probes == 1
    said: list[str] = []
    with pytest.raises(StrategyError) as info:
        recommend(
            untimed,
            SearchRequest(global_batch_size=8),
            validate_top_k=0,
            out=tmp_path / "cut",
            progress=said.append,
        )
    message = str(info.value)
    assert message.startswith("no candidate could be predicted from this profile: Ctrl-C")
    assert "(1 probes cut short" in message
    assert "run 'advisor profile' again and let it finish" in message
    assert any(m.startswith("note: Ctrl-C stopped this profile") for m in said), said
    # the same profile, finished: the missing fit is named, no word of Ctrl-C
    finished = dataclasses.replace(untimed, probes=())
    with pytest.raises(StrategyError) as info:
        recommend(
            finished, SearchRequest(global_batch_size=8), validate_top_k=0, out=tmp_path / "done"
        )
    assert "Ctrl-C" not in str(info.value) and "step-time fit" in str(info.value)


def test_a_what_if_counts_the_probes_cut_short_too() -> None:
    from strategies.space import SearchRequest
    from strategies.whatif import whatif_cost_model

    model, _label = whatif_cost_model(
        _cut_short(), SearchRequest(global_batch_size=8, target="h100-80gb")
    )
    assert model.interrupted_probes == 1
