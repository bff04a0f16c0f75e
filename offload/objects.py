"""Sealed blocks: what a tier stores, and their byte layout on disk and in Redis.

A :class:`SealedBlock` is one encrypted KV block plus the facts a tier needs without
decrypting it (where it belongs, whose it is, until when it may live). The host tier
keeps the object itself; the disk and Redis tiers keep :func:`encode`'s bytes. All
integers are big-endian; ``deadline_us`` and ``written_us`` are signed::

    offset  size  field
    0       4     magic b"KVGO"
    4       1     format_version            (FORMAT_VERSION)
    5       1     K = len(block_key)        (1..255)
    6       1     S = len(scope_digest)     (1..255)
    7       2     T = len(utf8(tenant))     (1..65535)
    9       8     deadline_us               retention deadline, us since 1970-01-01 UTC
    17      8     written_us                when it was sealed (replay floor, see store)
    25      16    key_id                    the tenant data key that sealed it
    41      16    salt                      the sealing session (see crypto)
    57      12    nonce                     AES-GCM nonce
    69      8     C = len(ciphertext)       payload length + 16 (the GCM tag)
    77      K     block_key
    77+K    S     scope_digest
    77+K+S  T     tenant
    ...     C     ciphertext || tag

Every header field except the nonce and the lengths is also bound into the AES-GCM
associated data (:mod:`kvgov.offload.crypto`), so a changed header fails
authentication; the lengths are checked exactly here, so a truncated or padded object
is refused as :class:`~kvgov.exceptions.ObjectCorrupt` before any decryption.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from kvgov.exceptions import InternalError, ObjectCorrupt

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "KEY_ID_BYTES",
    "NONCE_BYTES",
    "SALT_BYTES",
    "TAG_BYTES",
    "ObjectInfo",
    "SealedBlock",
    "decode",
    "encode",
    "encoded_buffer",
    "encoded_nbytes",
]

#: The object format this kvgov writes and the only one it reads.
FORMAT_VERSION: Final = 1
#: Bytes of a data-key id, of a sealing-session salt, of a nonce, of a GCM tag.
KEY_ID_BYTES: Final = 16
SALT_BYTES: Final = 16
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16

_MAGIC: Final = b"KVGO"
_HEADER = struct.Struct(f">4sBBBHqq{KEY_ID_BYTES}s{SALT_BYTES}s{NONCE_BYTES}sQ")
#: Fixed-size part of an encoded object (before the three variable fields and ciphertext).
HEADER_BYTES: Final = _HEADER.size


def encoded_nbytes(block_key: bytes, scope_digest: bytes, tenant: str, payload_bytes: int) -> int:
    """Bytes an object occupies encoded (what tier capacities count), before it is sealed.

    Args:
        block_key: its block key.
        scope_digest: its scope digest.
        tenant: its tenant.
        payload_bytes: the plaintext length (the ciphertext adds the 16-byte tag).

    Returns:
        Header, variable fields, ciphertext and tag.
    """
    variable = len(block_key) + len(scope_digest) + len(tenant.encode("utf-8"))
    return HEADER_BYTES + variable + payload_bytes + TAG_BYTES


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a tier knows about an object without decrypting it (for predicates and reports)."""

    #: The block's cache key: where the object lives in its tier.
    block_key: bytes
    #: The scope digest the block was cached under.
    scope_digest: bytes
    #: The tenant whose data key sealed it.
    tenant: str
    #: Retention deadline, microseconds since 1970-01-01 UTC.
    deadline_us: int
    #: Bytes it occupies in its tier (header and ciphertext).
    nbytes: int


