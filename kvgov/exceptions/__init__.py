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

The classes live in one module per layer (``kvgov.exceptions.audit`` ...) and are
imported from here, never from those modules. This package imports nothing else
from kvgov so that every package (``allocator``,
``policy``, ``audit``, ``offload``, ``govern``) can raise from the same hierarchy without
depending on each other.
"""

from __future__ import annotations

from kvgov.exceptions.allocator import (
    AllocatorError,
    BlockStateError,
    InvalidQuota,
    InvalidSpec,
    KeyAlreadySet,
    OutOfBlocks,
    PoolClosed,
    UnknownBlock,
    ZeroizationError,
)
from kvgov.exceptions.audit import (
    AuditDatabaseMissing,
    AuditDowngradeRefused,
    AuditError,
    AuditMigrationRefused,
    AuditSchemaError,
    AuditTrailEmpty,
    AuditUnavailable,
    AuditWalIndexMissing,
    ExpectedStreamsError,
    FleetUnavailable,
    InvalidAuditEvent,
    InvalidAuditUrl,
    InvalidFleetOrder,
    InvalidTimeBound,
    MalformedAuditRow,
    SigningKeyError,
)
from kvgov.exceptions.base import InternalError, KVGovError
from kvgov.exceptions.govern import (
    BindingConfigError,
    DuplicateSequence,
    GovernError,
    InvalidArgument,
    InvalidScope,
    InvalidTokens,
    KeySecretError,
    ScopeTokenError,
    TenantPurging,
    UnknownSequence,
    UnsupportedEngine,
)
from kvgov.exceptions.offload import (
    DataKeyDestroyed,
    InvalidOffloadArgument,
    KEKError,
    KeyStoreUnavailable,
    ObjectCorrupt,
    ObjectMisbound,
    ObjectRefused,
    ObjectReplayed,
    ObjectTampered,
    OffloadError,
    TierUnavailable,
    UnknownTier,
)
from kvgov.exceptions.policy import (
    PolicyDenied,
    PolicyError,
    PolicyLoadError,
    PolicyTestFailure,
    PolicyUnavailable,
)

__all__ = [
    "AllocatorError",
    "AuditDatabaseMissing",
    "AuditDowngradeRefused",
    "AuditError",
    "AuditMigrationRefused",
    "AuditSchemaError",
    "AuditTrailEmpty",
    "AuditUnavailable",
    "AuditWalIndexMissing",
    "BindingConfigError",
    "BlockStateError",
    "DataKeyDestroyed",
    "DuplicateSequence",
    "ExpectedStreamsError",
    "FleetUnavailable",
    "GovernError",
    "InternalError",
    "InvalidArgument",
    "InvalidAuditEvent",
    "InvalidAuditUrl",
    "InvalidFleetOrder",
    "InvalidOffloadArgument",
    "InvalidQuota",
    "InvalidScope",
    "InvalidSpec",
    "InvalidTimeBound",
    "InvalidTokens",
    "KEKError",
    "KVGovError",
    "KeyAlreadySet",
    "KeySecretError",
    "KeyStoreUnavailable",
    "MalformedAuditRow",
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
    "PolicyUnavailable",
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
