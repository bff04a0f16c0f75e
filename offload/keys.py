"""Key management: the key-encryption key, per-tenant data keys, crypto-shredding.

::

    KEK (KVGOV_KEK, a file, or a KMS behind KeyProvider) -- never stored by kvgov
     |  wrap(data key, context = tenant || key id)          AES-256-GCM, random nonce
     v
    wrapped data key  -- one row per key in the SQL key store (WrappedKeyStore)
     |  unwrap once per worker, kept in memory, re-checked every DATA_KEY_RECHECK_SECONDS
     v
    data key of a tenant (32 random bytes, id = 16 random bytes)
     |  HKDF per sealing session (see kvgov.offload.crypto)
     v
    AES-256-GCM over each offloaded block

Destroying a tenant's data key (``WrappedKeyStore.destroy``: the wrapped bytes are
erased, the row stays as evidence with its destruction time) makes every object sealed
under it unreadable in every tier at once, copies and backups of the tiers included:
that is crypto-shredding. Each tenant has at most one live key; after a shred the next
offload for the tenant creates a new one.

The SQL implementation of :class:`WrappedKeyStore` lives in :mod:`kvgov.audit` (which
owns SQL); this module only states the protocol, so the offload layer imports no
SQLAlchemy.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kvgov.defaults import DATA_KEY_RECHECK_SECONDS, KEK_ENV, KEK_FILE_ENV
from kvgov.exceptions import DataKeyDestroyed, InternalError, KEKError, ObjectMisbound
from kvgov.secrecy import KeyFileOpenToOthers, read_key_file, unshown

from .crypto import DataKey
from .objects import KEY_ID_BYTES

__all__ = [
    "DATA_KEY_BYTES",
    "KEK_BYTES",
    "DataKeyRing",
    "KeyProvider",
    "LocalKEK",
    "WrappedKeyRecord",
    "WrappedKeyStore",
    "wrap_context",
]

#: Bytes of a key-encryption key and of a data key (AES-256).
KEK_BYTES = 32
DATA_KEY_BYTES = 32

_WRAP_TAG = b"kvgov.datakey.v1\x00"
_KEK_ID_TAG = b"kvgov.kek-id.v1\x00"
_GENERATE_HINT = 'generate one with: python -c "import secrets; print(secrets.token_hex(32))"'


def wrap_context(tenant: str, key_id: bytes) -> bytes:
    """The context a data key is wrapped under, so a wrapped key cannot move to another tenant.

    Layout: ``b"kvgov.datakey.v1" 0x00 || len(utf8(tenant)) as u16 || utf8(tenant) || key_id``.

    Args:
        tenant: the key's tenant.
        key_id: the key's 16-byte id.

    Returns:
        The context bytes (AES-GCM associated data for a local KEK, encryption context
        for a KMS).
    """
    raw = tenant.encode("utf-8")
    return _WRAP_TAG + len(raw).to_bytes(2, "big") + raw + key_id


class KeyProvider(Protocol):
    """Wraps and unwraps data keys with a key-encryption key it never hands out (KEK or KMS)."""

    @property
    def kek_id(self) -> str:
        """A stable, non-secret name of the KEK, recorded with every key it wraps."""
        ...

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """Encrypt ``data_key``, bound to ``context``."""
        ...

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """Decrypt a wrapped key; raises :class:`~kvgov.exceptions.KEKError` if it fails."""
        ...


class LocalKEK:
    """A key-encryption key held in this process (from ``KVGOV_KEK`` or a file).

    Wrapping is AES-256-GCM with a random 96-bit nonce and the wrap context as
    associated data: ``wrapped = nonce || ciphertext || tag``. A KEK wraps one key per
    tenant (and one more per shred), many orders of magnitude below the 2**32 random
    nonces NIST SP 800-38D allows per key.

    Args:
        kek: 32 bytes.

    Raises:
        KEKError: not 32 bytes.
    """

    __slots__ = ("_aead", "_kek_id")

    def __init__(self, kek: bytes) -> None:
        if not isinstance(kek, bytes | bytearray) or len(kek) != KEK_BYTES:
            size = len(kek) if isinstance(kek, bytes | bytearray) else type(kek).__name__
            raise KEKError(f"must be exactly {KEK_BYTES} bytes, got {size}; {_GENERATE_HINT}")
        self._aead = AESGCM(bytes(kek))
        self._kek_id = "local:" + hashlib.sha256(_KEK_ID_TAG + bytes(kek)).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"LocalKEK(kek_id={self._kek_id!r})"

    @property
    def kek_id(self) -> str:
        """``local:`` and 16 hex digits of a tagged SHA-256 of the KEK (reveals nothing of it)."""
        return self._kek_id

    @classmethod
    def from_hex(cls, text: str) -> LocalKEK:
        """A KEK from 64 hex characters.

        Raises:
            KEKError: not 64 hex characters.
        """
        try:
            raw = bytes.fromhex(text.strip())
        except ValueError:
            raise KEKError(f"expected {2 * KEK_BYTES} hex characters; {_GENERATE_HINT}") from None
        return cls(raw)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> LocalKEK:
        """A KEK from a file holding 32 raw bytes or 64 hex characters, readable by its owner only.

        A path given as text that cannot be read is not shown (it may be the key itself),
        only its length.

        Raises:
            KEKError: missing, unreadable, accessible by group or others, or malformed.
        """
        p = Path(path)
        why = ""
        try:
            data = read_key_file(p)
        except KeyFileOpenToOthers as exc:
            raise KEKError(f"KEK file {exc}") from None
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        if why:  # raised here, not in the handler: the OSError (naming the path) is not chained
            if isinstance(path, os.PathLike):  # a path object, not text that may be the key
                raise KEKError(f"cannot read KEK file {p}: {why}")
            raise KEKError(
                f"cannot read the KEK file: not a readable file ({unshown(os.fspath(path))}): {why}"
            )
        if len(data) == KEK_BYTES:
            return cls(data)
        try:
            return cls.from_hex(data.decode("ascii"))
        except (UnicodeDecodeError, KEKError):
            raise KEKError(
                f"KEK file {p} holds neither {KEK_BYTES} raw bytes nor {2 * KEK_BYTES} hex "
                f"characters; {_GENERATE_HINT}"
            ) from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LocalKEK:
        """The KEK named by ``KVGOV_KEK`` (hex), or else by the file ``KVGOV_KEK_FILE``.

        Args:
            environ: the environment (default ``os.environ``).

        Raises:
            KEKError: neither variable is set, or the key is malformed.
        """
        env = os.environ if environ is None else environ
        if env.get(KEK_ENV):
            return cls.from_hex(env[KEK_ENV])
        if env.get(KEK_FILE_ENV):
            return cls.from_file(env[KEK_FILE_ENV])
        raise KEKError(
            f"none configured: set {KEK_ENV} to 64 hex characters or {KEK_FILE_ENV} to a "
            f"file holding the key; {_GENERATE_HINT}"
        )

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """``nonce || AES-256-GCM(KEK, nonce, data_key, aad=context)``."""
        nonce = secrets.token_bytes(12)
        return nonce + self._aead.encrypt(nonce, data_key, context)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """Reverse :meth:`wrap`.

        Raises:
            KEKError: the wrapped key was not made by this KEK for this context.
        """
        try:
            return self._aead.decrypt(wrapped[:12], wrapped[12:], context)
        except (InvalidTag, ValueError):
            raise KEKError(
                f"a wrapped data key does not open with KEK {self._kek_id} for its tenant and "
                "id: it was wrapped by another KEK, or the key store row was altered or moved"
            ) from None


class WrappedKeyRecord(Protocol):
    """One data key as the key store keeps it (read-only)."""

    @property
    def key_id(self) -> str:
        """32 hex digits (16 random bytes)."""
        ...

    @property
    def tenant(self) -> str:
        """The tenant the key belongs to."""
        ...

    @property
    def kek_id(self) -> str:
        """The KEK that wrapped it."""
        ...

    @property
    def wrapped(self) -> bytes | None:
        """The wrapped key; None once destroyed."""
        ...

    @property
    def created_us(self) -> int:
        """Creation time, microseconds since 1970-01-01 UTC."""
        ...

    @property
    def destroyed_us(self) -> int | None:
        """Destruction time, or None while the key is live."""
        ...


class WrappedKeyStore(Protocol):
    """Durable store of wrapped data keys, shared by every worker (SQL: ``kvgov.audit``)."""

    def live(self, tenant: str) -> WrappedKeyRecord | None:
        """The tenant's live (not destroyed) key, or None."""
        ...

    def get(self, key_id: str) -> WrappedKeyRecord | None:
        """A key by id, live or destroyed, or None if never recorded."""
        ...

    def create(
        self, *, key_id: str, tenant: str, kek_id: str, wrapped: bytes, created_us: int
    ) -> WrappedKeyRecord:
        """Record a new live key for ``tenant`` unless it has one.

        Returns:
            The tenant's live key: the new one, or the one another worker created first.
        """
        ...

    def destroy(self, tenant: str, destroyed_us: int) -> list[str]:
        """Erase the wrapped bytes of every live key of ``tenant``; returns their ids."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(slots=True)
class _Cached:
    key: DataKey
    #: clock() when the key's state was last read from the key store.
    checked: float


class DataKeyRing:
    """Per-tenant data keys: created on first use, unwrapped once, destroyed on shred.

    Thread-safe. A key another worker destroyed stays usable here for at most
    ``recheck_seconds`` (the ring re-reads a key's state that often).

    Args:
        store: the wrapped-key store shared by the fleet.
        kek: the key provider that wraps and unwraps.
        clock: seconds since the epoch.
        recheck_seconds: how long an unwrapped key is trusted without re-reading its state.
    """

    def __init__(
        self,
        store: WrappedKeyStore,
        kek: KeyProvider,
        *,
        clock: Callable[[], float] = time.time,
        recheck_seconds: float = DATA_KEY_RECHECK_SECONDS,
    ) -> None:
        self._store = store
        self._kek = kek
        self._clock = clock
        self._recheck = recheck_seconds
        self._lock = threading.Lock()
        self._live: dict[str, _Cached] = {}
        self._by_id: dict[bytes, _Cached] = {}

    def sealing_key(self, tenant: str) -> DataKey:
        """The tenant's live key, created (and recorded, wrapped) if it has none.

        Raises:
            KEKError: the live key was wrapped by another KEK.
        """
        now = self._clock()
        with self._lock:
            cached = self._live.get(tenant)
            if cached is not None and now - cached.checked < self._recheck:
                return cached.key
        record = self._store.live(tenant)
        if record is None:
            key_id = secrets.token_bytes(KEY_ID_BYTES)
            material = secrets.token_bytes(DATA_KEY_BYTES)
            record = self._store.create(
                key_id=key_id.hex(),
                tenant=tenant,
                kek_id=self._kek.kek_id,
                wrapped=self._kek.wrap(material, wrap_context(tenant, key_id)),
                created_us=int(now * 1e6),
            )
        with self._lock:
            if cached is not None and cached.key.key_id.hex() != record.key_id:
                self._forget(cached.key.key_id)  # destroyed elsewhere, and replaced
            entry = self._remember(record, now)
            self._live[tenant] = entry
            return entry.key

    def opening_key(self, tenant: str, key_id: bytes, *, tier: str, block_key: bytes) -> DataKey:
        """The key an object names, checked to be live and to belong to ``tenant``.

        Args:
            tenant: the tenant the caller expects the object to belong to.
            key_id: the key id the object names.
            tier: the tier it was read from (for errors).
            block_key: its block key (for errors).

        Raises:
            DataKeyDestroyed: the key was destroyed (shredded) or never existed.
            ObjectMisbound: the key belongs to another tenant.
            KEKError: the key was wrapped by another KEK.
        """
        now = self._clock()
        with self._lock:
            cached = self._by_id.get(key_id)
            if cached is not None and now - cached.checked < self._recheck:
                self._check_owner(cached.key.tenant, tenant, tier, block_key)
                return cached.key
        record = self._store.get(key_id.hex())
        if record is None or record.destroyed_us is not None or record.wrapped is None:
            with self._lock:
                self._forget(key_id)
            state = "was never recorded" if record is None else "was destroyed (crypto-shredded)"
            raise DataKeyDestroyed(tier, block_key, f"its data key {key_id.hex()} {state}")
        self._check_owner(record.tenant, tenant, tier, block_key)
        with self._lock:
            return self._remember(record, now).key

    def destroy(self, tenant: str) -> tuple[str, ...]:
        """Destroy the tenant's live key(s) in the key store, then forget them here.

        Returns:
            The destroyed key ids (hex); empty if the tenant had no live key.
        """
        destroyed = self._store.destroy(tenant, int(self._clock() * 1e6))
        with self._lock:
            self._live.pop(tenant, None)
            for kid in destroyed:
                self._forget(bytes.fromhex(kid))
        return tuple(destroyed)

    @staticmethod
    def _check_owner(owner: str, tenant: str, tier: str, block_key: bytes) -> None:
        if owner != tenant:
            raise ObjectMisbound(tier, block_key, "it was sealed with another tenant's data key")

    def _remember(self, record: WrappedKeyRecord, now: float) -> _Cached:
        """Cache a live record's key (unwrapping it the first time); caller holds the lock."""
        key_id = bytes.fromhex(record.key_id)
        entry = self._by_id.get(key_id)
        if entry is None:
            if record.kek_id != self._kek.kek_id:
                raise KEKError(
                    f"data key {record.key_id} of tenant {record.tenant!r} was wrapped by KEK "
                    f"{record.kek_id}, this worker holds {self._kek.kek_id}: give every "
                    "worker the same KEK"
                )
            if record.wrapped is None:
                raise InternalError(f"the destroyed data key {record.key_id} was about to be used")
            material = self._kek.unwrap(record.wrapped, wrap_context(record.tenant, key_id))
            entry = _Cached(DataKey(key_id, record.tenant, material), now)
            self._by_id[key_id] = entry
        entry.checked = now
        return entry

    def _forget(self, key_id: bytes) -> None:
        """Drop and wipe a key; caller holds the lock."""
        entry = self._by_id.pop(key_id, None)
        if entry is not None:
            if self._live.get(entry.key.tenant) is entry:
                del self._live[entry.key.tenant]
            entry.key.wipe()