@dataclass(frozen=True, slots=True)
class SealedBlock:
    """One encrypted KV block as a tier holds it; immutable once sealed.

    Only :class:`kvgov.offload.crypto.Sealer` creates these; tiers store and return
    them, and never look inside the ciphertext.
    """

    #: The block's cache key (an HMAC, so it reveals no prompt content).
    block_key: bytes
    #: The scope digest of the block (SHA-256 of its scope fields, tenant excluded).
    scope_digest: bytes
    #: The tenant whose data key sealed it; erasure finds objects by it.
    tenant: str
    #: Retention deadline, microseconds since 1970-01-01 UTC; travels with the object.
    deadline_us: int
    #: When it was sealed, microseconds, strictly increasing per store; older objects
    #: for the same key are refused as replays.
    written_us: int
    #: Id of the tenant data key that sealed it (16 bytes).
    key_id: bytes
    #: Salt of the sealing session: the AES key is HKDF(data key, salt) (16 bytes).
    salt: bytes
    #: AES-GCM nonce, a per-session counter (12 bytes).
    nonce: bytes
    #: AES-256-GCM ciphertext of the payload followed by the 16-byte tag.
    ciphertext: bytes | memoryview
    #: Object format (see the module docstring).
    format_version: int = FORMAT_VERSION
    #: The whole encoded object (read-only), when the sealer encrypted straight into it
    #: (:func:`encoded_buffer`): :func:`encode` returns it without a copy. Not an
    #: ``__init__`` argument: only :meth:`sealed_into` sets it, so an object built or
    #: ``dataclasses.replace``-d from another never carries a stale encoding.
    encoded: memoryview | None = field(default=None, init=False, compare=False, repr=False)

    def sealed_into(self, whole: memoryview) -> SealedBlock:
        """This object, recording ``whole`` as its encoding (the sealer's buffer, whose
        tail is :attr:`ciphertext`); returns ``self``."""
        object.__setattr__(self, "encoded", whole)
        return self

    @property
    def nbytes(self) -> int:
        """Bytes the object occupies encoded: header, variable fields and ciphertext."""
        return encoded_nbytes(self.block_key, self.scope_digest, self.tenant, self.payload_bytes)

    @property
    def payload_bytes(self) -> int:
        """Length of the plaintext payload the ciphertext holds."""
        return len(self.ciphertext) - TAG_BYTES

    def info(self) -> ObjectInfo:
        """The object's non-secret facts."""
        return ObjectInfo(
            self.block_key, self.scope_digest, self.tenant, self.deadline_us, self.nbytes
        )


def _prefix(
    *,
    format_version: int,
    block_key: bytes,
    scope_digest: bytes,
    tenant: str,
    deadline_us: int,
    written_us: int,
    key_id: bytes,
    salt: bytes,
    nonce: bytes,
    ciphertext_bytes: int,
) -> bytes:
    """The header and the three variable fields: everything before the ciphertext."""
    tenant_bytes = tenant.encode("utf-8")
    if not (0 < len(block_key) < 256 and 0 < len(scope_digest) < 256):
        raise InternalError("a sealed block's key or scope digest is empty or over 255 bytes")
    if not 0 < len(tenant_bytes) < 65536:
        raise InternalError("a sealed block's tenant is empty or over 65535 bytes")
    header = _HEADER.pack(
        _MAGIC,
        format_version,
        len(block_key),
        len(scope_digest),
        len(tenant_bytes),
        deadline_us,
        written_us,
        key_id,
        salt,
        nonce,
        ciphertext_bytes,
    )
    return b"".join((header, block_key, scope_digest, tenant_bytes))


