"""What a client sends, through vLLM's scheduler: every request admitted or refused and
audited, never an exception out of ``add_request``."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgov.exceptions import InvalidScope
from kvgov.govern.scope_token import sign_scope_token

from .test_client_fields import JSON, SCOPE_ARGS, TEXT

pytestmark = pytest.mark.vllm

PROMPT = list(range(300, 400))
TOKEN_KEY = b"t" * 40
DEFAULTS = {"default_tenant": "anon", "default_classification": "public", "default_template": "n"}


@pytest.fixture()
def signed(vllm: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("KVGOV_SCOPE_TOKEN_KEY", TOKEN_KEY.decode())
    return vllm.scheduler(kvgov={"require_scope_token": True, **DEFAULTS})


def _token(clock: Any, tenant: str = "acme") -> str:
    return sign_scope_token(
        TOKEN_KEY,
        tenant=tenant,
        classification="internal",
        template_version="sys-v3",
        expires_at=int(clock()) + 60,
    )


def _refused(vllm: Any, sched: Any, req: Any) -> Any:
    """add_request does not raise; the request finishes with kvgov's reason, one event."""
    run = vllm.run(sched, req)
    out = run.finals[req.request_id]
    assert out.finish_reason.name == "ERROR" and out.stop_reason.startswith("kvgov: ")
    assert out.stop_reason.isprintable()
    (event,) = [
        e for e in vllm.events(sched, type="policy_denied") if e.sequence_id == req.request_id
    ]
    assert event.decision_id in out.stop_reason
    return out, event


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("superscript-expiry", "of the form"),
        ("upper-case-mac", "of the form"),
        ("surrogate-tenant-with-token", "lone surrogate"),
        ("surrogate-tenant-no-token", "lone surrogate"),
        ("bidi-tenant", "printable"),
        ("surrogate-cache-salt", "lone surrogate"),
    ],
)
def test_the_issue_cases_are_refused_and_audited(
    vllm: Any, signed: Any, clock: Any, case: str, why: str
) -> None:
    """Issue #25 item 4: a ``²`` expiry, a lone-surrogate tenant with and without a token, a
    bidi override, a lone-surrogate cache salt: refused with the reason and audited (they
    raised out of add_request, or broke the refusal event, before)."""
    good = _token(clock)
    _, expiry, mac = good.split(".")
    tenant, token, salt = "acme", good, None
    if case == "superscript-expiry":
        token = f"v1.{expiry[:-1]}².{mac}"
    elif case == "upper-case-mac":
        token = f"v1.{expiry}.{mac.upper()}"
    elif case == "surrogate-tenant-with-token":
        tenant, token = "acme\ud800", f"v1.{expiry}.{'0' * 64}"
    elif case == "surrogate-tenant-no-token":
        tenant, token = "acme\ud800", None
    elif case == "bidi-tenant":
        tenant = "\u202eemca"
    else:
        salt = "salt\ud800"
    xargs = {} if token is None else {"kvgov_scope_token": token}
    req = vllm.request("x", PROMPT, tenant=tenant, xargs=xargs, salt=salt)
    out, event = _refused(vllm, signed, req)
    assert why in out.stop_reason
    shown = {"acme\ud800": "acme\\ud800", "\u202eemca": "\\u202eemca"}.get(tenant, tenant)
    assert event.details["claimed"]["kvgov_tenant"] == shown


def test_require_scope_token_covers_the_defaulted_scope(vllm: Any, signed: Any) -> None:
    """Issue #25 item 5: no kvgov_* fields, or all null, with defaults set and tokens
    required: refused, not admitted unsigned as the default tenant."""
    for i, xargs in enumerate([{}, dict.fromkeys(("kvgov_tenant", "kvgov_classification"))]):
        req = vllm.request(f"d{i}", PROMPT, tenant=None, classification=None, template=None)
        req.sampling_params.extra_args = xargs or None
        out, _ = _refused(vllm, signed, req)
        assert "no kvgov_scope_token" in out.stop_reason
    assert vllm.events(signed, type="admission") == []


