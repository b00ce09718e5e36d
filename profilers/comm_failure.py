"""Why a launch of the communication probe failed: find the root-cause rank and its message.

When one rank dies its peers fail too ("connection closed by peer"), often within the same
second, and the launcher's ``ChildFailedError`` reports whichever exit it noticed first. So we
read every rank's own record from the launcher's log directory (``DefaultLogsSpecs`` layout:
``<log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{error.json,stderr.log}``) and prefer a
rank whose message is not "my peer went away", then the earliest error file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What a collective raises in a rank that failed only because a peer did (a peer's timeout is a
# timeout), lower case: gloo's "Connection closed by peer [remote worker]", "Connection reset",
# "Broken pipe", NCCL's "communicator was aborted". The probe's diagnosis, the launcher's and a
# launched rank's exit all read these words.
PEER_GONE_MARKERS = (
    "connection closed by peer",
    "remote worker",
    "connection reset",
    "broken pipe",
    "was aborted",
)


def lost_a_peer(text: str) -> bool:
    """Does a rank's error ``text`` say only that another rank went away?"""
    lowered = text.lower()
    return any(marker in lowered for marker in PEER_GONE_MARKERS)


# What the launcher writes when a rank left no error file (killed, os._exit, faulthandler).
_PLACEHOLDERS = ("<N/A>", "<NONE>", "To enable traceback")
# faulthandler.dump_traceback_later's banner: the rank hit its hard deadline.
_HARD_DEADLINE_BANNER = "Timeout ("


@dataclass(frozen=True, kw_only=True, slots=True)
class _RankFailure:
    rank: int
    text: str
    when: float
    exitcode: int | None
    timed_out: bool

    @property
    def secondary(self) -> bool:
        return not self.timed_out and lost_a_peer(self.text)


def diagnose_failure(error: Any, log_dir: Path) -> tuple[str, str]:
    """(status ``error``|``timeout``, one-line reason) for a ``ChildFailedError``."""
    reported: dict[int, Any] = dict(error.failures)
    ranks = set(reported) | {int(p.parent.name) for p in log_dir.glob("*/attempt_*/*/error.json")}
    failures = [f for f in (_rank_failure(log_dir, r, reported.get(r)) for r in ranks) if f]
    if not failures:
        return "error", "the launcher reported a failure but no rank left a record"
    root = min(failures, key=lambda f: (f.secondary, f.when, f.rank))
    exit_part = f" (exit code {root.exitcode})" if root.exitcode is not None else ""
    reason = f"rank {root.rank} failed{exit_part}: {root.text}"
    if len(failures) > 1:
        reason += f" [{len(failures)} ranks failed]"
    return ("timeout" if root.timed_out else "error"), reason[:500]


def _rank_failure(log_dir: Path, rank: int, reported: Any | None) -> _RankFailure | None:
    rank_dirs = sorted(log_dir.glob(f"*/attempt_*/{rank}"))
    rank_dir = rank_dirs[-1] if rank_dirs else None
    stderr_tail = _tail(rank_dir / "stderr.log") if rank_dir else ""
    exitcode = reported.exitcode if reported is not None else None
    if _HARD_DEADLINE_BANNER in stderr_tail:
        text = "rank exceeded its hard deadline and was stopped (stack dump in its log)"
        return _RankFailure(rank=rank, text=text, when=0.0, exitcode=exitcode, timed_out=True)
    error_file = rank_dir / "error.json" if rank_dir else None
    if error_file is not None and error_file.is_file():
        text = _error_file_message(error_file)
        when = error_file.stat().st_mtime
        return _RankFailure(
            rank=rank, text=text, when=when, exitcode=exitcode, timed_out=_is_timeout(text)
        )
    if reported is None:
        return None  # stopped by the launcher after another rank failed: not a cause
    message = reported.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "")
    if not text or text.startswith(_PLACEHOLDERS):
        lines = stderr_tail.strip().splitlines()
        text = lines[-1] if lines else "no message"
    return _RankFailure(
        rank=rank,
        text=text,
        when=float(reported.timestamp),
        exitcode=exitcode,
        timed_out=_is_timeout(text),
    )


def _is_timeout(text: str) -> bool:
    """A collective that ran past the process group's timeout (gloo and NCCL wordings)."""
    lowered = text.lower()
    return "timed out" in lowered or "timeout" in lowered


def _error_file_message(path: Path) -> str:
    try:
        data = json.loads(path.read_text(errors="replace"))
        message = data.get("message", "")
        if isinstance(message, dict):
            message = message.get("message", "")
        return str(message) or "no message"
    except (OSError, ValueError, AttributeError):
        return "unreadable error file"


def _tail(path: Path, num_chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-num_chars:]
    except OSError:
        return ""
