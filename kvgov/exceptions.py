"""The one exception hierarchy of kvgov.

Every error kvgov raises on purpose derives from :class:`KVGovError`, so a
serving stack can catch the whole family in one place. Errors come in three
tiers:

* **Caller mistakes** (bad input, unknown ids, a denied request) raise a typed
  subclass whose message says what to do. Nothing was changed.
* **Broken internal state** raises :class:`InternalError`, whose message says
  it is a bug in kvgov.
* **Security invariants** (a zeroized block that is not zero, an audit trail
  that cannot be written, an offloaded object that fails authentication) raise
  their own subclasses from explicit checks, never from ``assert`` (which
  ``python -O`` strips).

Subclasses carry the structured fields a caller needs (``OutOfBlocks.requested``,
``PolicyDenied.decision_id``) so nobody has to parse messages.

This module imports nothing from kvgov so that every package (``allocator``,
``policy``, ``audit``, ``offload``, ``govern``) can raise from the same hierarchy without
depending on each other.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AllocatorError",
    "AuditError",
    "AuditSchemaError",
    "AuditUnavailable",
    "BindingConfigError",
    "BlockStateError",
    "DataKeyDestroyed",
    "DuplicateSequence",
    "ExpectedStreamsError",
    "GovernError",
    "InternalError",
    "InvalidArgument",
    "InvalidAuditEvent",
    "InvalidOffloadArgument",
    "InvalidScope",
    "InvalidSpec",
    "InvalidTokens",
    "KEKError",
    "KVGovError",
    "KeyAlreadySet",
    "KeySecretError",
    "KeyStoreUnavailable",
    "ObjectCorrupt",
    "ObjectMisbound",
    "ObjectRefused",
    "ObjectReplayed",
    "ObjectTampered",
    "OffloadError",
    "OutOfBlocks",
    "PolicyDenied",
    "PolicyError",
    "PolicyLoadError",
    "PolicyTestFailure",
    "PoolClosed",
    "ScopeTokenError",
    "SigningKeyError",
    "TenantPurging",
    "TierUnavailable",
    "UnknownBlock",
    "UnknownSequence",
    "UnknownTier",
    "UnsupportedEngine",
    "ZeroizationError",
]


class KVGovError(Exception):
    """Root of every error kvgov raises on purpose."""


class InternalError(KVGovError):
    """kvgov found its own state broken: this is a bug in kvgov.

    Args:
        what: what was found broken.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(
            f"internal error: {what}. This is a bug in kvgov; please report it with this message."
        )


# --------------------------------------------------------------------------- allocator


class AllocatorError(KVGovError):
    """Root of errors raised by the block pool (``allocator``)."""


class InvalidSpec(AllocatorError, ValueError):
    """A KV layout or capacity input is nonsense (zero or negative size, unknown dtype).

    Args:
        field: the offending field.
        value: the value given.
        reason: why it is refused and what is accepted.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {field}={value!r}: {reason}")


class OutOfBlocks(AllocatorError):
    """More blocks were asked for than are free or can be evicted.

    Args:
        requested: blocks asked for.
        available: blocks that were free or evictable at the time.
    """

    def __init__(self, requested: int, available: int) -> None:
        self.requested = requested
        self.available = available
        super().__init__(
            f"requested {requested} blocks but only {available} are free or evictable; "
            "release finished sequences or create the cache with more blocks"
        )


class UnknownBlock(AllocatorError, IndexError):
    """A block id is not in ``range(num_blocks)``.

    Args:
        block_id: the id given.
        num_blocks: the pool size.
    """

    def __init__(self, block_id: object, num_blocks: int) -> None:
        self.block_id = block_id
        self.num_blocks = num_blocks
        super().__init__(f"unknown block id {block_id!r}: valid ids are 0..{num_blocks - 1}")


class BlockStateError(AllocatorError):
    """An operation needs a block in another state (freeing a FREE block, keying a CACHED one).

    Args:
        block_id: the block.
        state: the state it is in.
        operation: what was attempted.
    """

    def __init__(self, block_id: int, state: str, operation: str) -> None:
        self.block_id = block_id
        self.state = state
        self.operation = operation
        super().__init__(f"cannot {operation} block {block_id}: it is {state}")


class KeyAlreadySet(AllocatorError):
    """A block's cache key is write-once and was already set.

    Args:
        block_id: the block.
    """

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        super().__init__(f"block {block_id} already carries a cache key; keys are write-once")


class ZeroizationError(AllocatorError):
    """A zeroized block range was read back and is not all zero (security invariant).

    Args:
        block_ids: the blocks that failed verification.
    """

    def __init__(self, block_ids: Sequence[int]) -> None:
        self.block_ids = tuple(block_ids)
        super().__init__(
            f"zeroization verification failed for blocks {list(self.block_ids)[:16]}: "
            "freed KV bytes are still readable; stop serving from this device"
        )


class PoolClosed(AllocatorError):
    """The pool (or cache) was closed; its memory is zeroized and gone."""

    def __init__(self) -> None:
        super().__init__("the pool is closed; create a new one")


# --------------------------------------------------------------------------- policy


class PolicyError(KVGovError):
    """Root of errors raised by the policy layer (``policy``)."""


class PolicyLoadError(PolicyError):
    """A Rego bundle failed to load (syntax error, bad data.json, failing tests).

    Args:
        message: what went wrong.
        file: the file at fault, where known.
        line: 1-based line, where known.
        column: 1-based column, where known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        where = ""
        if file is not None:
            where = file
            if line is not None:
                where += f":{line}"
                if column is not None:
                    where += f":{column}"
            where += ": "
        super().__init__(f"{where}{message}")


