"""``advisor``: the command line. Thin: each command parses options, builds a config, calls one
library function, and turns the library's errors into one line and an exit code.

Importing this package must not import torch (``advisor --help`` stays instant): heavy imports
live inside the command functions.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

import click

from advisor.version import __version__


def _fail(message: str, code: int) -> None:
    from advisor.launch import launched_rank, write_rank_error

    write_rank_error(message)  # a rank of a distributed job: tell the launcher why
    if not launched_rank():  # (advisor's own launcher prints it once, for every rank)
        click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _lost_a_peer(exc: BaseException) -> bool:
    """Is ``exc`` a collective failing because another rank died, in a rank our launcher
    started (ranks started by hand keep their traceback)?"""
    from advisor.launch import launched_rank
    from profilers.comm_failure import lost_a_peer

    return launched_rank() and lost_a_peer(str(exc))


def _report_to_launcher(exc: BaseException) -> None:
    from advisor.errors import one_line
    from advisor.launch import write_rank_error

    write_rank_error(one_line(exc))


# What a Ctrl-C leaves, per command, and how to go on.
_INTERRUPTED = {
    "run": "the run directory keeps the stages that finished and the report of what it has; "
    "the same command plus --resume continues it",
    "recommend": "the search's trials so far are kept in its study; the same command continues it",
    "tune": "the trials so far are kept in its study; the same command continues it",
    "train": "the same command plus --resume continues from the last checkpoint saved (from "
    "step 0 if none was)",
    "profile": "nothing was saved (Ctrl-C came before the probes, or a second one abandoned "
    "them); run it again (--budget-s bounds how long it takes)",
}
# A profile stopped by Ctrl-C ends with what it measured (profilers.stopping).
_KEPT_PROFILE = (
    "what was measured is saved in {out}/profile.json (probes.csv marks the probes it cut "
    "short as skipped, 'interrupted (Ctrl-C)'); recommend can plan from it, and the same "
    "command again measures everything"
)

# A path that cannot be used as named (bad usage); other OSErrors (a full disk) fail the job.
_PATH_PROBLEMS = (
    FileExistsError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


def _command_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    argv = kwargs.get("args", args[0] if args else None)
    argv = sys.argv[1:] if argv is None else list(argv)
    return next((a for a in argv if not a.startswith("-")), "")


def _signum(exc: BaseException) -> int:
    """The signal that stopped the command: SIGTERM for advisor.run.Terminated (possibly as
    the cause of click's Abort), else SIGINT (Ctrl-C)."""
    for e in (exc, exc.__cause__):
        if getattr(e, "signum", None) == signal.SIGTERM:
            return int(signal.SIGTERM)
    return int(signal.SIGINT)


def _interrupt_code(exc: BaseException) -> int:
    return 128 + _signum(exc)


def _interrupted(command: str, exc: BaseException) -> str:
    saved = getattr(exc, "saved_to", None) or getattr(exc.__cause__, "saved_to", None)
    if command == "profile" and saved:
        hint: str | None = _KEPT_PROFILE.format(out=saved)
    else:  # advisor run profiles again on --resume (advisor.run.reusable_profile)
        hint = _INTERRUPTED.get(command)
    how = "SIGTERM" if _signum(exc) == signal.SIGTERM else "Ctrl-C"
    return f"interrupted ({how}): {hint}" if hint else f"interrupted ({how})"


def _ended_early(exc: EOFError) -> str:
    reason = " ".join(str(exc).split()) or "end of file"
    return (
        f"a file ended before its data did (EOFError: {reason}): a damaged or partly written "
        "file among those the command read; write it again or name another"
    )


def _cannot_use_path(exc: OSError) -> str:
    """One line for a path the command could not read or write, naming the fix."""
    # A rename into place names the staged file first and the destination, the user's, second
    path = exc.filename if exc.filename2 is None else exc.filename2
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        fix = "a file is in the way of a directory it needs: choose another --out"
    elif isinstance(exc, IsADirectoryError):
        fix = "it is a directory: name a file, or choose another --out"
    elif isinstance(exc, PermissionError):
        fix = "choose a path you can write, or fix its permissions"
    elif isinstance(exc, FileNotFoundError):
        fix = "check the path (its parent directory must exist or be creatable)"
    else:
        fix = "free space or choose another --out"
    return f"cannot use {path}: {reason}: {fix}"


class _Stopped(BaseException):
    """A Ctrl-C (KeyboardInterrupt) or an EOFError carried past click's ``Command.main``, which
    wrote a blank line on stderr before raising either again as Abort: the one-line error
    came second, after an empty line."""

    def __init__(self, original: KeyboardInterrupt | EOFError) -> None:
        super().__init__()
        self.original = original


@contextlib.contextmanager
def _carried() -> Iterator[None]:
    try:
        yield
    except (KeyboardInterrupt, EOFError) as exc:
        raise _Stopped(exc) from exc


def _stopped(command: str, exc: KeyboardInterrupt | EOFError) -> None:
    """The one line of a command stopped by Ctrl-C, SIGTERM or an EOFError."""
    from advisor.launch import launched_rank

    if isinstance(exc, EOFError):
        _fail(_ended_early(exc), 1)
    if _signum(exc) == signal.SIGINT and not launched_rank() and _is_terminal(sys.stderr):
        # A terminal echoed "^C" where its cursor was: the error goes on the next line, not
        # after it (a pipe or a file gets the one line alone).
        click.echo(err=True)
    _fail(_interrupted(command, exc), _interrupt_code(exc))


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class AdvisorGroup(click.Group):
    """Every failure is one line on stderr: exit 2 for bad usage, 1 for a failed job."""

    # Ctrl-C or an EOFError while the arguments are parsed or the command runs: carried to
    # main() past click's own handler (its blank line), see _Stopped.
    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _carried():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _carried():
            return super().invoke(ctx)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """In the order they were added (the README's Commands table), not alphabetically."""
        return list(self.commands)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        from advisor.errors import AdvisorError

        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except _Stopped as stopped:
            _stopped(_command_name(args, kwargs), stopped.original)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(2)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            _fail(exc.format_message() + hint, 2)
        except click.exceptions.Abort as exc:  # Ctrl-C: click makes KeyboardInterrupt Abort
            if isinstance(exc.__context__, EOFError):
                # ... and any EOFError (a file read ended early: an empty extra.pt of a
                # checkpoint read as "interrupted (Ctrl-C)", exit 130).
                _fail(_ended_early(exc.__context__), 1)
            _fail(_interrupted(_command_name(args, kwargs), exc), _interrupt_code(exc))
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except AdvisorError as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt as exc:
            _fail(_interrupted(_command_name(args, kwargs), exc), _interrupt_code(exc))
        except OSError as exc:
            if exc.filename is None:  # not about a path the user named: keep the traceback
                _report_to_launcher(exc)
                raise
            _fail(_cannot_use_path(exc), 2 if isinstance(exc, _PATH_PROBLEMS) else 1)
        except ValueError as exc:
            # Config records (strategies.ConfigError) validate at construction with a fix;
            # a search or prediction the input does not allow (StrategyError) names the knob.
            from strategies.config import ConfigError
            from strategies.errors import StrategyError

            if isinstance(exc, (ConfigError, StrategyError)):
                _fail(str(exc), 2)
            _report_to_launcher(exc)
            raise
        except Exception as exc:  # a bug or a user model's own error: keep the traceback
            _report_to_launcher(exc)
            if _lost_a_peer(exc):
                # A rank whose peer died (killed, out of memory): the launcher names the rank
                # that failed first and why; this one's 50-line gloo/NCCL traceback said nothing.
                sys.exit(1)
            raise
        sys.exit(code or 0)


@click.group(cls=AdvisorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="advisor")
def main() -> None:
    """Profile a Transformer, pick the fastest training config that fits at your global batch,
    train it, and explain the choice in one HTML report."""


def _register() -> None:
    from advisor.cli.export import export
    from advisor.cli.predict import predict
    from advisor.cli.profile import profile
    from advisor.cli.recommend import recommend
    from advisor.cli.report import report
    from advisor.cli.run import run
    from advisor.cli.train import train
    from advisor.cli.tune import tune

    # The README's Commands table's order: the main job first, then its steps as a run takes them.
    for command in (run, profile, recommend, tune, predict, train, report, export):
        main.add_command(command)


_register()
