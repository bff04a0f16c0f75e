"""AES-256-GCM sealing of KV blocks under tenant data keys, with nonces that never repeat.

Nonce discipline. Every worker of a fleet holds the same tenant data key (they share
the Redis tier), so random nonces would need a fleet-wide message count, and a
counter would need a fleet-wide counter. Instead each :class:`DataKey` in each
process seals under its own *session subkey*::

    salt     = 16 random bytes, drawn when the session starts
    subkey   = HKDF-SHA256(ikm = data key, salt = salt,
                           info = b"kvgov.offload.v1 aes-256-gcm", length = 32)
    nonce_i  = i as a 96-bit big-endian counter, i = 0, 1, 2, ...

Within a session the counter never repeats (it is taken under a lock). A session
ends after ``MAX_MESSAGES_PER_SESSION`` (2**32) objects, or when the process id
changes (a fork must not continue its parent's counter), and the next one draws a new
salt. Two sessions share a subkey only if they draw the same 128-bit salt under the
same data key: for ``n`` sessions the probability is below ``n**2 / 2**129`` (under
2**-65 for a billion sessions). The salt travels in the object header, so any worker
derives the subkey to open it.

Associated data. Every object is bound to where it belongs (all integers big-endian)::

    AAD = b"kvgov.offload.v1" 0x00 || u8(format_version)
          || u8(len(tier)) || utf8(tier)
          || u8(len(block_key)) || block_key
          || u8(len(scope_digest)) || scope_digest
          || u16(len(utf8(tenant))) || utf8(tenant)
          || key_id (16) || salt (16) || i64(deadline_us) || i64(written_us)

so an object moved to another tier, block key, scope, tenant or key, or with a changed
deadline or write time, fails authentication. When opening, the tier, block key,
scope digest and tenant come from the *request*, not from the stored header.
"""

from __future__ import annotations

import os
import secrets
import struct
import threading
from collections import OrderedDict
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kvgov.exceptions import DataKeyDestroyed, ObjectTampered

from .objects import FORMAT_VERSION, NONCE_BYTES, SALT_BYTES, SealedBlock, encoded_buffer

__all__ = [
    "MAX_MESSAGES_PER_SESSION",
    "DataKey",
    "associated_data",
    "open_sealed",
    "seal",
]

#: Objects one session subkey seals before a new salt is drawn (NIST SP 800-38D's
#: invocation bound for one key; the counter itself would allow 2**96).
MAX_MESSAGES_PER_SESSION: Final = 2**32
#: Session subkeys of other workers (or earlier sessions) kept ready per data key.
OPENERS_PER_KEY: Final = 256

_AAD_TAG = b"kvgov.offload.v1\x00"
_HKDF_INFO = b"kvgov.offload.v1 aes-256-gcm"
_TIMES = struct.Struct(">qq")


def _subkey(material: bytes | bytearray, salt: bytes) -> AESGCM:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=_HKDF_INFO)
    return AESGCM(hkdf.derive(bytes(material)))


class DataKey:
    """An unwrapped tenant data key and the AES-GCM state derived from it.

    Made by :class:`kvgov.offload.keys.DataKeyRing` only. Thread-safe.

    Args:
        key_id: the key's 16-byte id.
        tenant: the tenant it belongs to.
        material: the 32 key bytes (copied into a buffer :meth:`wipe` overwrites).
        max_messages: objects per sealing session (tests lower it to see rotation).
    """

    __slots__ = (
        "_count",
        "_lock",
        "_material",
        "_max",
        "_openers",
        "_pid",
        "_salt",
        "_sealer",
        "_wiped",
        "key_id",
        "tenant",
    )

    def __init__(
        self,
        key_id: bytes,
        tenant: str,
        material: bytes,
        *,
        max_messages: int = MAX_MESSAGES_PER_SESSION,
    ) -> None:
        #: The key's id (16 bytes), written into every object it seals.
        self.key_id = key_id
        #: The tenant it belongs to.
        self.tenant = tenant
        self._material = bytearray(material)
        self._wiped = False
        self._max = max_messages
        self._lock = threading.Lock()
        self._sealer: AESGCM | None = None
        self._salt = b""
        self._count = 0
        self._pid = 0
        self._openers: OrderedDict[bytes, AESGCM] = OrderedDict()

    def __repr__(self) -> str:
        return f"DataKey(key_id={self.key_id.hex()!r}, tenant={self.tenant!r}, material=<hidden>)"

    @property
    def wiped(self) -> bool:
        """True once :meth:`wipe` ran; the key then refuses to seal or open."""
        return self._wiped

    def wipe(self) -> None:
        """Overwrite the key bytes with zeros and drop every derived subkey.

        Best effort: ``cryptography`` keeps its own copy of each AES key inside objects
        Python cannot overwrite; they are released here and freed by the allocator.
        """
        with self._lock:
            self._material[:] = bytes(len(self._material))
            self._wiped = True
            self._sealer = None
            self._openers.clear()

    def next_nonce(self, tier: str, block_key: bytes) -> tuple[AESGCM, bytes, bytes]:
        """Take the next (subkey, salt, nonce) of this process's session, starting one if due.

        Raises:
            DataKeyDestroyed: the key was wiped (its tenant was shredded meanwhile).
        """
        pid = os.getpid()
        with self._lock:
            if self._wiped:
                raise DataKeyDestroyed(tier, block_key, "its data key was destroyed while sealing")
            if self._sealer is None or self._count >= self._max or self._pid != pid:
                self._salt = secrets.token_bytes(SALT_BYTES)
                self._sealer = _subkey(self._material, self._salt)
                self._count = 0
                self._pid = pid
                self._remember_opener(self._salt, self._sealer)
            nonce = self._count.to_bytes(NONCE_BYTES, "big")
            self._count += 1
            return self._sealer, self._salt, nonce

    def opener(self, salt: bytes, tier: str, block_key: bytes) -> AESGCM:
        """The subkey of the session that used ``salt`` (derived once, then cached).

        Raises:
            DataKeyDestroyed: the key was wiped.
        """
        with self._lock:
            if self._wiped:
                raise DataKeyDestroyed(tier, block_key, "its data key was destroyed while opening")
            aead = self._openers.get(salt)
            if aead is not None:
                self._openers.move_to_end(salt)
                return aead
            aead = _subkey(self._material, salt)
            self._remember_opener(salt, aead)
            return aead

    def _remember_opener(self, salt: bytes, aead: AESGCM) -> None:
        self._openers[salt] = aead
        while len(self._openers) > OPENERS_PER_KEY:
            self._openers.popitem(last=False)