class PolicyTestFailure(PolicyLoadError):
    """A bundle's own Rego tests failed, so it was not activated.

    Args:
        failures: names of the failing ``test_`` rules.
    """

    def __init__(self, failures: Sequence[str]) -> None:
        self.failures = tuple(failures)
        super().__init__(f"{len(self.failures)} policy test(s) failed: {', '.join(self.failures)}")


class PolicyDenied(PolicyError):
    """The policy refused a request (or failed closed).

    Args:
        path: the rule that decided, e.g. ``kvgov/admission/decision``.
        reason: the policy's reason (or the engine error when it failed closed).
        decision_id: the decision's id, as written to the audit trail.
    """

    def __init__(self, path: str, reason: str, decision_id: str) -> None:
        self.path = path
        self.reason = reason
        self.decision_id = decision_id
        super().__init__(f"denied by {path}: {reason} (decision {decision_id})")


class PolicyUnavailable(PolicyError):
    """The policy engine could not answer (down, timed out, answered garbage).

    Callers that must decide fail closed on it: the governor turns it into an
    audited :class:`PolicyDenied`.

    Args:
        what: what could not be read, e.g. ``"the classifications"``.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(
            f"the policy engine could not give {what}; requests are refused (fail closed) "
            "until it answers again: check the engine (OPA server reachable, bundle loaded)"
        )


# --------------------------------------------------------------------------- audit


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


# --------------------------------------------------------------------------- govern


class GovernError(KVGovError):
    """Root of errors raised by the governed cache (``govern``)."""


class InvalidArgument(GovernError, ValueError):
    """An argument to the governed cache is out of range or of the wrong type.

    Args:
        name: the argument.
        value: the value given.
        reason: what is accepted.
    """

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {name}={value!r}: {reason}")


class InvalidScope(GovernError, ValueError):
    """A cache scope field is missing, malformed, or unknown to the policy.

    Args:
        field: the offending field.
        value: the value given.
        reason: why it is refused.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid scope {field}={value!r}: {reason}")


class InvalidTokens(GovernError, ValueError):
    """Token ids must be a sequence of non-negative ints below 2**32.

    Args:
        reason: what is wrong with them.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid token ids: {reason}")


class UnknownSequence(GovernError, KeyError):
    """No live sequence has this id.

    Args:
        seq_id: the id given.
    """

    def __init__(self, seq_id: str) -> None:
        self.seq_id = seq_id
        super().__init__(f"no live sequence {seq_id!r}; admit it first")

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateSequence(GovernError):
    """A sequence id was admitted while it is still live.

    Args:
        seq_id: the id given.
    """

    def __init__(self, seq_id: str) -> None:
        self.seq_id = seq_id
        super().__init__(f"sequence {seq_id!r} is already live; release it first or use a new id")


class KeySecretError(GovernError):
    """The cache-key secret is missing or too short.

    Args:
        reason: what is wrong and how to supply one.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cache key secret: {reason}")


class TenantPurging(GovernError):
    """The tenant is being erased; new admissions are refused until the purge ends.

    Args:
        tenant: the tenant.
    """

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        super().__init__(f"tenant {tenant!r} is being purged; retry after the erasure finishes")


class BindingConfigError(GovernError, ValueError):
    """A serving-engine binding's kvgov settings are invalid; the engine refuses to start.

    Args:
        setting: the setting (its key in the binding's configuration, or the
            environment variable it was read from).
        value: the value given (never a secret).
        reason: what is accepted.
    """

    def __init__(self, setting: str, value: object, reason: str) -> None:
        self.setting = setting
        self.value = value
        self.reason = reason
        super().__init__(f"invalid kvgov setting {setting}={value!r}: {reason}")


class UnsupportedEngine(GovernError):
    """The serving engine's version or configuration is one kvgov cannot govern.

    Raised when the engine starts, so nothing runs ungoverned.

    Args:
        what: what is not governed (a version, a cache layout, a feature).
        fix: what to do instead.
    """

    def __init__(self, what: str, fix: str) -> None:
        self.what = what
        self.fix = fix
        super().__init__(f"kvgov cannot govern {what}; {fix}")


class ScopeTokenError(GovernError):
    """A signed scope token is missing, malformed, expired, or does not match its scope.

    The binding refuses the request (and audits the refusal); the front end must
    sign the scope it sets (see ``kvgov.govern.vllm.scope_token``).

    Args:
        reason: what is wrong with the token.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"scope token refused: {reason}")


# --------------------------------------------------------------------------- offload


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
