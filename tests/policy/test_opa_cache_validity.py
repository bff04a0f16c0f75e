"""The decision cache in front of the OPA server engine serves a decision only while the
server's policies and data it was computed from are unchanged (issue #25, defect 2).

The server is the local OPA stand-in answering with OPA itself (the reference engine);
each test has its own engine, since the server's data and policies change under it.
Time is an injected clock: no test sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kvgov.policy.cache import CachedEngine
from kvgov.policy.client import PolicyClient
from kvgov.policy.engine import UNKNOWN_REVISION
from kvgov.policy.opa_server import OpaServerEngine
from kvgov.policy.reference import ReferenceEngine
from tests.policy.opa_fake import FakeOpa

ADMISSION = "kvgov/admission/decision"
TTL = 10.0


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["r1", "", None], ids=["manifest-revision", "no-revision", "no-bundle"])
def manifest(request: pytest.FixtureRequest) -> str | None:
    """Every manifest an OPA server may hold: a revision, a manifest without one (the
    bundled policy/rego has no .manifest), no bundle at all (policies pushed by API)."""
    value: str | None = request.param
    return value


@pytest.fixture()
def policy_dir(bundle_copy: Path) -> Path:
    """The server's bundle directory (a copy: the policy-change test edits it)."""
    return bundle_copy


@pytest.fixture()
def server(
    reference: ReferenceEngine, policy_dir: Path, request: pytest.FixtureRequest
) -> Iterator[FakeOpa]:
    """An OPA stand-in over its own reference engine (``reference`` is asked for so the
    test skips where OPA's bindings are missing); the manifest is ``manifest``'s, where
    the test asks for it, else revision ``r1``."""
    revision = request.getfixturevalue("manifest") if "manifest" in request.fixturenames else "r1"
    engine = ReferenceEngine(policy_dir, run_tests=False)
    fake = FakeOpa(engine, revision=revision)
    yield fake
    fake.close()
    engine.close()


def _client(url: str, clock: Clock) -> PolicyClient:
    return PolicyClient(OpaServerEngine(url, revision_ttl=TTL, clock=clock))


def _put(server: FakeOpa, path: str, value: Any) -> None:
    """Change the server's data as an operator does: ``PUT /v1/data/<path>``."""
    requests.put(f"{server.url}/v1/data/{path}", json=value, timeout=5).raise_for_status()


def _public(scope: dict[str, Any], tenant: str) -> dict[str, Any]:
    return {**scope, "tenant": tenant, "classification": "public"}


def test_revoked_admission_is_denied_within_revision_ttl(
    server: FakeOpa, manifest: str | None, scope: dict[str, Any]
) -> None:
    """After `PUT /v1/data/kvgov/config/tenants/acme/admission false` a running client's
    cached allow is gone once revision_ttl has passed, whatever the manifest says."""
    clock = Clock()
    client = _client(server.url, clock)
    assert client.admission(scope, 8, None).allow
    assert client.admission(scope, 8, None).decision.cached
    _put(server, "kvgov/config/tenants/acme/admission", False)
    fresh = _client(server.url, Clock())
    assert not fresh.admission(scope, 8, None).allow  # the server denies now
    clock.now = TTL
    after = client.admission(scope, 8, None)
    assert not after.allow and not after.decision.cached
    assert "admission disabled for tenant acme" in after.reason
    client.close()
    fresh.close()


def test_revoked_share_group_is_refused_within_revision_ttl(
    server: FakeOpa, manifest: str | None, scope: dict[str, Any]
) -> None:
    """A share group removed on the server stops a running client's cached cross-tenant
    reuse (and its group namespaces) once revision_ttl has passed."""
    group = {"publishers": ["acme"], "readers": ["initech"], "classifications": ["public"]}
    _put(server, "kvgov/config/share_groups", {"g1": group})
    owner, reader = _public(scope, "acme"), _public(scope, "initech")
    clock = Clock()
    client = _client(server.url, clock)
    assert client.sharing(reader, owner).allow
    assert client.sharing(reader, owner).decision.cached
    assert client.share_groups(reader).read == ("g1",)
    _put(server, "kvgov/config/share_groups", {})
    clock.now = TTL
    after = client.sharing(reader, owner)
    assert not after.allow and not after.decision.cached
    assert client.share_groups(reader).read == ()
    client.close()


