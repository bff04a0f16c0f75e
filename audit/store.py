"""Engines and schema revisions of the audit store (SQLite or PostgreSQL).

``open_engine`` is the one door every reader and writer goes through: it creates the
engine (SQLite in WAL mode; ``postgresql://`` URLs use psycopg 3) and refuses a
database that is not at the Alembic head revision with
:class:`~kvgov.exceptions.AuditSchemaError`, telling the user to run
``kvgov db upgrade``. A SQLite database that is still empty (a new file), and the
default audit file, are created and upgraded automatically.

Migrations run programmatically from the installed ``migrations`` package, so no
``alembic.ini`` has to be found on disk.

Every wait on PostgreSQL is bounded on the server and on the wire: a connection
attempt by ``connect_timeout``; every statement by ``lock_timeout`` and, for the
writer, ``statement_timeout``; a dead peer (a partition without RST) by TCP
keepalives and ``tcp_user_timeout``. A server that is alive at the TCP level but does
not answer (a frozen process: its kernel still acknowledges) is bounded by none of
these; the writer bounds that on its own side (see :mod:`kvgov.audit.writer`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sqlite3
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, func, inspect, select, table
from sqlalchemy.engine import URL, make_url

from kvgov.defaults import AUDIT_LOCK_TIMEOUT_SECONDS, AUDIT_URL
from kvgov.exceptions import (
    AuditDatabaseMissing,
    AuditDowngradeRefused,
    AuditMigrationRefused,
    AuditSchemaError,
    AuditWalIndexMissing,
    InvalidAuditUrl,
)
from kvgov.secrecy import redact_url

__all__ = [
    "DowngradePlan",
    "current_revision",
    "downgrade",
    "head_revision",
    "mask_url",
    "normalize_url",
    "open_engine",
    "plan_downgrade",
    "require_database",
    "row_counts",
    "upgrade",
]

#: The migration that added ``audit_events.chain_format`` (chain format 2).
CHAIN_FORMAT_REVISION = "0004_chain_format"

#: Seconds a PostgreSQL connection attempt may take before the writer spools instead.
PG_CONNECT_TIMEOUT_SECONDS = 3
#: Seconds a PostgreSQL connection sits idle before TCP keepalive probes start.
PG_KEEPALIVE_IDLE_SECONDS = 5
#: Seconds between two keepalive probes.
PG_KEEPALIVE_INTERVAL_SECONDS = 2
#: Unanswered keepalive probes after which the connection is dead.
PG_KEEPALIVE_COUNT = 3
#: Milliseconds sent data may stay unacknowledged before the connection is dead.
PG_TCP_USER_TIMEOUT_MS = 10_000
#: Milliseconds a SQLite writer waits on a lock held by another writer.
SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalize_url(url: str | URL) -> URL:
    """Parse an audit URL; plain ``postgresql://`` means psycopg 3 (``postgresql+psycopg``).

    Args:
        url: a SQLAlchemy URL.

    Returns:
        The parsed URL.

    Raises:
        InvalidAuditUrl: not a URL, or not a SQLite or PostgreSQL one.
    """
    try:
        u = make_url(url)
    except Exception:  # sqlalchemy raises ArgumentError, ValueError or TypeError
        raise InvalidAuditUrl(redact_url(url), _URL_FORM) from None  # its text holds the URL
    if u.get_backend_name() not in ("sqlite", "postgresql", "postgres"):
        raise InvalidAuditUrl(redact_url(url), _URL_FORM)
    if "@" in (u.host or ""):  # "user:p@ss@host": the password's tail would be the host
        raise InvalidAuditUrl(redact_url(url), "its password holds an unescaped @: write it as %40")
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u


_URL_FORM = (
    "not an audit database URL; give one such as sqlite:///kvgov-audit.db or "
    "postgresql://USER@HOST:5432/DB"
)


def mask_url(url: str | URL) -> str:
    """Render an audit URL with every password hidden, for messages, logs and files.

    ``postgresql://`` is shown as ``postgresql+psycopg://`` (what is used); the
    redaction is :func:`kvgov.secrecy.redact_url`'s. Never raises.

    Args:
        url: the URL.

    Returns:
        The URL text with ``***`` for each secret.
    """
    try:
        return redact_url(normalize_url(url).render_as_string(hide_password=True))
    except InvalidAuditUrl:
        return redact_url(url)


def require_database(url: str | URL) -> None:
    """Refuse a SQLite URL whose file does not exist, before anything could create it.

    Readers call this so that a mistyped path fails instead of leaving an empty file.
    Other backends (and in-memory SQLite) pass: their server says if the database exists.

    Args:
        url: the database URL.

    Raises:
        AuditDatabaseMissing: the SQLite file does not exist.
    """
    u = normalize_url(url)
    name = _sqlite_file(u)
    if name is not None and not Path(name).is_file():
        raise AuditDatabaseMissing(mask_url(u), name)


def _sqlite_file(u: URL) -> str | None:
    """The file of a SQLite URL (None: not SQLite, or in memory)."""
    if u.get_backend_name() != "sqlite" or u.database in (None, "", ":memory:"):
        return None
    name = str(u.database)
    if name.startswith("file:"):  # a SQLite URI (?uri=true): its path ends at the query
        name = unquote(name.removeprefix("file:").split("?", 1)[0])
    return name


def _create_private(path: str | None) -> None:
    """Create a new SQLite file readable by its owner alone (the trail names tenants).

    SQLite gives the ``-wal`` and ``-shm`` files the mode of the database file, so
    the whole trail is 0600; an existing file keeps the mode its operator chose.
    """
    if path is None:
        return
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def _read_only_uri(path: str, url: str) -> str:
    """The SQLite URI that reads ``path`` without writing a byte, chosen at each connect.

    ``mode=ro`` alone is not enough in WAL mode: the reader still writes its read mark
    into ``-shm``, and creates ``-wal`` and ``-shm`` when they are absent. So:

    * ``-wal`` present (a writer is running, or died with committed pages in it):
      ``readonly_shm=1`` opens ``-shm`` read-only too; SQLite then reads the log
      through a private copy of the index and sees every committed event.
    * ``-wal`` absent: no connection has the file open, every event is in the file
      itself, which is read as ``immutable`` (no lock, no ``-wal``/``-shm`` created).
    """
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    if wal.exists():
        if not shm.exists():
            raise AuditWalIndexMissing(url, path)
        query = "mode=ro&readonly_shm=1"
    else:
        query = "mode=ro&immutable=1"
    return f"file:{quote(path)}?{query}"


def _read_only_sqlite_engine(u: URL, busy_ms: int) -> Engine:
    path = _sqlite_file(u)
    if path is None:  # in memory: nothing on disk to keep unchanged
        return create_engine(u, connect_args={"check_same_thread": False})
    require_database(u)
    masked = mask_url(u)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(_read_only_uri(path, masked), uri=True, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")
        conn.execute("PRAGMA query_only=1")
        return conn

    return create_engine("sqlite://", creator=connect)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, *, busy_ms: int) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute(f"PRAGMA busy_timeout={busy_ms}")
    cur.close()


def pg_connect_args(statement_timeout: float | None = None) -> dict[str, Any]:
    """libpq parameters that bound every wait of a PostgreSQL connection.

    Args:
        statement_timeout: seconds a statement may run (None: no limit, for readers
            such as ``verify`` whose scans are long by nature).

    Returns:
        Keyword arguments for ``psycopg.connect``.
    """
    options = f"-c lock_timeout={round(AUDIT_LOCK_TIMEOUT_SECONDS * 1000)}"
    if statement_timeout is not None:
        options += f" -c statement_timeout={max(1, round(statement_timeout * 1000))}"
    return {
        "connect_timeout": PG_CONNECT_TIMEOUT_SECONDS,
        "keepalives": 1,
        "keepalives_idle": PG_KEEPALIVE_IDLE_SECONDS,
        "keepalives_interval": PG_KEEPALIVE_INTERVAL_SECONDS,
        "keepalives_count": PG_KEEPALIVE_COUNT,
        "tcp_user_timeout": PG_TCP_USER_TIMEOUT_MS,
        "options": options,
    }


def create_audit_engine(
    url: str | URL, *, statement_timeout: float | None = None, read_only: bool = False
) -> Engine:
    """Create an engine tuned for the audit store (no schema check).

    Args:
        url: the database URL.
        statement_timeout: seconds one statement may run (PostgreSQL) or wait for a
            lock (SQLite, at most ``SQLITE_BUSY_TIMEOUT_MS``); None: no statement limit.
        read_only: a reader's engine: a SQLite file (which must exist) is opened so
            that neither it nor its ``-wal``/``-shm`` files change or appear, and the
            events committed to ``-wal`` are still seen.

    Returns:
        The engine.

    Raises:
        AuditDatabaseMissing: ``read_only`` and the SQLite file does not exist.
    """
    u = normalize_url(url)
    if u.get_backend_name() == "sqlite":
        busy_ms = SQLITE_BUSY_TIMEOUT_MS
        if statement_timeout is not None:
            busy_ms = min(busy_ms, max(1, round(statement_timeout * 1000)))
        if read_only:
            return _read_only_sqlite_engine(u, busy_ms)
        _create_private(_sqlite_file(u))
        engine = create_engine(u, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", functools.partial(_sqlite_pragmas, busy_ms=busy_ms))
        return engine
    connect_args: dict[str, Any] = {}
    if u.get_backend_name() == "postgresql":
        connect_args = pg_connect_args(statement_timeout)
    return create_engine(u, connect_args=connect_args, pool_pre_ping=True)


def _config(url: str | URL | None = None, connection: Connection | None = None) -> Config:
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(files("kvgov.migrations")))
    if url is not None:
        cfg.set_main_option(
            "sqlalchemy.url",
            normalize_url(url).render_as_string(hide_password=False).replace("%", "%%"),
        )
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


_HEAD: list[str] = []


def head_revision() -> str:
    """The Alembic head revision this kvgov needs.

    Returns:
        The revision id.
    """
    if not _HEAD:
        head = ScriptDirectory.from_config(_config()).get_current_head()
        if head is None:  # pragma: no cover - the package ships its revisions
            raise RuntimeError("the migrations package holds no revision")
        _HEAD.append(head)
    return _HEAD[0]


def current_revision(url: str | URL, *, read_only: bool = False) -> str | None:
    """The revision a database is at.

    Args:
        url: the database URL.
        read_only: read as a reader (see :func:`create_audit_engine`).

    Returns:
        The revision id, or None for a database without the schema.
    """
    engine = create_audit_engine(url, read_only=read_only)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str | URL, revision: str = "head", *, sql: bool = False) -> str:
    """Upgrade a database's schema (``kvgov db upgrade``).

    Args:
        url: the database URL.
        revision: the target revision.
        sql: render the SQL instead of running it (Alembic offline mode).

    Returns:
        The SQL script in offline mode, else an empty string.
    """
    return _run(url, sql, lambda cfg: command.upgrade(cfg, revision, sql=sql))


def downgrade(url: str | URL, revision: str = "-1", *, sql: bool = False) -> str:
    """Downgrade a database's schema (``kvgov db downgrade``); ``base`` drops the audit tables.

    Args:
        url: the database URL.
        revision: the target revision (``-1``: one step back).
        sql: render the SQL instead of running it (offline mode; needs ``from:to`` form).

    Returns:
        The SQL script in offline mode, else an empty string.
    """
    return _run(url, sql, lambda cfg: command.downgrade(cfg, revision, sql=sql))


def _run(url: str | URL, sql: bool, fn: Any) -> str:
    if sql:
        out = io.StringIO()
        cfg = _config(url)
        cfg.output_buffer = out
        fn(cfg)
        return out.getvalue()
    engine = create_audit_engine(url)
    try:
        with engine.begin() as conn:
            fn(_config(connection=conn))
    finally:
        engine.dispose()
    return ""


def _is_default_sqlite(u: URL) -> bool:
    return u == normalize_url(AUDIT_URL)


def open_engine(
    url: str | URL,
    *,
    auto_upgrade: bool | None = None,
    statement_timeout: float | None = None,
    read_only: bool = False,
) -> Engine:
    """Create an engine for a database at the head revision, or refuse.

    Args:
        url: the database URL.
        auto_upgrade: True upgrades any database; False never does; None (default)
            upgrades only an empty SQLite database and the default audit file.
        statement_timeout: passed to :func:`create_audit_engine`.
        read_only: a reader's engine (implies ``auto_upgrade=False``): a SQLite file
            and its ``-wal``/``-shm`` stay byte for byte as they were (see
            :func:`create_audit_engine`).

    Returns:
        The engine (dispose it when done).

    Raises:
        AuditSchemaError: the database is not at the head revision; run
            ``kvgov db upgrade URL``.
        AuditDatabaseMissing: ``auto_upgrade`` is False and the SQLite file does not
            exist (it is not created).
    """
    u = normalize_url(url)
    if read_only:
        auto_upgrade = False
    if auto_upgrade is False:
        require_database(u)
    engine = create_audit_engine(u, statement_timeout=statement_timeout, read_only=read_only)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            empty = not inspect(conn).get_table_names()
        head = head_revision()
        if current == head:
            return engine
        sqlite = u.get_backend_name() == "sqlite"
        if auto_upgrade is None:
            auto_upgrade = sqlite and (empty or _is_default_sqlite(u))
        if not auto_upgrade:
            raise AuditSchemaError(mask_url(u), current, head)
        with engine.begin() as conn:
            command.upgrade(_config(connection=conn), "head")
        return engine
    except BaseException:
        engine.dispose()
        raise


#: The tables of the audit schema whose rows :func:`row_counts` reports.
AUDIT_TABLES = (
    "audit_events",
    "audit_checkpoints",
    "audit_keys",
    "offload_keys",
    "fleet_engines",
    "fleet_orders",
    "fleet_results",
)
_DROP_TABLE = re.compile(r'DROP TABLE (?:IF EXISTS )?"?(\w+)"?', re.I)


def row_counts(url: str | URL) -> dict[str, int]:
    """How many rows each audit table holds (tables that do not exist are left out).

    Args:
        url: the database URL (a SQLite file must exist: see :func:`require_database`).

    Returns:
        ``{table: rows}`` in :data:`AUDIT_TABLES` order.
    """
    require_database(url)
    engine = create_audit_engine(url)
    try:
        with engine.connect() as conn:
            present = set(inspect(conn).get_table_names())
            return {
                t: int(conn.execute(select(func.count()).select_from(table(t))).scalar_one())
                for t in AUDIT_TABLES
                if t in present
            }
    finally:
        engine.dispose()


@dataclass(frozen=True, slots=True)
class DowngradePlan:
    """What a downgrade would do, found before it runs.

    Attributes:
        current: the revision the database is at.
        target: the revision it would reach (None: base, no schema at all).
        dropped: ``{table: rows}`` of every table the downgrade drops, in drop order.
        events: audit events the database holds now.
    """

    current: str
    target: str | None

    dropped: dict[str, int]
    events: int = 0

    @property
    def events_lost(self) -> int:
        """Audit events the downgrade deletes (0 when ``audit_events`` survives)."""
        return self.dropped.get("audit_events", 0)

    @property
    def trail_survives(self) -> bool:
        """Whether ``audit_events`` is still there afterwards."""
        return "audit_events" not in self.dropped


def plan_downgrade(url: str | URL, revision: str) -> DowngradePlan:
    """Find which tables, holding how many rows, a downgrade to ``revision`` drops.

    The tables are read from the SQL Alembic renders for the downgrade (offline), so
    the plan follows the migrations as written; nothing is changed.

    Args:
        url: the database URL.
        revision: an explicit target: ``base`` or a revision id (not relative like
            ``-1``, nor ``head``).

    Returns:
        The plan.

    Raises:
        AuditMigrationRefused: the target is not explicit, not below the current
            revision, or the database has no schema.
        AuditDowngradeRefused: the downgrade keeps a trail holding events below the
            revision that introduced chain format 2.
        AuditDatabaseMissing: the SQLite file does not exist.
    """
    script = ScriptDirectory.from_config(_config())
    known = [r.revision for r in script.walk_revisions()]
    if revision != "base" and revision not in known:
        raise AuditMigrationRefused(
            f"{revision!r} is not an explicit target revision; give base (which drops the "
            f"audit trail) or one of: {', '.join(reversed(known))}"
        )
    counts = row_counts(url)
    current = current_revision(url)
    if current is None:
        raise AuditMigrationRefused(
            f"{mask_url(url)} has no audit schema (revision none): nothing to downgrade"
        )
    target = None if revision == "base" else revision
    below = [r.revision for r in script.iterate_revisions(current, "base")]
    if target is not None and (target == current or target not in below):
        raise AuditMigrationRefused(
            f"{revision} is not below the database's revision {current}: nothing to "
            "downgrade (see `kvgov db current`)"
        )
    sql = downgrade(url, f"{current}:{revision}", sql=True)
    dropped = {t: counts.get(t, 0) for t in dict.fromkeys(_DROP_TABLE.findall(sql))}
    events = counts.get("audit_events", 0)
    plan = DowngradePlan(current=current, target=target, dropped=dropped, events=events)
    undone = [r.revision for r in script.iterate_revisions(current, revision)]
    if CHAIN_FORMAT_REVISION in undone and plan.trail_survives and events:
        # Rows written since 0004 are chain format 2, which the schema before it cannot
        # tell from format 1; the downgrade's own record would be one more. Refused here,
        # before anything is recorded, rather than by the migration half-way.
        raise AuditDowngradeRefused(
            CHAIN_FORMAT_REVISION,
            f"the trail holds {events} audit event(s) and a downgrade that keeps it below "
            "this revision would leave chain-format-2 events (its own record among them) "
            "that the older schema cannot verify. Keep this revision, or export the trail "
            "(`kvgov audit export`) and downgrade to base with --yes-destroy-audit-trail",
        )
    return plan
