"""The OPA server engine against a local HTTP server speaking OPA's data API, answering
with OPA itself (the reference engine)."""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.exceptions import PolicyError
from kvgov.policy.cache import CachedEngine
from kvgov.policy.client import PolicyClient
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import PolicyEngine
from kvgov.policy.opa_server import OpaServerEngine
from kvgov.policy.reference import ReferenceEngine
from tests.policy.opa_fake import FakeOpa

ADMISSION = "kvgov/admission/decision"


def request(scope: dict[str, Any]) -> dict[str, Any]:
    return {"scope": scope, "tokens": 8, "priority": None}


def test_is_a_policy_engine(fake_opa: FakeOpa) -> None:
    """The OPA server engine satisfies the PolicyEngine protocol."""
    e = OpaServerEngine(fake_opa.url)
    assert isinstance(e, PolicyEngine) and e.name == "opa-server"
    e.close()


def test_answers_match_both_in_process_engines(
    fake_opa: FakeOpa, embedded: EmbeddedEngine, reference: ReferenceEngine, scope: dict[str, Any]
) -> None:
    """Decisions through OPA's REST API equal OPA's in-process ones, and the embedded engine's."""
    e = OpaServerEngine(fake_opa.url)
    for path, inp in [
        (ADMISSION, request(scope)),
        ("kvgov/sharing/decision", {"requester": {**scope, "tenant": "x"}, "owner": scope}),
        ("kvgov/retention/decision", {"scope": scope}),
        ("kvgov/classifications", {}),
    ]:
        d = e.evaluate(path, inp)
        assert d.error is None and d.engine == "opa-server"
        assert d.result == reference.evaluate(path, inp).result
        assert d.result == embedded.evaluate(path, inp).result
    e.close()


def test_revision_from_bundle_manifest(fake_opa: FakeOpa) -> None:
    """The manifest's revision, read from /v1/data, names the revision and tags decisions;
    the content digest follows it."""
    e = OpaServerEngine(fake_opa.url)
    assert e.bundle_revision.startswith("kvgov=r1+opa-sha256:")
    assert e.evaluate("kvgov/classifications", {}).bundle_revision == e.bundle_revision
    e.close()


def test_revision_without_bundles_is_the_content_digest(fake_opa: FakeOpa) -> None:
    """Without bundles the revision is the digest of the policies and data OPA serves."""
    fake_opa.revision = None
    e = OpaServerEngine(fake_opa.url)
    assert e.bundle_revision.startswith("opa-sha256:")
    e.close()


def test_revision_is_reread_after_its_ttl(fake_opa: FakeOpa) -> None:
    """After revision_ttl seconds the next decision re-reads the revision (injected clock)."""
    now = [0.0]
    e = OpaServerEngine(fake_opa.url, revision_ttl=10, clock=lambda: now[0])
    fake_opa.revision = "r2"
    assert e.evaluate("kvgov/classifications", {}).bundle_revision.startswith("kvgov=r1+")
    now[0] = 11.0
    assert e.evaluate("kvgov/classifications", {}).bundle_revision.startswith("kvgov=r2+")
    e.close()


def test_new_server_revision_misses_the_cache(fake_opa: FakeOpa) -> None:
    """A cached OPA engine misses once the server's revision changes."""
    now = [0.0]
    c = CachedEngine(OpaServerEngine(fake_opa.url, revision_ttl=10, clock=lambda: now[0]))
    c.evaluate("kvgov/classifications", {})
    assert c.evaluate("kvgov/classifications", {}).cached
    fake_opa.revision = "r2"
    now[0] = 20.0
    assert not c.evaluate("kvgov/classifications", {}).cached
    c.close()


def test_undefined_result_is_a_deny_not_an_error(fake_opa: FakeOpa, scope: dict[str, Any]) -> None:
    """200 without `result` is an undefined rule: deny, no error."""
    fake_opa.mode = "undefined"
    d = OpaServerEngine(fake_opa.url).evaluate(ADMISSION, request(scope))
    assert not d.allow and d.result is None and d.error is None
    assert d.reason.startswith("undefined")


def test_slow_server_times_out_and_denies(fake_opa: FakeOpa, scope: dict[str, Any]) -> None:
    """A server slower than the timeout denies with a timeout error."""
    fake_opa.mode = "slow"
    fake_opa.delay = 0.5
    d = OpaServerEngine(fake_opa.url, timeout=0.1).evaluate(ADMISSION, request(scope))
    assert not d.allow and d.error is not None and d.error.startswith("timeout")


