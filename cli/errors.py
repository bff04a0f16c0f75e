"""How the ``kvgov`` commands fail: one line saying what to do, and an exit status by kind.

=====  ===================  =====================================================
 exit  kind                 examples
=====  ===================  =====================================================
 0     success              ``verify`` found nothing wrong
 1     evidence failure     ``verify`` found tampering; a signed streams list does
                            not verify; quarantined records are still refused;
                            the trail holds no events (without ``--allow-empty``)
 2     usage error          a bad option, a URL that is not a database URL, an
                            unreadable or wrong key file, a bad revision; a
                            downgrade without a target or that would drop rows
 3     environment error    the database is unreachable, refuses the login or a
                            permission, lacks the schema; a SQLite file does not
                            exist (readers never create one); a file cannot be read
=====  ===================  =====================================================

:class:`ErrorsToExitCodes` is the ``click.Group`` class of ``kvgov`` and of its
``audit`` and ``db`` groups: it turns every error it knows into a
:class:`CommandError` (printed as ``error: <what happened>; <what to do>``); an error
it does not know is a bug and keeps its traceback.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import IO, Any, Final

import click
from alembic.util.exc import CommandError as AlembicCommandError
from sqlalchemy import exc as sa_exc

from kvgov.exceptions import (
    AuditDatabaseMissing,
    AuditSchemaError,
    AuditTrailEmpty,
    AuditUnavailable,
    ExpectedStreamsError,
    FleetUnavailable,
    KVGovError,
    MalformedAuditRow,
)

__all__ = [
    "EXIT_ENVIRONMENT",
    "EXIT_EVIDENCE",
    "EXIT_USAGE",
    "CommandError",
    "ErrorsToExitCodes",
    "explain",
]

#: Integrity evidence failed: tampering found, a signature that does not verify.
EXIT_EVIDENCE: Final = 1
#: The command was called wrongly: fix the arguments.
EXIT_USAGE: Final = 2
#: The environment is not as the command needs it: database, schema, permissions, files.
EXIT_ENVIRONMENT: Final = 3

_DB_WHAT_TO_DO: Final = (
    "check that the database server runs and is reachable from here and that the URL "
    "(--url or $KVGOV_AUDIT_URL) names it"
)


class CommandError(click.ClickException):
    """A command failure, printed as one ``error: ...`` line; its class sets the exit status.

    Build one with :meth:`of`.

    Args:
        message: what happened and what to do (whitespace is folded onto one line).
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    @staticmethod
    def of(message: str, exit_code: int) -> CommandError:
        """A command error with the given exit status.

        Args:
            message: what happened and what to do.
            exit_code: :data:`EXIT_EVIDENCE`, :data:`EXIT_USAGE` or :data:`EXIT_ENVIRONMENT`.

        Returns:
            The error.
        """
        cls = {EXIT_EVIDENCE: _EvidenceError, EXIT_ENVIRONMENT: _EnvironmentError}
        return cls.get(exit_code, _UsageError)(message)

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the one line to stderr."""
        click.echo(f"error: {self.format_message()}", file=file or sys.stderr)


class _EvidenceError(CommandError):
    exit_code = EXIT_EVIDENCE


class _UsageError(CommandError):
    exit_code = EXIT_USAGE


class _EnvironmentError(CommandError):
    exit_code = EXIT_ENVIRONMENT


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _database_error(exc: sa_exc.DBAPIError) -> CommandError:
    orig = exc.orig
    text = _first_line(orig) if orig is not None else _first_line(exc)
    sqlstate = getattr(orig, "sqlstate", None) or ""
    lowered = text.lower()
    if sqlstate == "42501" or "permission denied" in lowered or "readonly database" in lowered:
        return CommandError.of(
            f"the audit database refused a permission ({text}); grant this role SELECT on "
            "audit_events, audit_checkpoints and audit_keys (INSERT too for writers; "
            "see docs/audit.md)",
            EXIT_ENVIRONMENT,
        )
    if sqlstate == "42P01" or "no such table" in lowered:
        return CommandError.of(
            f"the audit schema is missing ({text}); run `kvgov db upgrade URL`",
            EXIT_ENVIRONMENT,
        )
    if sqlstate.startswith("28") or "authentication failed" in lowered:
        return CommandError.of(
            f"the audit database refused the login ({text}); check the user and password "
            "in the URL",
            EXIT_ENVIRONMENT,
        )
    if isinstance(orig, sqlite3.OperationalError) and "unable to open" in lowered:
        return CommandError.of(
            f"cannot open the SQLite audit file ({text}); check the path in the URL and "
            "that its directory exists and is readable",
            EXIT_ENVIRONMENT,
        )
    if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        return CommandError.of(
            f"cannot use the audit database ({text}); {_DB_WHAT_TO_DO}", EXIT_ENVIRONMENT
        )
    return CommandError.of(
        f"the audit database failed ({text}); check its logs and the schema revision "
        "(`kvgov db current`)",
        EXIT_ENVIRONMENT,
    )


def explain(exc: BaseException) -> CommandError | None:
    """Turn a known error into a :class:`CommandError`, or None for an unknown one (a bug).

    Args:
        exc: the error a command raised.

    Returns:
        The command error, or None.
    """
    if isinstance(exc, CommandError):
        return exc
    if isinstance(exc, (AuditTrailEmpty, MalformedAuditRow)):
        return CommandError.of(str(exc), EXIT_EVIDENCE)
    if isinstance(
        exc, (AuditSchemaError, AuditUnavailable, AuditDatabaseMissing, FleetUnavailable)
    ):
        return CommandError.of(str(exc), EXIT_ENVIRONMENT)
    if isinstance(exc, ExpectedStreamsError):
        return CommandError.of(str(exc), EXIT_EVIDENCE if exc.tampered else EXIT_USAGE)
    if isinstance(exc, KVGovError):
        return CommandError.of(str(exc), EXIT_USAGE)
    if isinstance(exc, (sa_exc.ArgumentError, sa_exc.NoSuchModuleError)):
        return CommandError.of(
            f"not an audit database URL ({_first_line(exc)}); give one such as "
            "sqlite:///kvgov-audit.db or postgresql://USER@HOST:5432/DB",
            EXIT_USAGE,
        )
    if isinstance(exc, sa_exc.DBAPIError):
        return _database_error(exc)
    if isinstance(exc, sa_exc.SQLAlchemyError):
        return CommandError.of(
            f"the audit database failed ({_first_line(exc)}); {_DB_WHAT_TO_DO}",
            EXIT_ENVIRONMENT,
        )
    if isinstance(exc, AlembicCommandError):
        return CommandError.of(
            f"{_first_line(exc)}; list the revisions with `kvgov db current`", EXIT_USAGE
        )
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        return CommandError.of(
            f"cannot read or write{where}: {exc.strerror or exc}; check the path and its "
            "permissions",
            EXIT_ENVIRONMENT,
        )
    return None


def _usage(exc: click.UsageError) -> CommandError:
    where = exc.ctx.command_path if exc.ctx is not None else "kvgov"
    message = exc.format_message().rstrip(".")
    return CommandError.of(f"{message}; see `{where} --help`", EXIT_USAGE)


class ErrorsToExitCodes(click.Group):
    """A command group whose commands fail with one clear line and a documented exit status."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Parse the group's own options; a usage error is one line too."""
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _usage(exc) from exc

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; turn known errors into :class:`CommandError`."""
        try:
            return super().invoke(ctx)
        except CommandError:
            raise
        except click.UsageError as exc:
            raise _usage(exc) from exc
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as exc:
            err = explain(exc)
            if err is None:
                raise
            raise err from exc
