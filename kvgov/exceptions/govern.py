"""Errors of the governed cache and its bindings (``kvgov.govern``).

Import them from :mod:`kvgov.exceptions`, never from here.
"""

from __future__ import annotations

from kvgov.exceptions.base import KVGovError


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
    sign the scope it sets (see ``kvgov.govern.scope_token``).

    Args:
        reason: what is wrong with the token.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"scope token refused: {reason}")