def test_an_unexpected_error_refuses_and_audits(vllm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything admit did not expect is a refusal (path kvgov.vllm/error), audited; the
    client sees the error's type, not its text."""
    sched = vllm.scheduler()

    def boom(*args: Any) -> Any:
        raise RuntimeError("internal detail \ud800")

    monkeypatch.setattr(type(sched.kvgov.resolver), "resolve_request", boom)
    out, event = _refused(vllm, sched, vllm.request("x", PROMPT))
    assert "RuntimeError" in out.stop_reason and "internal detail" not in out.stop_reason
    assert event.details["path"] == "kvgov.vllm/error"
    assert event.details["reason"] == out.stop_reason.removeprefix("kvgov: ").split(" (decision")[0]


_ids = itertools.count()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    xargs=st.one_of(SCOPE_ARGS, JSON),
    salt=st.none() | TEXT,
    lora=st.none() | st.tuples(TEXT, TEXT),
)
def test_any_request_fields_are_admitted_or_refused_and_audited(
    vllm: Any, signed: Any, clock: Any, xargs: Any, salt: Any, lora: Any
) -> None:
    """Property: any extra_args (any JSON, any Unicode), cache salt and adapter name/path:
    admit returns None (admitted, keyed) or a printable "kvgov: ..." refusal with exactly
    one more audit event; it never raises."""
    if isinstance(xargs, dict) and xargs.get("kvgov_scope_token") == "sign":
        fields = [xargs.get(k) for k in ("kvgov_tenant", "kvgov_classification")]
        if all(isinstance(f, str) for f in fields) and xargs.get("kvgov_template") == "sys-v3":
            with contextlib.suppress(InvalidScope):  # an invalid field: the token stays "sign"
                xargs["kvgov_scope_token"] = _token(clock, tenant=fields[0])
    lora_args = None
    if lora is not None and lora[0] and lora[1]:
        lora_args = lora
    req = vllm.request(
        f"p{next(_ids)}",
        PROMPT,
        tenant=None,
        classification=None,
        template=None,
        salt=salt or None,
        lora=lora_args,
    )
    req.sampling_params.extra_args = xargs
    audit = signed.kvgov.gov.audit
    before = audit.stats().recorded
    refusal = signed.kvgov.admit(req)
    if refusal is None:
        assert req._kvgov is not None and audit.stats().recorded == before
    else:
        assert refusal.startswith("kvgov: ") and refusal.isprintable()
        assert "could not be audited" not in refusal
        assert audit.stats().recorded == before + 1


@pytest.mark.parametrize(
    ("req_id", "why", "shown"),
    [
        ("r" * 257, "257 characters long", "r" * 256),
        ("id\x00", "NUL", "id\\x00"),
        ("id\ud800", "lone surrogate", "id\\ud800"),
    ],
    ids=["too-long", "nul", "lone-surrogate"],
)
def test_a_request_id_the_audit_trail_cannot_hold_is_refused(
    vllm: Any, req_id: str, why: str, shown: str
) -> None:
    """Issue #25 leftover: the request id (a client's X-Request-Id over the OpenAI server)
    is the admission event's sequence_id, written inside schedule(); an id that event
    cannot hold raised InvalidAuditEvent there, crashing the engine. Now admit refuses it,
    audited with the id escaped, and the engine serves the next request."""
    sched = vllm.scheduler()
    req = vllm.request(req_id, PROMPT)
    run = vllm.run(sched, req)
    out = run.finals[req_id]
    assert out.finish_reason.name == "ERROR" and why in out.stop_reason
    assert out.stop_reason.isprintable()
    (event,) = vllm.events(sched, type="policy_denied")
    assert event.sequence_id == shown and event.decision_id in out.stop_reason
    assert event.details["path"] == "kvgov.vllm/scope"
    ok = vllm.request("ok", PROMPT)
    assert vllm.run(sched, ok).finals["ok"].finish_reason.name != "ERROR"
    assert [e.sequence_id for e in vllm.events(sched, type="admission")] == ["ok"]
