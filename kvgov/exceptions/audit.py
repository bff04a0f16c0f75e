"""Errors of the audit trail (``kvgov.audit``).

Import them from :mod:`kvgov.exceptions`, never from here.
"""

from __future__ import annotations

from kvgov.exceptions.base import KVGovError


class AuditError(KVGovError):
    """Root of errors raised by the audit trail (``audit``)."""


class AuditUnavailable(AuditError):
    """Neither the audit database nor the local spool can be written.

    Operations that must be audited refuse to proceed: nothing happens unaudited.

    Args:
        reason: why writing failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"audit trail unavailable ({reason}); the operation was refused because it "
            "could not be audited. Check the audit database and the spool directory."
        )


class AuditSchemaError(AuditError):
    """The audit database is not at the schema revision this kvgov needs.

    Args:
        url: the database URL (password masked).
        current: the revision found (None for an empty database).
        head: the revision required.
    """

    def __init__(self, url: str, current: str | None, head: str) -> None:
        self.url = url
        self.current = current
        self.head = head
        super().__init__(
            f"audit database {url} is at revision {current or 'none'}, this kvgov needs "
            f"{head}: run `kvgov db upgrade {url}`"
        )


class AuditDatabaseMissing(AuditError):
    """A reader was pointed at a SQLite audit file that does not exist (none is created).

    Args:
        url: the database URL (password masked).
        path: the missing file.
    """

    def __init__(self, url: str, path: str) -> None:
        self.url = url
        self.path = path
        super().__init__(
            f"no audit database at {path} (from {url}); check the path in the URL, or "
            f"create the database with `kvgov db upgrade {url}`"
        )


class AuditWalIndexMissing(AuditDatabaseMissing):
    """A SQLite audit file has a ``-wal`` file but no ``-shm`` index beside it.

    A reader opens the trail read-only and writes nothing, so it cannot build the
    index SQLite needs to read the events the write-ahead log holds (a copy that left
    ``-shm`` out, or one deleted by hand).

    Args:
        url: the database URL (password masked).
        path: the database file.
    """

    def __init__(self, url: str, path: str) -> None:
        AuditError.__init__(
            self,
            f"{path}-wal exists without {path}-shm (from {url}): a read-only command "
            "writes nothing, so it cannot rebuild the index that reading the write-ahead "
            "log needs; copy the database with its -wal file to a folder you can write "
            "and run the command on the copy, or open it once with a writer "
            f"(`kvgov db upgrade {url}`)",
        )
        self.url = url
        self.path = path


class AuditTrailEmpty(AuditError):
    """A command that reports on the audit trail found no event in it.

    Args:
        url: the database URL (password masked).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(
            f"the audit trail in {url} holds no events; check that the URL names the "
            "database your writers use, or pass --allow-empty if an empty trail is expected"
        )


class MalformedAuditRow(AuditError):
    """A stored event has a column of the wrong type or shape: it was edited in the database.

    The queries and exports stop at it rather than print a guess; ``kvgov audit
    verify`` names every such row (``wrong_type``, ``hash_mismatch``).

    Args:
        where: the event (``stream:seq``) or, where the database driver refused the
            row before kvgov saw it, the last event read before it.
        reason: what is wrong with it.
    """

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(
            f"the audit trail holds a malformed event ({where}: {reason}); it was edited "
            "outside kvgov: run `kvgov audit verify` on the same database"
        )


class InvalidTimeBound(AuditError, ValueError):
    """A query's time bound (``since`` / ``until``) is not an unambiguous instant.

    Args:
        name: the parameter, ``since`` or ``until``.
        value: what was given.
        reason: what is wrong and what to give instead.
    """

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"{name}={value!r}: {reason}")


class AuditMigrationRefused(AuditError):
    """A schema migration was refused before it changed anything.

    Args:
        reason: why, and what to do.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class AuditDowngradeRefused(AuditMigrationRefused):
    """A schema downgrade would leave stored audit events unverifiable; nothing was changed.

    Args:
        revision: the revision that refused to be undone.
        reason: why, and what to do instead.
    """

    def __init__(self, revision: str, reason: str) -> None:
        super().__init__(f"audit schema downgrade below {revision} refused: {reason}")
        self.revision = revision
        self.reason = reason


class InvalidAuditUrl(AuditError, ValueError):
    """An audit database URL that cannot be parsed, or names a database kvgov does not support.

    Args:
        url: the URL as given, with any password replaced by ``***``.
        reason: what is wrong and what is accepted.
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"invalid audit_url {url!r}: {reason}")


class SigningKeyError(AuditError):
    """A checkpoint signing key could not be loaded or is of the wrong type.

    Args:
        reason: what is wrong and where the key was looked for.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"signing key: {reason}")


class ExpectedStreamsError(AuditError):
    """A signed list of expected streams cannot be used.

    Args:
        path: the list's file.
        reason: what is wrong and what to do.
        tampered: True when the file reads but its signature does not verify or its
            signer is not trusted (evidence that it was altered), False when it cannot
            be read or parsed (a usage mistake).
    """

    def __init__(self, path: str, reason: str, *, tampered: bool = False) -> None:
        self.path = path
        self.reason = reason
        self.tampered = tampered
        super().__init__(f"expected-streams list {path}: {reason}")


class InvalidAuditEvent(AuditError, ValueError):
    """An audit event is malformed or would store tokens or text (which are never audited).

    Args:
        field: the offending field (``details`` for anything inside it).
        reason: what is wrong and what to do instead.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"invalid audit event {field}: {reason}")


class InvalidFleetOrder(AuditError, ValueError):
    """A fleet order is malformed: an unknown kind, a missing or wrong argument.

    Args:
        reason: what is wrong and what to give instead. Nothing was written.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"fleet order: {reason}")


class FleetUnavailable(AuditError):
    """The fleet's database (the audit database) cannot be reached now.

    Orders are durable rows: an order that was written stays; one that was not can
    be issued again. An engine retries on its own thread; no step waits for it.

    Args:
        url: the database URL (password hidden).
        reason: the driver's error.
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"fleet database {url} unavailable: {reason}")
