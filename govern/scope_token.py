"""Signed scope tokens: how a trusted front end proves to the engine that it set a request's scope.

The scope of a request (tenant, classification, template version) reaches the
engine in the request's ``extra_args`` (the OpenAI server's ``vllm_xargs``),
which a client can write too. A front end that authenticates the caller sets
those fields (and strips any the client sent), then signs them with a key it
shares with the engine; the engine recomputes the MAC and refuses a request
whose token is missing, expired or does not match. This module needs no vLLM:
a front end imports it to sign. Byte layout (integers big-endian)::

    message = b"kvgov.scope-token.v1" 0x00
              || field(tenant) || field(classification) || field(template_version)
              || expires_at as u64                    (seconds since the epoch, UTC)
    mac     = HMAC-SHA256(key, message)
    token   = "v1." || decimal(expires_at) || "." || hex(mac)     (lowercase, 64 digits)

A request with a public prefix (``kvgov_public_prefix_tokens``: its first N prompt
tokens are public, a system prompt, see docs/vllm.md) carries a ``v2`` token, which
signs N too, so a client cannot declare its own prompt public::

    message = b"kvgov.scope-token.v2" 0x00
              || field(tenant) || field(classification) || field(template_version)
              || public_prefix_tokens as u32 (1 .. 2**32-1)
              || expires_at as u64
    token   = "v2." || decimal(expires_at) || "." || hex(mac)

A request without one carries a ``v1`` token: a ``v1`` token never covers a prefix
and a ``v2`` token always does, so neither verifies in the other's place.

The engine parses a token strictly, so a token has one spelling: ``v1`` or ``v2``, a dot,
the expiry as 1 to 20 ASCII digits without a leading zero (``0|[1-9][0-9]{0,19}``,
below 2**64), a dot, and the MAC as exactly 64 lowercase hex digits
(``[0-9a-f]{64}``); no sign, space, upper-case hex or other script's digits.
The three fields must be valid scope fields
(:func:`kvgov.govern.scope.check_scope_field`: non-empty printable strings of
at most 256 characters, no NUL, no lone surrogate), on both sides.

``field`` is the length-prefixed field of :mod:`kvgov.govern.keys`, so no
choice of strings makes two scopes sign alike. The token binds the scope and an
expiry, not the request: within its lifetime it can be replayed by whoever
holds it, so the engine refuses tokens valid for longer than
``scope_token_max_ttl`` from when they arrive (default
:data:`kvgov.defaults.SCOPE_TOKEN_MAX_TTL_SECONDS`), and the front end should
mint one per request.
"""

from __future__ import annotations

import hmac
import math
import re
import time
from collections.abc import Callable

from kvgov.defaults import MIN_SCOPE_TOKEN_KEY_BYTES, SCOPE_TOKEN_MAX_TTL_SECONDS
from kvgov.exceptions import BindingConfigError, InvalidScope, ScopeTokenError

from .keys import encode_field
from .scope import check_scope_field

__all__ = [
    "MAX_PUBLIC_PREFIX_TOKENS",
    "PUBLIC_PREFIX_FIELD",
    "ScopeTokenVerifier",
    "check_public_prefix",
    "scope_token_message",
    "sign_scope_token",
]

_TAG = b"kvgov.scope-token.v1\x00"
#: The tag of a token that signs a public prefix too.
_TAG_V2 = b"kvgov.scope-token.v2\x00"
#: The one spelling of a token: version, ASCII decimal expiry (no leading zero), lowercase
#: hex MAC.
_TOKEN = re.compile(r"(v1|v2)\.(0|[1-9][0-9]{0,19})\.([0-9a-f]{64})")
_FORM = (
    "kvgov_scope_token must be of the form v1.<expiry>.<mac> or v2.<expiry>.<mac> "
    "(decimal, 64 lowercase hex)"
)
#: The request field (``extra_args`` key) of a public prefix's token count.
PUBLIC_PREFIX_FIELD = "kvgov_public_prefix_tokens"
#: The most tokens a public prefix may declare (it is signed as a u32).
MAX_PUBLIC_PREFIX_TOKENS = 2**32 - 1


