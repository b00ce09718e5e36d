"""Why a launch of the communication probe failed: the root-cause rank, not its echoes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from profilers.comm_failure import PEER_GONE_MARKERS, diagnose_failure, lost_a_peer


@dataclass
class _Reported:
    """A ``torch.distributed.elastic`` ``ProcessFailure`` as the launcher reports it."""

    exitcode: int
    message: object
    timestamp: int


@dataclass
class _ChildFailed:
    failures: dict[int, _Reported]


def _rank_dir(log_dir: Path, rank: int) -> Path:
    directory = log_dir / "run_abc123" / "attempt_0" / str(rank)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _error_file(log_dir: Path, rank: int, message: str, mtime: float) -> None:
    path = _rank_dir(log_dir, rank) / "error.json"
    path.write_text(json.dumps({"message": {"message": message}}))
    os.utime(path, (mtime, mtime))


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]",
        "Connection reset by peer",
        "[Errno 32] Broken pipe",
        "NCCL communicator was aborted on rank 1",
        "Read error [remote worker]",
    ],
)
def test_the_words_of_a_rank_whose_peer_went_away(text: str) -> None:
    assert lost_a_peer(text) and lost_a_peer(text.upper())


@pytest.mark.parametrize(
    "text", ["CUDA out of memory", "ValueError: bad shape", "Connection refused", ""]
)
def test_a_rank_that_failed_on_its_own(text: str) -> None:
    assert not lost_a_peer(text)


def test_markers_are_lower_case() -> None:  # lost_a_peer lowers the text, not the markers
    assert all(marker == marker.lower() for marker in PEER_GONE_MARKERS)


def test_the_cause_is_named_not_the_peer_that_failed_first(tmp_path: Path) -> None:
    # rank 0 wrote its "peer went away" first; rank 1, the cause, a second later
    _error_file(tmp_path, 0, "RuntimeError: Connection closed by peer [remote worker]", 100.0)
    _error_file(tmp_path, 1, "torch.OutOfMemoryError: CUDA out of memory", 101.0)
    error = _ChildFailed({0: _Reported(1, "<N/A>", 100), 1: _Reported(1, "<N/A>", 101)})
    status, reason = diagnose_failure(error, tmp_path)
    assert status == "error"
    assert reason == (
        "rank 1 failed (exit code 1): torch.OutOfMemoryError: CUDA out of memory [2 ranks failed]"
    )


def test_a_timeout_is_a_timeout_even_beside_a_lost_peer(tmp_path: Path) -> None:
    _error_file(tmp_path, 0, "Connection reset by peer", 100.0)
    _error_file(tmp_path, 1, "RuntimeError: Wait timeout after 30000ms", 100.0)
    error = _ChildFailed({0: _Reported(1, "<N/A>", 100), 1: _Reported(1, "<N/A>", 100)})
    status, reason = diagnose_failure(error, tmp_path)
    assert status == "timeout" and reason.startswith("rank 1 failed (exit code 1): ")


def test_a_rank_past_its_hard_deadline(tmp_path: Path) -> None:
    (_rank_dir(tmp_path, 0) / "stderr.log").write_text("Timeout (0:00:30)!\nThread 0x1 ...\n")
    status, reason = diagnose_failure(_ChildFailed({0: _Reported(-6, "<N/A>", 5)}), tmp_path)
    assert status == "timeout"
    assert reason == (
        "rank 0 failed (exit code -6): rank exceeded its hard deadline and was stopped "
        "(stack dump in its log)"
    )


def test_a_rank_without_an_error_file_is_read_from_its_stderr(tmp_path: Path) -> None:
    (_rank_dir(tmp_path, 0) / "stderr.log").write_text("starting\nSegmentation fault\n")
    status, reason = diagnose_failure(_ChildFailed({0: _Reported(-11, "<N/A>", 5)}), tmp_path)
    assert (status, reason) == ("error", "rank 0 failed (exit code -11): Segmentation fault")


def test_no_record_at_all(tmp_path: Path) -> None:
    status, reason = diagnose_failure(_ChildFailed({}), tmp_path)
    assert status == "error"
    assert reason == "the launcher reported a failure but no rank left a record"