def test_policy_change_misses_within_revision_ttl(
    server: FakeOpa, policy_dir: Path, scope: dict[str, Any]
) -> None:
    """A policy module changed on the server under the same manifest revision (a
    bundle re-published without bumping it) is seen within revision_ttl."""
    clock = Clock()
    client = _client(server.url, clock)
    assert client.admission(scope, 8, None).cache
    module = policy_dir / "admission.rego"
    old = '} else := {"cache": true, "reason": "admitted"}'
    new = '} else := {"cache": false, "reason": "admitted; caching disabled by policy v2"}'
    assert old in module.read_text()
    module.write_text(module.read_text().replace(old, new))
    server.engine.reload()  # the server activates the edited bundle, still revision r1
    assert server.revision == "r1"
    clock.now = TTL
    after = client.admission(scope, 8, None)
    assert not after.cache and after.reason == "admitted; caching disabled by policy v2"
    client.close()


def test_revision_is_a_digest_of_policies_and_data(server: FakeOpa, manifest: str | None) -> None:
    """The revision names the manifest's revision where there is one, and changes with
    the data even where the manifest does not."""
    clock = Clock()
    engine = OpaServerEngine(server.url, revision_ttl=TTL, clock=clock)
    before = engine.revision
    assert before != UNKNOWN_REVISION and "sha256:" in before
    assert before.startswith("kvgov=r1+") == (manifest == "r1")
    assert engine.bundle_revision == before
    _put(server, "kvgov/config/tenants/acme/admission", False)
    assert engine.revision == before  # read at most every revision_ttl
    clock.now = TTL
    assert engine.revision != before
    assert engine.evaluate(ADMISSION, {}).bundle_revision == engine.revision
    engine.close()


def test_an_entry_lives_at_most_revision_ttl(server: FakeOpa) -> None:
    """Even with the revision unchanged, a cached decision is evaluated again once it is
    revision_ttl old: a change the revision read raced with is not served for longer."""
    clock = Clock()
    cache = CachedEngine(OpaServerEngine(server.url, revision_ttl=TTL, clock=clock))
    first = cache.evaluate("kvgov/classifications", {})
    clock.now = TTL - 1
    assert cache.evaluate("kvgov/classifications", {}).cached
    clock.now = TTL
    again = cache.evaluate("kvgov/classifications", {})
    assert not again.cached and again.decision_id != first.decision_id
    assert again.bundle_revision == first.bundle_revision
    cache.close()


def test_no_cache_under_an_unknown_revision(server: FakeOpa, scope: dict[str, Any]) -> None:
    """A server whose data and policies cannot be read (here 403 on every GET) still
    decides, but nothing is cached: there is no revision to key by."""
    server.get_status = 403
    client = _client(server.url, Clock())
    assert client.bundle_revision == UNKNOWN_REVISION
    assert client.admission(scope, 8, None).allow
    second = client.admission(scope, 8, None)
    assert second.allow and not second.decision.cached
    assert client.cache_stats().size == 0
    client.close()


def test_failed_revision_read_stops_serving_from_the_cache(
    server: FakeOpa, scope: dict[str, Any]
) -> None:
    """When the revision can no longer be read, the old revision is not kept: after
    revision_ttl the cache is bypassed until a read succeeds again."""
    clock = Clock()
    client = _client(server.url, clock)
    known = client.bundle_revision
    client.admission(scope, 8, None)
    assert client.admission(scope, 8, None).decision.cached
    server.get_status = 500
    clock.now = TTL
    assert client.bundle_revision == UNKNOWN_REVISION
    assert not client.admission(scope, 8, None).decision.cached
    server.get_status = None
    clock.now = 2 * TTL
    assert client.bundle_revision == known
    client.admission(scope, 8, None)
    assert client.admission(scope, 8, None).decision.cached
    client.close()


def test_hits_do_not_read_the_server(server: FakeOpa, scope: dict[str, Any]) -> None:
    """Within revision_ttl a cached decision costs no request: the revision is read
    once per revision_ttl, not per decision."""
    clock = Clock()
    client = _client(server.url, clock)
    client.admission(scope, 8, None)
    gets, posts = server.gets, server.requests
    for _ in range(20):
        assert client.admission(scope, 8, None).decision.cached
    assert (server.gets, server.requests) == (gets, posts)
    client.close()
