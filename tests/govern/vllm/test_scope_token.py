"""Signed scope tokens (no vLLM needed): layout, verification, every way a token is refused."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from kvgov.exceptions import BindingConfigError, InvalidScope, ScopeTokenError
from kvgov.govern.scope_token import (
    MAX_PUBLIC_PREFIX_TOKENS,
    ScopeTokenVerifier,
    check_public_prefix,
    scope_token_message,
    sign_scope_token,
)
from tests.support.clock import FakeClock

KEY = b"front-end-key-" + b"x" * 32
FIELDS = {"tenant": "acme", "classification": "internal", "template_version": "sys-v3"}


def _sign(clock: FakeClock, ttl: int = 60, key: bytes = KEY, **fields: Any) -> str:
    return sign_scope_token(key, **{**FIELDS, **fields}, expires_at=int(clock()) + ttl)


@pytest.mark.parametrize(
    ("prefix", "version", "signed_prefix"),
    [(0, "v1", b""), (64, "v2", (64).to_bytes(4, "big"))],
    ids=["v1", "v2-public-prefix"],
)
def test_the_message_is_length_prefixed_fields_a_u32_prefix_and_a_u64_expiry(
    prefix: int, version: str, signed_prefix: bytes
) -> None:
    """The signed bytes are the documented layout (a separate encoder recomputes them):
    v1 without a public prefix, v2 (its own tag, the prefix as a u32) with one."""

    def field(v: str) -> bytes:
        raw = v.encode()
        return b"\x01" + len(raw).to_bytes(4, "big") + raw

    expected = (
        f"kvgov.scope-token.{version}\x00".encode()
        + field("acme")
        + field("internal")
        + field("sys-v3")
        + signed_prefix
        + (1_700_000_060).to_bytes(8, "big")
    )
    signed = {"expires_at": 1_700_000_060, "public_prefix_tokens": prefix}
    assert scope_token_message(**FIELDS, **signed) == expected
    token = sign_scope_token(KEY, **FIELDS, **signed)
    assert token == f"{version}.1700000060." + hmac.digest(KEY, expected, hashlib.sha256).hex()


def test_a_token_over_exactly_these_fields_verifies() -> None:
    """The engine accepts the front end's token for the fields it signed."""
    clock = FakeClock()
    ScopeTokenVerifier(KEY, clock=clock).verify(_sign(clock), **FIELDS)


@pytest.mark.parametrize(
    ("token", "fields", "why"),
    [
        (None, {}, "no kvgov_scope_token"),
        (7, {}, "v1.<expiry>.<mac>"),
        ("v1.abc.00", {}, "v1.<expiry>.<mac>"),
        ("v2.1700000060.00", {}, "v1.<expiry>.<mac>"),
        ("v1.1700000060.zz", {}, "v1.<expiry>.<mac>"),
        ("sign:other-tenant", {}, "does not match"),
        ("sign:ok", {"classification": "public"}, "does not match"),
        ("sign:ok", {"template_version": "sys-v4"}, "does not match"),
        ("sign:other-key", {}, "does not match"),
        ("sign:expired", {}, "expired"),
        ("sign:too-long", {}, "short-lived"),
        ("x" * 500, {}, "v1.<expiry>.<mac>"),
    ],
)
def test_every_bad_token_is_refused(token: Any, fields: dict[str, str], why: str) -> None:
    """Missing, malformed, forged, for another scope, expired, or valid for too long: refused."""
    clock = FakeClock()
    if token == "sign:other-tenant":
        token = _sign(clock, tenant="globex")
    elif token == "sign:ok":
        token = _sign(clock)
    elif token == "sign:other-key":
        token = _sign(clock, key=b"k" * 40)
    elif token == "sign:expired":
        token = _sign(clock, ttl=0)
    elif token == "sign:too-long":
        token = _sign(clock, ttl=301)
    with pytest.raises(ScopeTokenError, match=why.replace(".", r"\.")):
        ScopeTokenVerifier(KEY, clock=clock).verify(token, **{**FIELDS, **fields})


def test_separator_games_do_not_collide() -> None:
    """("a|b", "c") and ("a", "b|c") sign differently."""
    one = scope_token_message(tenant="a|b", classification="c", template_version="t", expires_at=1)
    two = scope_token_message(tenant="a", classification="b|c", template_version="t", expires_at=1)
    assert one != two


@pytest.mark.parametrize("key", [b"short", "a-str-key-of-enough-length-xxxxxxxxxxxx"])
def test_a_short_or_non_bytes_key_is_refused(key: Any) -> None:
    """The key must be at least 32 bytes, on both sides."""
    with pytest.raises(BindingConfigError):
        ScopeTokenVerifier(key)
    with pytest.raises(BindingConfigError):
        sign_scope_token(key, **FIELDS, expires_at=1)


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), True, "60"])
def test_max_ttl_must_be_a_positive_number(ttl: Any) -> None:
    """A non-positive, non-finite or non-number maximum lifetime is a configuration error."""
    with pytest.raises(BindingConfigError):
        ScopeTokenVerifier(KEY, max_ttl=ttl)


def test_the_key_never_shows_in_a_repr() -> None:
    """Logs and tracebacks do not reveal the key."""
    assert "front-end-key" not in repr(ScopeTokenVerifier(KEY))


@pytest.mark.parametrize(
    ("signed", "sent", "why"),
    [
        (64, 64, None),
        (0, 0, None),
        (0, 64, "needs a v2 scope token"),  # a client declaring its prompt public
        (64, 0, "needs a v1 token"),  # the prefix dropped from a signed request
        (64, 128, "does not match"),  # a longer prefix than the front end signed
    ],
)
def test_a_public_prefix_verifies_only_as_signed(signed: int, sent: int, why: str | None) -> None:
    clock = FakeClock()
    token = _sign(clock, public_prefix_tokens=signed)
    verifier = ScopeTokenVerifier(KEY, clock=clock)
    if why is None:
        verifier.verify(token, **FIELDS, public_prefix_tokens=sent)
        return
    with pytest.raises(ScopeTokenError, match=why):
        verifier.verify(token, **FIELDS, public_prefix_tokens=sent)


@pytest.mark.parametrize("value", [-1, 2**32, True, "64", 6.4, None])
def test_a_malformed_public_prefix_is_refused_on_both_sides(value: Any) -> None:
    clock = FakeClock()
    with pytest.raises(InvalidScope, match="kvgov_public_prefix_tokens"):
        _sign(clock, public_prefix_tokens=value)
    with pytest.raises(InvalidScope, match="kvgov_public_prefix_tokens"):
        ScopeTokenVerifier(KEY, clock=clock).verify(
            _sign(clock), **FIELDS, public_prefix_tokens=value
        )
    assert check_public_prefix(MAX_PUBLIC_PREFIX_TOKENS) == 2**32 - 1