def test_late_answer_is_denied(fake_opa: FakeOpa, scope: dict[str, Any]) -> None:
    """An answer that arrives after the timeout (per-read limits not hit) is denied."""
    ticks = iter([0.0, 5.0])
    fake_opa.mode = "ok"
    e = OpaServerEngine(fake_opa.url, timeout=1.0, timer=lambda: next(ticks, 5.0))
    d = e.evaluate(ADMISSION, request(scope))
    assert not d.allow and d.error is not None and "answered after" in d.error


def test_http_500_denies(fake_opa: FakeOpa, scope: dict[str, Any]) -> None:
    """A 500 denies with the status and OPA's message."""
    fake_opa.mode = "error500"
    d = OpaServerEngine(fake_opa.url).evaluate(ADMISSION, request(scope))
    assert (
        not d.allow and d.error is not None and d.error.startswith("HTTP 500") and "boom" in d.error
    )


@pytest.mark.parametrize("mode", ["garbage", "list"])
def test_malformed_body_denies(fake_opa: FakeOpa, scope: dict[str, Any], mode: str) -> None:
    """A body that is not JSON, or not a JSON object, denies as a malformed answer."""
    fake_opa.mode = mode
    d = OpaServerEngine(fake_opa.url).evaluate(ADMISSION, request(scope))
    assert not d.allow and d.error is not None and d.error.startswith("malformed answer")


def test_unreachable_server_denies(scope: dict[str, Any]) -> None:
    """A server that is not there denies; the revision stays unknown."""
    e = OpaServerEngine("http://127.0.0.1:9", timeout=0.2)
    assert e.bundle_revision == "unknown"
    d = e.evaluate(ADMISSION, request(scope))
    assert not d.allow and d.error is not None and "unreachable" in d.error


def test_token_is_sent(reference: ReferenceEngine, scope: dict[str, Any]) -> None:
    """The bearer token authorises requests; without it OPA's 401 denies."""
    server = FakeOpa(reference, token="s3cret")
    try:
        ok = OpaServerEngine(server.url, token="s3cret").evaluate(ADMISSION, request(scope))
        assert ok.allow and ok.error is None
        bad = OpaServerEngine(server.url).evaluate(ADMISSION, request(scope))
        assert not bad.allow and bad.error is not None and "401" in bad.error
    finally:
        server.close()


def test_errors_deny_through_the_client(fake_opa: FakeOpa, scope: dict[str, Any]) -> None:
    """PolicyClient over the OPA engine fails closed on a broken server, and recovers."""
    c = PolicyClient.create(engine="opa-server", opa_url=fake_opa.url, opa_timeout=0.2)
    fake_opa.mode = "error500"
    a = c.admission(scope, 8, None)
    assert not a.allow and not a.cache and a.decision.error is not None
    fake_opa.mode = "ok"
    assert c.admission(scope, 8, None).allow
    c.close()


def test_closed_engine_fails_closed(fake_opa: FakeOpa, scope: dict[str, Any]) -> None:
    """After close decisions deny with 'engine closed'."""
    e = OpaServerEngine(fake_opa.url)
    e.close()
    assert e.evaluate(ADMISSION, request(scope)).error == "engine closed"


@pytest.mark.parametrize("url", ["ftp://x:1", "127.0.0.1:8181", "http://h:1/v1", "http://h:1/?a=1"])
def test_bad_url_is_refused(url: str) -> None:
    """A URL that is not http(s)://host[:port] raises PolicyError."""
    with pytest.raises(PolicyError):
        OpaServerEngine(url)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirects_are_refused(
    reference: ReferenceEngine, scope: dict[str, Any], status: int
) -> None:
    """A server that redirects (to another host here) gets a fail-closed decision,
    and the redirect's target never receives the input, the token or a revision read."""
    target = FakeOpa(reference)
    server = FakeOpa(reference, token="s3cret")
    try:
        server.redirect_to = target.url.replace("127.0.0.1", "localhost")
        server.redirect_status = status
        e = OpaServerEngine(server.url, token="s3cret", timeout=2.0)
        assert e.bundle_revision == "unknown"
        d = e.evaluate(ADMISSION, request(scope))
        assert not d.allow and d.error is not None
        assert f"HTTP {status} redirecting to" in d.error and "refused" in d.error
        assert server.requests == 1 and target.requests == 0 and target.gets == 0
        server.redirect_to = None
        assert e.evaluate(ADMISSION, request(scope)).allow
        e.close()
    finally:
        server.close()
        target.close()
