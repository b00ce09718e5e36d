"""Failed stages of ``advisor run``: what the page says when a stage failed.

run.json keeps each stage's status and, for a failed one, its one-line error (which names the
fix, as every error of the tool does). A failed stage's section says so — the error, then how
to continue the run — instead of the "not yet: run …" advice of a stage that never ran, which
would only fail the same way again. The sections that need the failed stage's output say where
to look.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from reports.model import Section
from reports.runfiles import RunFiles, is_interruption

# stage → (how the page names it, the section it fills, the sections that need its output)
STAGE_SECTIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "profile": ("Profiling", "facts", ("summary", "memory", "candidates", "validation")),
    "recommend": ("Recommendation", "summary", ("memory", "candidates", "validation", "training")),
    # advisor run --tune-trials: training waits for the tuned plan (until 2026-12-07 a stopped
    # tune stage showed only in the header, and Training said to train the untuned plan).
    "tune": ("Tuning", "tuning", ("training",)),
    "train": ("Training", "training", ()),
}
RESUME_FLAG = "--resume"


@dataclass(frozen=True, kw_only=True, slots=True)
class StageFailure:
    stage: str  # profile | recommend | tune | train
    message: str  # the stage's one-line error, as run.json keeps it, or "interrupted (SIGTERM)"
    fix: str  # how to continue the run once the cause is fixed

    @property
    def interrupted(self) -> bool:
        """Ctrl-C or SIGTERM stopped the stage: it did not fail."""
        return is_interruption(self.message)

    @property
    def outcome(self) -> str:
        """What happened to the stage, for the page's header and pointers."""
        return self.message if self.interrupted else "failed"

    @property
    def headline(self) -> str:
        """``Recommendation failed: <message>`` (the message alone when it says so itself);
        ``Training was interrupted (SIGTERM)`` for a stage a signal stopped."""
        title = STAGE_SECTIONS[self.stage][0]
        if self.interrupted:
            return f"{title} was {self.message}"
        if self.message.lower().startswith(f"{title.lower()} failed"):
            return self.message[:1].upper() + self.message[1:]
        return f"{title} failed: {self.message}"

    @property
    def note(self) -> str:
        return f"{self.headline.rstrip('.')}. {self.fix}"


def resume_command(run: RunFiles) -> str:
    """The run's own ``advisor run`` command plus --resume (finished stages are reused)."""
    recorded = (run.run_info or {}).get("command")
    if isinstance(recorded, list) and recorded:
        argv = [str(a) for a in recorded]
    else:
        argv = ["advisor", "run", "--out", str(run.root)]
    if RESUME_FLAG not in argv:
        argv.append(RESUME_FLAG)
    return shlex.join(argv)


def stage_failures(run: RunFiles) -> tuple[StageFailure, ...]:
    """The failed stages of the run, in run order."""
    fix = (
        "Fix what the message names (change the flag it points to, if any), then continue "
        f"this run; the stages that finished are reused: {resume_command(run)}"
    )
    go_on = f"Continue this run; the stages that finished are reused: {resume_command(run)}"
    return tuple(
        StageFailure(stage=stage, message=message, fix=go_on if is_interruption(message) else fix)
        for stage, message in run.failed_stages.items()
        if stage in STAGE_SECTIONS
    )


def with_failure_notes(
    sections: Sequence[Section], failures: Sequence[StageFailure]
) -> tuple[Section, ...]:
    """The sections with each failure's note: the full one in the failed stage's own section,
    a pointer to it in the sections that wait for its output (where they have nothing to show)."""
    notes: dict[str, str] = {}
    pointers: dict[str, str] = {}
    for failure in failures:
        _, own, waiting = STAGE_SECTIONS[failure.stage]
        notes[own] = failure.note
        for section_id in waiting:
            where = _title(sections, own)
            pointers.setdefault(
                section_id,
                f"Nothing to show: the {failure.stage} stage of this run was {failure.outcome}; "
                f"see {where}."
                if failure.interrupted
                else f"Nothing to show: the {failure.stage} stage of this run failed "
                f"(see {where}).",
            )
    out = []
    for section in sections:
        if section.id in notes:
            section = dataclasses.replace(section, note=notes[section.id])
        elif section.id in pointers and section.note:
            section = dataclasses.replace(section, note=pointers[section.id])
        out.append(section)
    return tuple(out)


def _title(sections: Sequence[Section], section_id: str) -> str:
    return next((s.title for s in sections if s.id == section_id), section_id)
