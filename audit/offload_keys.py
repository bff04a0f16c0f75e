"""The SQL store of wrapped offload data keys (``offload_keys``), SQLite or PostgreSQL.

It implements :class:`kvgov.offload.WrappedKeyStore` structurally (this package does not
import the offload layer). One row per data key::

    key_id        32 hex digits, primary key
    tenant        the key's tenant
    kek_id        the key-encryption key that wrapped it
    wrapped       nonce || AES-GCM(KEK, data key) -- NULL once destroyed
    created_us    microseconds since 1970-01-01 UTC
    destroyed_us  NULL while live; set once, when the tenant is crypto-shredded

A partial unique index allows one live key per tenant, so two workers creating a
tenant's first key at once converge on one. Unlike the audit tables this one is not
append-only: destroying a key overwrites its wrapped bytes (the row stays as evidence
of which key was destroyed when). On SQLite the overwrite runs with
``secure_delete`` on and is followed by a WAL checkpoint, so the wrapped bytes do not
linger in the database or WAL file; on PostgreSQL the old row version stays until
``VACUUM`` (docs/offload.md). Either way the wrapped bytes are useless without the KEK.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Executable,
    Index,
    LargeBinary,
    String,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Mapped, mapped_column

from kvgov.audit.models import Base
from kvgov.audit.store import mask_url, open_engine
from kvgov.exceptions import KeyStoreUnavailable

__all__ = ["OffloadKeyRow", "SqlWrappedKeyStore", "StoredDataKey"]

LIVE_WHERE = text("destroyed_us IS NULL")
#: Attempts to create a tenant's key when another worker's key vanishes (shredded) in between.
_CREATE_ATTEMPTS = 3


class OffloadKeyRow(Base):
    """One wrapped data key of the offload tiers."""

    __tablename__ = "offload_keys"
    __table_args__ = (
        Index(
            "uq_offload_keys_live_tenant",
            "tenant",
            unique=True,
            sqlite_where=LIVE_WHERE,
            postgresql_where=LIVE_WHERE,
        ),
    )

    #: 16 random bytes as 32 hex digits; written into every object the key seals.
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    #: The tenant the key belongs to (the wrap binds it too).
    tenant: Mapped[str] = mapped_column(String(256))
    #: The KEK that wrapped it (``LocalKEK.kek_id`` or a KMS key name).
    kek_id: Mapped[str] = mapped_column(String(256))
    #: The wrapped key; NULL once destroyed.
    wrapped: Mapped[bytes | None] = mapped_column(LargeBinary(128))
    #: Creation time, microseconds since 1970-01-01 UTC.
    created_us: Mapped[int] = mapped_column(BigInteger)
    #: Destruction time; NULL while live.
    destroyed_us: Mapped[int | None] = mapped_column(BigInteger)


@dataclass(frozen=True, slots=True)
class StoredDataKey:
    """A row of ``offload_keys`` as read (fits ``kvgov.offload.WrappedKeyRecord``)."""

    key_id: str
    tenant: str
    kek_id: str
    wrapped: bytes | None
    created_us: int
    destroyed_us: int | None


#: Every column, in ``StoredDataKey`` order.
_SELECT = select(
    OffloadKeyRow.key_id,
    OffloadKeyRow.tenant,
    OffloadKeyRow.kek_id,
    OffloadKeyRow.wrapped,
    OffloadKeyRow.created_us,
    OffloadKeyRow.destroyed_us,
)


class SqlWrappedKeyStore:
    """Wrapped data keys in the audit database (``kvgov.offload.WrappedKeyStore``).

    Args:
        url: the database URL (the audit database is the natural home).
        auto_upgrade: as :func:`kvgov.audit.open_engine`.

    Raises:
        AuditSchemaError: the database is not at the head revision; run ``kvgov db upgrade``.
    """

    def __init__(self, url: str | URL, *, auto_upgrade: bool | None = None) -> None:
        self._url = mask_url(url)
        self._engine = open_engine(url, auto_upgrade=auto_upgrade)

    def __repr__(self) -> str:
        return f"SqlWrappedKeyStore({self._url!r})"

    def _unavailable(self, exc: OperationalError) -> KeyStoreUnavailable:
        return KeyStoreUnavailable(f"{self._url}: {exc.orig or exc}")

    def _one(self, stmt: Executable) -> StoredDataKey | None:
        try:
            with self._engine.connect() as conn:
                row = conn.execute(stmt).first()
        except OperationalError as exc:
            raise self._unavailable(exc) from None
        return None if row is None else StoredDataKey(*row)

    def live(self, tenant: str) -> StoredDataKey | None:
        """The tenant's live key, or None.

        Raises:
            KeyStoreUnavailable: the database cannot be reached.
        """
        return self._one(
            _SELECT.where(OffloadKeyRow.tenant == tenant, OffloadKeyRow.destroyed_us.is_(None))
        )

    def get(self, key_id: str) -> StoredDataKey | None:
        """A key by id, live or destroyed, or None.

        Raises:
            KeyStoreUnavailable: the database cannot be reached.
        """
        return self._one(_SELECT.where(OffloadKeyRow.key_id == key_id))

    def create(
        self, *, key_id: str, tenant: str, kek_id: str, wrapped: bytes, created_us: int
    ) -> StoredDataKey:
        """Record a new live key unless the tenant has one; returns the tenant's live key.

        Raises:
            KeyStoreUnavailable: the database cannot be reached.
        """
        stmt = insert(OffloadKeyRow).values(
            key_id=key_id, tenant=tenant, kek_id=kek_id, wrapped=wrapped, created_us=created_us
        )
        for _attempt in range(_CREATE_ATTEMPTS):
            try:
                with self._engine.begin() as conn:
                    conn.execute(stmt)
                return StoredDataKey(key_id, tenant, kek_id, wrapped, created_us, None)
            except IntegrityError:
                pass  # another worker created the tenant's key first: use theirs
            except OperationalError as exc:
                raise self._unavailable(exc) from None
            winner = self.live(tenant)
            if winner is not None:
                return winner
        raise KeyStoreUnavailable(
            f"{self._url}: tenant {tenant!r}'s data key was created and destroyed "
            f"{_CREATE_ATTEMPTS} times while this worker tried to create one; retry"
        )

    def destroy(self, tenant: str, destroyed_us: int) -> list[str]:
        """Erase the wrapped bytes of the tenant's live keys; returns their ids.

        Raises:
            KeyStoreUnavailable: the database cannot be reached (nothing was destroyed).
        """
        live = (OffloadKeyRow.tenant == tenant) & OffloadKeyRow.destroyed_us.is_(None)
        try:
            with self._engine.begin() as conn:
                sqlite = conn.dialect.name == "sqlite"
                if sqlite:
                    conn.exec_driver_sql("PRAGMA secure_delete=ON")
                ids = list(conn.execute(select(OffloadKeyRow.key_id).where(live)).scalars())
                if ids:
                    conn.execute(
                        update(OffloadKeyRow)
                        .where(OffloadKeyRow.key_id.in_(ids))
                        .values(wrapped=None, destroyed_us=destroyed_us)
                    )
            if sqlite and ids:
                with self._engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        except OperationalError as exc:
            raise self._unavailable(exc) from None
        return ids

    def close(self) -> None:
        """Dispose of the engine's connections."""
        self._engine.dispose()