def encoded_buffer(
    *,
    block_key: bytes,
    scope_digest: bytes,
    tenant: str,
    deadline_us: int,
    written_us: int,
    key_id: bytes,
    salt: bytes,
    nonce: bytes,
    payload_bytes: int,
    out: bytearray | None = None,
) -> tuple[memoryview, int]:
    """A buffer for a whole encoded object, its header and fields written; the sealer
    encrypts the payload straight into the rest (no copy of the ciphertext afterwards).

    Args:
        out: a buffer to write the object at the start of, at least
            :func:`encoded_nbytes` long (what follows the object is left as it is);
            None allocates a new one of exactly the object's size.

    Returns:
        A writable view of exactly the object's bytes, and the offset in it at which the
        ciphertext (and its tag) go.

    Raises:
        InternalError: a field does not fit its length field, or ``out`` is too short.
    """
    prefix = _prefix(
        format_version=FORMAT_VERSION,
        block_key=block_key,
        scope_digest=scope_digest,
        tenant=tenant,
        deadline_us=deadline_us,
        written_us=written_us,
        key_id=key_id,
        salt=salt,
        nonce=nonce,
        ciphertext_bytes=payload_bytes + TAG_BYTES,
    )
    nbytes = len(prefix) + payload_bytes + TAG_BYTES
    if out is None:
        out = bytearray(nbytes)
    elif len(out) < nbytes:
        raise InternalError(f"a {len(out)}-byte buffer cannot hold a {nbytes}-byte object")
    view = memoryview(out)[:nbytes]
    view[: len(prefix)] = prefix
    return view, len(prefix)


def encode(obj: SealedBlock) -> bytes | memoryview:
    """Serialize an object for a byte-oriented tier (layout in the module docstring).

    Args:
        obj: the object.

    Returns:
        Its encoded bytes: the sealer's own buffer where it encrypted into one.

    Raises:
        InternalError: a field does not fit its length field (the sealer validates
            them first, so this is a bug).
    """
    if obj.encoded is not None:
        return obj.encoded
    prefix = _prefix(
        format_version=obj.format_version,
        block_key=obj.block_key,
        scope_digest=obj.scope_digest,
        tenant=obj.tenant,
        deadline_us=obj.deadline_us,
        written_us=obj.written_us,
        key_id=obj.key_id,
        salt=obj.salt,
        nonce=obj.nonce,
        ciphertext_bytes=len(obj.ciphertext),
    )
    return b"".join((prefix, obj.ciphertext))


def decode(data: bytes | memoryview, *, tier: str, block_key: bytes) -> SealedBlock:
    """Parse an encoded object, checking every length exactly.

    Args:
        data: the bytes a tier returned.
        tier: the tier's name (for the error).
        block_key: the key it was looked up by (for the error).

    Returns:
        The object; its ciphertext is a view into ``data``.

    Raises:
        ObjectCorrupt: wrong magic, unknown format version, truncated or padded.
    """
    view = memoryview(data)
    if len(view) < HEADER_BYTES:
        raise ObjectCorrupt(tier, block_key, f"{len(view)} bytes is shorter than the header")
    magic, version, k, s, t, deadline_us, written_us, key_id, salt, nonce, c = _HEADER.unpack_from(
        view
    )
    if magic != _MAGIC:
        raise ObjectCorrupt(tier, block_key, "not a kvgov offload object (bad magic)")
    if version != FORMAT_VERSION:
        raise ObjectCorrupt(
            tier,
            block_key,
            f"format version {version} is not understood by this kvgov (it reads "
            f"{FORMAT_VERSION}); run the same kvgov version on every worker of a shared tier",
        )
    expected = HEADER_BYTES + k + s + t + c
    if len(view) != expected or k == 0 or s == 0 or t == 0 or c < TAG_BYTES:
        raise ObjectCorrupt(
            tier, block_key, f"{len(view)} bytes where the header announces {expected}"
        )
    pos = HEADER_BYTES
    fields = []
    for n in (k, s, t):
        fields.append(bytes(view[pos : pos + n]))
        pos += n
    try:
        tenant = fields[2].decode("utf-8")
    except UnicodeDecodeError:
        raise ObjectCorrupt(tier, block_key, "the tenant is not UTF-8") from None
    return SealedBlock(
        block_key=fields[0],
        scope_digest=fields[1],
        tenant=tenant,
        deadline_us=deadline_us,
        written_us=written_us,
        key_id=key_id,
        salt=salt,
        nonce=nonce,
        ciphertext=view[pos:],
        format_version=version,
    )
