"""Errors the user can fix. The CLI prints their message as one line and exits 2 (bad usage) or 1.

Library code raises these with a message that names the problem *and* the fix; it never prints.
"""

from __future__ import annotations

from profilers.workload import ModelContractError


def one_line(exc: BaseException) -> str:
    """``Type: message`` with the message's whitespace (newlines included) collapsed."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class AdvisorError(Exception):
    """A failure the user can act on; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class UsageProblem(AdvisorError):
    """Bad input: unknown spec, missing file, impossible sizes, unsupported precision ..."""

    exit_code = 2


class ModelContractViolation(UsageProblem, ModelContractError):
    """The user's model returns what cannot be trained on (its forward's contract)."""


class AdvisorNote(UserWarning):
    """A note about a run the Python API's caller must see (the CLI prints it as ``note: ...``
    whatever --quiet says): a data set the run repeats, a warm-up as long as the run ...
    ``warnings.simplefilter("ignore", advisor.errors.AdvisorNote)`` silences them."""


class TrainingDiverged(AdvisorError):
    """Loss became NaN/inf; the last good checkpoint is kept."""

    exit_code = 1