def check_public_prefix(value: object) -> int:
    """A public prefix's token count as a request or a front end gives it.

    Raises:
        InvalidScope: not an int (``bool`` is not one) in ``0..2**32-1``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidScope(PUBLIC_PREFIX_FIELD, f"<{type(value).__name__}>", "must be an int")
    if not 0 <= value <= MAX_PUBLIC_PREFIX_TOKENS:
        raise InvalidScope(PUBLIC_PREFIX_FIELD, value, f"must be in 0..{MAX_PUBLIC_PREFIX_TOKENS}")
    return value


def scope_token_message(
    *,
    tenant: str,
    classification: str,
    template_version: str,
    expires_at: int,
    public_prefix_tokens: int = 0,
) -> bytes:
    """The bytes a scope token's MAC covers (layout in the module docstring): a ``v1``
    token's without a public prefix, a ``v2`` token's with one.

    Raises:
        InvalidScope: a field is not a valid scope field (not a non-empty printable
            string of at most 256 characters the audit store can hold), or
            ``public_prefix_tokens`` not an int in ``0..2**32-1``.
        ScopeTokenError: ``expires_at`` is not an int in ``0..2**64-1``.
    """
    check_scope_field("tenant", tenant)
    check_scope_field("classification", classification)
    check_scope_field("template_version", template_version)
    if isinstance(expires_at, bool) or not isinstance(expires_at, int) or not expires_at >= 0:
        raise ScopeTokenError(f"expires_at must be a non-negative int, got {expires_at!r}")
    if expires_at >= 2**64:
        raise ScopeTokenError("expires_at must be below 2**64")
    prefix = check_public_prefix(public_prefix_tokens)
    fields = encode_field(tenant) + encode_field(classification) + encode_field(template_version)
    if prefix:
        return _TAG_V2 + fields + prefix.to_bytes(4, "big") + expires_at.to_bytes(8, "big")
    return _TAG + fields + expires_at.to_bytes(8, "big")


def _check_key(key: bytes, setting: str) -> bytes:
    if not isinstance(key, bytes | bytearray) or len(key) < MIN_SCOPE_TOKEN_KEY_BYTES:
        raise BindingConfigError(
            setting,
            "<hidden>",
            f"the scope-token key must be at least {MIN_SCOPE_TOKEN_KEY_BYTES} bytes",
        )
    return bytes(key)


def sign_scope_token(
    key: bytes,
    *,
    tenant: str,
    classification: str,
    template_version: str,
    expires_at: int,
    public_prefix_tokens: int = 0,
) -> str:
    """Sign a scope for the engine (the front end's side).

    Args:
        key: the key shared with the engine (``KVGOV_SCOPE_TOKEN_KEY``), at least 32 bytes.
        tenant: the tenant the front end authenticated.
        classification: the request's data classification.
        template_version: the prompt-template version.
        expires_at: when the token stops being valid, seconds since the epoch (keep it
            a few seconds to minutes ahead: the engine refuses more than its maximum).
        public_prefix_tokens: how many leading prompt tokens are public (the system
            prompt the front end put there), sent beside the token as
            ``kvgov_public_prefix_tokens``; 0 (the default): none, a ``v1`` token.

    Returns:
        The token, to send as ``kvgov_scope_token`` beside the three fields (and the
        public prefix, if any).

    Raises:
        BindingConfigError: the key is shorter than 32 bytes.
        InvalidScope: a field is not a valid scope field, or ``public_prefix_tokens``
            not an int in ``0..2**32-1``.
        ScopeTokenError: ``expires_at`` is not an int in ``0..2**64-1``.
    """
    message = scope_token_message(
        tenant=tenant,
        classification=classification,
        template_version=template_version,
        expires_at=expires_at,
        public_prefix_tokens=public_prefix_tokens,
    )
    mac = hmac.digest(_check_key(key, "scope_token_key"), message, "sha256")
    return f"{'v2' if public_prefix_tokens else 'v1'}.{expires_at}.{mac.hex()}"


class ScopeTokenVerifier:
    """Checks scope tokens against the scope fields they came with (the engine's side).

    Args:
        key: the key shared with the front end, at least 32 bytes.
        max_ttl: the longest a token may still be valid for when it arrives, seconds.
        clock: seconds since the epoch.

    Raises:
        BindingConfigError: a short key or a max_ttl that is not a positive number.
    """

    __slots__ = ("_clock", "_key", "_max_ttl")

    def __init__(
        self,
        key: bytes,
        *,
        max_ttl: float = SCOPE_TOKEN_MAX_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = _check_key(key, "scope_token_key")
        if isinstance(max_ttl, bool) or not isinstance(max_ttl, int | float):
            raise BindingConfigError("scope_token_max_ttl", max_ttl, "a number of seconds > 0")
        if not math.isfinite(max_ttl) or max_ttl <= 0:
            raise BindingConfigError("scope_token_max_ttl", max_ttl, "a number of seconds > 0")
        self._max_ttl = float(max_ttl)
        self._clock = clock

    def __repr__(self) -> str:
        return f"ScopeTokenVerifier(key=<hidden>, max_ttl={self._max_ttl})"

    def verify(
        self,
        token: object,
        *,
        tenant: str,
        classification: str,
        template_version: str,
        public_prefix_tokens: int = 0,
    ) -> None:
        """Accept the token for exactly these fields, or raise.

        Raises:
            InvalidScope: a field is not a valid scope field (checked first, so a field
                the audit store cannot hold is refused, not encoded), or the public
                prefix is not an int in ``0..2**32-1``.
            ScopeTokenError: no token, not exactly of the form ``v1.<expiry>.<mac>``
                (``v2`` with a public prefix), expired, valid for longer than the
                maximum, or not the MAC of these fields.
        """
        prefix = check_public_prefix(public_prefix_tokens)
        message_fields = {
            "tenant": check_scope_field("tenant", tenant),
            "classification": check_scope_field("classification", classification),
            "template_version": check_scope_field("template_version", template_version),
        }
        if token is None:
            raise ScopeTokenError(
                "the request carries no kvgov_scope_token; the front end must sign the "
                "scope it sets (kvgov.govern.scope_token.sign_scope_token)"
            )
        match = _TOKEN.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            raise ScopeTokenError(_FORM)
        if (match[1] == "v2") != bool(prefix):
            raise ScopeTokenError(
                "a request with kvgov_public_prefix_tokens needs a v2 scope token that signs "
                "it, and one without needs a v1 token"
            )
        expires_at = int(match[2])
        if expires_at >= 2**64:
            raise ScopeTokenError("the token's expiry is beyond 2**64 - 1")
        mac = bytes.fromhex(match[3])
        now = self._clock()
        if expires_at <= now:
            raise ScopeTokenError(f"the token expired at {expires_at} (now {int(now)})")
        if expires_at > now + self._max_ttl:
            raise ScopeTokenError(
                f"the token is valid until {expires_at}, more than {self._max_ttl:g} s ahead; "
                "mint short-lived tokens"
            )
        expected = hmac.digest(
            self._key,
            scope_token_message(
                **message_fields, expires_at=expires_at, public_prefix_tokens=prefix
            ),
            "sha256",
        )
        if not hmac.compare_digest(mac, expected):
            raise ScopeTokenError(
                "the token does not match the request's scope (forged, or signed for another "
                "tenant, classification, template version or public prefix)"
            )
