"""Errors of the encrypted offload tiers (``kvgov.offload``).

Import them from :mod:`kvgov.exceptions`, never from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgov.exceptions.base import KVGovError


class OffloadError(KVGovError):
    """Root of errors raised by the encrypted offload tiers (``offload``)."""


class InvalidOffloadArgument(OffloadError, ValueError):
    """An argument to an offload tier or store is out of range or of the wrong type.

    Args:
        name: the argument.
        value: the value given (never key material).
        reason: what is accepted.
    """

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {name}={value!r}: {reason}")


class UnknownTier(OffloadError, KeyError):
    """A tier name is not one of the store's tiers.

    Args:
        tier: the name given.
        known: the store's tier names, in order.
    """

    def __init__(self, tier: str, known: Sequence[str]) -> None:
        self.tier = tier
        self.known = tuple(known)
        super().__init__(f"unknown offload tier {tier!r}; this store has {list(self.known)}")

    def __str__(self) -> str:
        return str(self.args[0])


class KEKError(OffloadError):
    """The key-encryption key is missing, malformed, unsafe to read, or not the one needed.

    Args:
        reason: what is wrong and how to supply the right key.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"key-encryption key: {reason}")


class KeyStoreUnavailable(OffloadError):
    """The wrapped-key store (SQL) cannot be reached, so no data key can be read or made.

    Offload and restore treat it as every tier being unavailable (nothing is stored
    unencrypted); ``shred`` raises it, because an erasure it cannot record did not happen.

    Args:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"offload key store unavailable ({reason}); check the database, then retry"
        )


class TierUnavailable(OffloadError):
    """A tier's backing service (Redis, a disk) cannot be reached or written.

    The store catches it, skips the tier for a while and carries on with the
    others; it never stores plaintext instead.

    Args:
        tier: the tier's name.
        reason: what failed.
    """

    def __init__(self, tier: str, reason: str) -> None:
        self.tier = tier
        self.reason = reason
        super().__init__(
            f"offload tier {tier!r} is unavailable ({reason}); the store skips it and "
            "retries later. Check the service behind it."
        )


class ObjectRefused(OffloadError):
    """An offloaded object failed a security check and was refused (security invariant).

    The store reports it as a miss with :attr:`reason` and deletes the object; the
    caller audits the refusal. Subclasses say which check failed.

    Args:
        tier: the tier the object was read from.
        block_key: the block key it was looked up by.
        detail: what exactly did not hold.
    """

    #: The miss reason this refusal is reported as (``kvgov.offload.MissReason``).
    reason = "refused"

    def __init__(self, tier: str, block_key: bytes, detail: str) -> None:
        self.tier = tier
        self.block_key = bytes(block_key)
        self.detail = detail
        super().__init__(
            f"offloaded object for block {self.block_key.hex()[:16]}... in tier {tier!r} "
            f"refused ({self.reason}): {detail}. Treat it as a miss and audit it; if it "
            "recurs, find out who can write to that tier."
        )


class ObjectCorrupt(ObjectRefused):
    """An object cannot be parsed: truncated, padded, or of an unknown format version."""

    reason = "corrupt"


class ObjectTampered(ObjectRefused):
    """An object failed AES-GCM authentication: its bytes or bound context were changed."""

    reason = "tampered"


class ObjectMisbound(ObjectRefused):
    """An object names another block, scope, tenant or tenant's key than the one asked for."""

    reason = "misbound"


class ObjectReplayed(ObjectRefused):
    """An object is older than one this store has since written, read or deleted for its key."""

    reason = "replayed"


class DataKeyDestroyed(ObjectRefused):
    """An object's data key was destroyed (the tenant was crypto-shredded) or never existed."""

    reason = "key_destroyed"