def associated_data(
    *,
    tier: str,
    block_key: bytes,
    scope_digest: bytes,
    tenant: str,
    key_id: bytes,
    salt: bytes,
    deadline_us: int,
    written_us: int,
    format_version: int = FORMAT_VERSION,
) -> bytes:
    """The AES-GCM associated data of an object (layout in the module docstring)."""
    t = tier.encode("utf-8")
    n = tenant.encode("utf-8")
    return b"".join(
        (
            _AAD_TAG,
            bytes((format_version, len(t))),
            t,
            bytes((len(block_key),)),
            block_key,
            bytes((len(scope_digest),)),
            scope_digest,
            len(n).to_bytes(2, "big"),
            n,
            key_id,
            salt,
            _TIMES.pack(deadline_us, written_us),
        )
    )


def seal(
    key: DataKey,
    *,
    tier: str,
    block_key: bytes,
    scope_digest: bytes,
    deadline_us: int,
    written_us: int,
    payload: bytes | memoryview,
    buffer: bytearray | None = None,
) -> SealedBlock:
    """Encrypt a block's payload for one tier.

    Args:
        key: the tenant's data key.
        tier: the tier the object is for (bound into the AAD).
        block_key: the block's cache key.
        scope_digest: its scope digest.
        deadline_us: its retention deadline.
        written_us: the sealing time (strictly increasing per store).
        payload: the plaintext KV bytes.
        buffer: where to build the encoded object (at its start; at least
            :func:`~kvgov.offload.objects.encoded_nbytes` long), for a caller that reuses
            one buffer across objects; the object's :attr:`~SealedBlock.ciphertext` and
            encoding are views of it, valid until the caller writes it again. None: a new
            buffer of the object's size.

    Returns:
        The sealed block.

    Raises:
        DataKeyDestroyed: the key was wiped meanwhile.
    """
    aead, salt, nonce = key.next_nonce(tier, block_key)
    aad = associated_data(
        tier=tier,
        block_key=block_key,
        scope_digest=scope_digest,
        tenant=key.tenant,
        key_id=key.key_id,
        salt=salt,
        deadline_us=deadline_us,
        written_us=written_us,
    )
    # encrypted straight into the encoded object's buffer: a byte-oriented tier sends or
    # writes that buffer as it is (a separate ciphertext joined to its header afterwards
    # cost a sealed Redis save about twice a plain SET of the same bytes)
    view, at = encoded_buffer(
        block_key=block_key,
        scope_digest=scope_digest,
        tenant=key.tenant,
        deadline_us=deadline_us,
        written_us=written_us,
        key_id=key.key_id,
        salt=salt,
        nonce=nonce,
        payload_bytes=memoryview(payload).nbytes,
        out=buffer,
    )
    aead.encrypt_into(nonce, payload, aad, view[at:])
    whole = view.toreadonly()
    return SealedBlock(
        block_key=block_key,
        scope_digest=scope_digest,
        tenant=key.tenant,
        deadline_us=deadline_us,
        written_us=written_us,
        key_id=key.key_id,
        salt=salt,
        nonce=nonce,
        ciphertext=whole[at:],
    ).sealed_into(whole)


def open_sealed(
    key: DataKey,
    obj: SealedBlock,
    *,
    tier: str,
    block_key: bytes,
    scope_digest: bytes,
    into: memoryview | None = None,
) -> bytes | memoryview:
    """Authenticate and decrypt an object looked up as (tier, block key, scope, key's tenant).

    Args:
        key: the data key the object names (already checked to be live and the tenant's).
        obj: the object as the tier returned it.
        tier: the tier it was read from.
        block_key: the block key it was looked up by.
        scope_digest: the scope digest the caller expects.
        into: a writable buffer of exactly ``obj.payload_bytes`` to decrypt into; it is
            overwritten with zeros if authentication fails.

    Returns:
        The plaintext: new bytes, or ``into`` itself.

    Raises:
        ObjectTampered: authentication failed (changed bytes, header or context).
    """
    aad = associated_data(
        tier=tier,
        block_key=block_key,
        scope_digest=scope_digest,
        tenant=key.tenant,
        key_id=obj.key_id,
        salt=obj.salt,
        deadline_us=obj.deadline_us,
        written_us=obj.written_us,
        format_version=obj.format_version,
    )
    aead = key.opener(obj.salt, tier, block_key)
    try:
        if into is None:
            return aead.decrypt(obj.nonce, obj.ciphertext, aad)
        aead.decrypt_into(obj.nonce, obj.ciphertext, aad, into)
        return into
    except InvalidTag:
        if into is not None:
            # OpenSSL may have written unauthenticated plaintext before checking the tag
            into[:] = bytes(len(into))
        raise ObjectTampered(
            tier,
            block_key,
            "AES-GCM authentication failed: its bytes were changed, or it was sealed for "
            "another block, scope, tenant, tier, deadline or time",
        ) from None
