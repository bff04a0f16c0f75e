"""What a client sends in a request's fields (no vLLM needed): a typed refusal, never a crash.

A request's ``extra_args`` (``vllm_xargs``) is any JSON and any Unicode: the scope
resolver, the token parser and the refusal event must turn all of it into
"admitted" or "refused, audited", never into another exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgov.audit import AuditEvent, AuditQueries, EventType, verify
from kvgov.exceptions import InvalidAuditEvent, InvalidScope, ScopeTokenError
from kvgov.govern import CacheScope, GovernedKVCache
from kvgov.govern.refusal import (
    ERROR_PATH,
    SCOPE_PATH,
    printable,
    refusal_event,
    refuse,
    request_id_problem,
)
from kvgov.govern.scope import check_scope_field
from kvgov.govern.scope_token import ScopeTokenVerifier
from kvgov.govern.vllm import BindingSettings, EngineScope, ScopeResolver, sign_scope_token

from ..conftest import FakeClock

KEY = b"front-end-key-" + b"x" * 32
ENGINE = EngineScope("llama", "r1", "llama-tok", "t1")
FIELDS = {"tenant": "acme", "classification": "internal", "template_version": "sys-v3"}
XARGS = {"kvgov_tenant": "acme", "kvgov_classification": "internal", "kvgov_template": "sys-v3"}
DEFAULTS = {
    "default_tenant": "anon",
    "default_classification": "public",
    "default_template": "none",
}

ARABIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")

# characters a client may send that break naive code: NUL, controls, lone surrogates,
# bidi overrides, other scripts' digits, superscripts, wide and zero-width spaces
NASTY = "\x00\x01\n\r\x7f\x85\ud800\udfff\u202e\u2066\u200b\ufeff\u3000\xa0²٣０𝟗Ａ"
TEXT = st.text(
    st.one_of(st.sampled_from(NASTY), st.characters(exclude_categories=())), max_size=40
) | st.sampled_from(["acme", "internal", "a" * 256, "a" * 257, "x" * 100_000, ""])
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**5000, max_value=10**5000 + 1)  # beyond int-to-text
    | st.floats()
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def _resolver(clock: FakeClock, *, require: bool = False, defaults: bool = False) -> ScopeResolver:
    settings = BindingSettings(require_scope_token=require, **(DEFAULTS if defaults else {}))
    return ScopeResolver(settings, ENGINE, ScopeTokenVerifier(KEY, clock=clock))


def _token(clock: FakeClock, ttl: int = 60, prefix: int = 0, **fields: str) -> str:
    return sign_scope_token(
        KEY, **{**FIELDS, **fields}, expires_at=int(clock()) + ttl, public_prefix_tokens=prefix
    )


# ------------------------------------------------------------------ the token's one spelling


@pytest.mark.parametrize(
    "respell",
    [
        pytest.param(lambda e, m: f"v1.{e}.{m.upper()}", id="upper-case-hex"),
        pytest.param(lambda e, m: f"v1.0{e}.{m}", id="leading-zero"),
        pytest.param(lambda e, m: f"v1. {e}.{m}", id="space"),
        pytest.param(lambda e, m: f"v1.{e}.{m} ", id="trailing-space"),
        pytest.param(lambda e, m: f"v1.{e}.{m}\n", id="trailing-newline"),
        pytest.param(lambda e, m: f"v1.+{e}.{m}", id="plus-sign"),
        pytest.param(lambda e, m: f"v1.{e[:-1]}².{m}", id="superscript-digit"),
        pytest.param(
            lambda e, m: "v1." + e.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")) + "." + m,
            id="arabic-indic-digits",
        ),
        pytest.param(
            lambda e, m: (
                "v1." + e.translate(str.maketrans("0123456789", "０１２３４５６７８９")) + "." + m
            ),
            id="fullwidth-digits",
        ),
        pytest.param(lambda e, m: f"v1.{e}_0.{m}", id="underscore"),
        pytest.param(lambda e, m: f"v1.{e}.{m[:-2]}", id="short-mac"),
        pytest.param(lambda e, m: f"v1.{e}.{m}00", id="long-mac"),
    ],
)
def test_a_token_has_one_spelling(respell: Callable[[str, str], str]) -> None:
    """Another spelling of a valid token (case, zeros, spaces, other digits) is refused
    as malformed: a ScopeTokenError, never a ValueError out of int()."""
    clock = FakeClock()
    _, expiry, mac = _token(clock).split(".")
    verifier = ScopeTokenVerifier(KEY, clock=clock)
    verifier.verify(f"v1.{expiry}.{mac}", **FIELDS)  # the one spelling
    with pytest.raises(ScopeTokenError, match="of the form"):
        verifier.verify(respell(expiry, mac), **FIELDS)


def test_an_expiry_beyond_u64_is_refused_not_raised() -> None:
    """20 digits may exceed 2**64 - 1: refused as a token error."""
    token = f"v1.{2**64}.{'0' * 64}"
    with pytest.raises(ScopeTokenError, match="2\\*\\*64"):
        ScopeTokenVerifier(KEY, clock=FakeClock()).verify(token, **FIELDS)


@pytest.mark.parametrize(
    "tenant", ["acme\ud800", "acme\x00", "\u202eemca", "a" * 257, "", 7, ["acme"]]
)
def test_fields_are_checked_before_the_token(tenant: Any) -> None:
    """A field the audit store cannot hold is refused (InvalidScope) before any encoding:
    a lone surrogate raised UnicodeEncodeError out of the verifier before."""
    clock = FakeClock()
    with pytest.raises(InvalidScope):
        ScopeTokenVerifier(KEY, clock=clock).verify(_token(clock), **{**FIELDS, "tenant": tenant})
    with pytest.raises(InvalidScope):
        sign_scope_token(KEY, **{**FIELDS, "tenant": tenant}, expires_at=int(clock()) + 60)


# ------------------------------------------------------------------ scope resolution


@pytest.mark.parametrize(
    "xargs",
    [
        {**XARGS, "kvgov_tenant": "acme\ud800"},
        {**XARGS, "kvgov_tenant": "\u202eemca"},
        {**XARGS, "kvgov_classification": "internal\x00"},
        {**XARGS, "kvgov_template": "x" * 100_000},
        {**XARGS, "kvgov_tenant": 10**5000},
        {**XARGS, "kvgov_tenant": {"nested": ["acme"]}},
        ["kvgov_tenant", "acme"],
    ],
)
@pytest.mark.parametrize("require", [False, True])
def test_a_bad_field_is_refused_as_invalid_scope(xargs: Any, require: bool) -> None:
    """Lone surrogates, bidi overrides, NUL, huge strings, huge ints, objects, a non-mapping:
    InvalidScope whose message is short and printable (the client and the audit get it)."""
    with pytest.raises(InvalidScope) as info:
        _resolver(FakeClock(), require=require).resolve(xargs, None)
    message = str(info.value)
    assert message.isprintable() and len(message) < 400


@pytest.mark.parametrize("xargs", [None, {}, dict.fromkeys(XARGS)])
def test_require_scope_token_covers_the_defaulted_scope(xargs: Any) -> None:
    """With require_scope_token and default scope settings, a request naming no scope (or
    null fields) needs a token too; one signing the default values is admitted."""
    clock = FakeClock()
    resolver = _resolver(clock, require=True, defaults=True)
    with pytest.raises(ScopeTokenError, match="no kvgov_scope_token"):
        resolver.resolve(xargs, None)
    token = _token(clock, tenant="anon", classification="public", template_version="none")
    scope = resolver.resolve({**(xargs or {}), "kvgov_scope_token": token}, None)
    assert (scope.tenant, scope.classification, scope.template_version) == (
        "anon",
        "public",
        "none",
    )
    with pytest.raises(ScopeTokenError, match="does not match"):  # a token for other fields
        resolver.resolve({**(xargs or {}), "kvgov_scope_token": _token(clock)}, None)


def test_a_public_prefix_resolves_only_under_a_token_that_signs_it() -> None:
    """resolve_request returns the prefix a v2 token signs; the same request with a v1
    token (a client adding a prefix to a signed request) is refused; resolve(), for a
    binding without public prefixes (SGLang), refuses any prefix instead of ignoring it."""
    clock = FakeClock()
    resolver = _resolver(clock, require=True)
    xargs = {**XARGS, "kvgov_public_prefix_tokens": 64}
    scope, prefix = resolver.resolve_request(
        {**xargs, "kvgov_scope_token": _token(clock, prefix=64)}, None
    )
    assert (scope.tenant, prefix) == ("acme", 64)
    with pytest.raises(ScopeTokenError, match="needs a v2 scope token"):
        resolver.resolve_request({**xargs, "kvgov_scope_token": _token(clock)}, None)
    with pytest.raises(InvalidScope, match="offers no public prefixes"):
        resolver.resolve({**xargs, "kvgov_scope_token": _token(clock, prefix=64)}, None)
    unsigned = _resolver(clock)  # no token required: a trusted front end's plain fields
    assert unsigned.resolve_request(xargs, None)[1] == 64
    assert unsigned.resolve_request(XARGS, None)[1] == 0


def test_without_require_a_defaulted_scope_needs_no_token() -> None:
    """require_scope_token off: the defaults admit an unscoped request unsigned (as documented)."""
    scope = _resolver(FakeClock(), defaults=True).resolve(None, None)
    assert scope.tenant == "anon"


@pytest.mark.parametrize(
    ("default", "value"),
    [
        ("default_tenant", "anon\x00"),
        ("default_classification", "\u202epublic"),
        ("default_template", ""),
    ],
)
def test_an_invalid_default_refuses_each_request_that_falls_back_on_it(
    default: str, value: str
) -> None:
    """Defaults are checked once, when the resolver is built; one that is not a valid scope
    field still refuses (InvalidScope) every request that relies on it, and only those."""
    settings = BindingSettings(**{**DEFAULTS, default: value})
    resolver = ScopeResolver(settings, ENGINE, None)
    for _ in range(2):
        with pytest.raises(InvalidScope):
            resolver.resolve(None, None)
    scope = resolver.resolve(XARGS, None)  # every field given: the default is not used
    assert (scope.tenant, scope.classification, scope.template_version) == (
        "acme",
        "internal",
        "sys-v3",
    )


SCOPE_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "kvgov_tenant": JSON | st.sampled_from(["acme", "anon"]),
        "kvgov_classification": JSON | st.just("internal"),
        "kvgov_template": JSON | st.just("sys-v3"),
        "kvgov_scope_token": JSON | st.just("sign"),
        "kvgov_public_prefix_tokens": JSON | st.integers(0, 300),
    },
)


@settings(max_examples=300, deadline=None)
@given(xargs=st.one_of(SCOPE_ARGS, JSON), require=st.booleans(), defaults=st.booleans())
def test_any_extra_args_resolve_or_are_refused(xargs: Any, require: bool, defaults: bool) -> None:
    """Any JSON as extra_args: a scope, or InvalidScope / ScopeTokenError; with tokens
    required, a scope only under a valid token over exactly its fields."""
    clock = FakeClock()
    if isinstance(xargs, dict) and xargs.get("kvgov_scope_token") == "sign":
        signed = {k: xargs.get(f"kvgov_{k}") for k in ("tenant", "classification", "template")}
        if all(isinstance(v, str) and v for v in signed.values()):
            with contextlib.suppress(InvalidScope):  # an invalid field: left unsigned
                xargs["kvgov_scope_token"] = _token(
                    clock,
                    tenant=signed["tenant"],
                    classification=signed["classification"],
                    template_version=signed["template"],
                    prefix=xargs.get("kvgov_public_prefix_tokens") or 0,
                )
    resolver = _resolver(clock, require=require, defaults=defaults)
    try:
        scope, prefix = resolver.resolve_request(xargs, None)
    except (InvalidScope, ScopeTokenError) as exc:
        assert str(exc).isprintable()
        return
    assert isinstance(scope, CacheScope)
    assert type(prefix) is int and prefix >= 0
    if prefix:  # a binding without public prefixes refuses it
        with pytest.raises(InvalidScope, match="offers no public prefixes"):
            resolver.resolve(xargs, None)
    else:
        assert resolver.resolve(xargs, None) == scope
    if require:
        assert isinstance(xargs, dict)
        assert isinstance(xargs.get("kvgov_scope_token"), str)
        ScopeTokenVerifier(KEY, clock=clock).verify(
            xargs["kvgov_scope_token"],
            tenant=scope.tenant,
            classification=scope.classification,
            template_version=scope.template_version,
            public_prefix_tokens=prefix,
        )


@settings(max_examples=200, deadline=None)
@given(token=JSON, tenant=JSON)
def test_any_token_and_fields_verify_or_are_refused(token: Any, tenant: Any) -> None:
    """The verifier raises InvalidScope or ScopeTokenError for anything, never another error."""
    with pytest.raises((InvalidScope, ScopeTokenError)):
        ScopeTokenVerifier(KEY, clock=FakeClock()).verify(token, **{**FIELDS, "tenant": tenant})


# ------------------------------------------------------------------ the refusal event


@pytest.fixture()
def cache(make_cache: Callable[..., GovernedKVCache]) -> Iterator[GovernedKVCache]:
    yield make_cache()


def test_a_lone_surrogate_tenant_is_refused_and_audited(
    cache: GovernedKVCache, audit_url: str
) -> None:
    """The tenant of item 4 without a token: its refusal event is valid and written, its
    claimed tenant escaped; the chain verifies."""
    xargs = {**XARGS, "kvgov_tenant": "acme\ud800\u202e"}
    with pytest.raises((InvalidScope, ScopeTokenError)) as info:
        _resolver(FakeClock(), require=True).resolve(xargs, None)
    message = refuse(
        cache.governor.ledger, cache.governor.audit, "req-1", 12, str(info.value), xargs
    )
    assert message.startswith("kvgov: ") and message.isprintable()
    cache.audit.flush()
    with AuditQueries(audit_url) as q:
        (event,) = q.events(type="policy_denied")
    assert event.sequence_id == "req-1" and event.token_count == 12
    assert event.details["path"] == SCOPE_PATH
    assert event.details["claimed"]["kvgov_tenant"] == "acme\\ud800\\u202e"
    assert event.details["claimed"]["kvgov_classification"] == "internal"
    assert event.decision_id is not None and event.decision_id in message
    assert verify(audit_url).ok


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seq_id=TEXT, num_tokens=st.integers(), reason=TEXT, xargs=st.one_of(SCOPE_ARGS, JSON))
def test_any_refusal_is_audited(
    cache: GovernedKVCache, seq_id: str, num_tokens: int, reason: str, xargs: Any
) -> None:
    """Whatever the request id, reason and extra_args hold, the refusal event constructs,
    every text in it is printable, and refuse() records it and never raises."""
    event = refusal_event(seq_id, num_tokens, reason, xargs, decision_id="d", path=ERROR_PATH)
    assert event.details["reason"].isprintable()
    assert event.sequence_id is not None and event.sequence_id.isprintable()
    assert all(v.isprintable() for v in event.details["claimed"].values())
    before = cache.audit.stats().recorded
    message = refuse(cache.governor.ledger, cache.governor.audit, seq_id, num_tokens, reason, xargs)
    assert message.startswith("kvgov: ") and "could not be audited" not in message
    assert message.isprintable()
    assert cache.audit.stats().recorded == before + 1


@settings(max_examples=300, deadline=None)
@given(seq_id=TEXT | st.sampled_from(["r" * 256, "r" * 257, "id\x00", "id\udfff", "id\n\u202e"]))
def test_a_request_id_is_refused_exactly_when_it_cannot_be_a_sequence_id(seq_id: str) -> None:
    """Issue #25 leftover: vLLM's request id (a client's X-Request-Id) becomes the
    sequence_id of the admission event written inside vLLM's schedule(); admit refuses
    exactly the ids that event would raise on, and their refusal event constructs."""
    problem = request_id_problem(seq_id)
    try:
        AuditEvent(type=EventType.ADMISSION, tenant="acme", sequence_id=seq_id)
    except InvalidAuditEvent as exc:
        assert exc.field == "sequence_id"
        assert problem is not None and problem.startswith("the request id ")
        event = refusal_event(seq_id, 1, problem, None, decision_id="d")
        assert event.sequence_id == printable(seq_id, 256)
    else:
        assert problem is None


def test_printable_escapes_and_bounds() -> None:
    """Non-printable characters become escapes; the length bound holds."""
    assert printable("a\x00\ud800\u202e\U000e0001b", 100) == "a\\x00\\ud800\\u202e\\U000e0001b"
    assert printable("x" * 5000, 10) == "x" * 10
    assert printable("\x00" * 50, 10) == "\\x00\\x00\\x"
    assert check_scope_field("tenant", "acme") == "acme"
