"""PolicyClient: every typed accessor, and fail-closed on errors and wrong shapes."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from kvgov.exceptions import PolicyError
from kvgov.policy.client import PolicyClient, scope_key
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import Decision, failed_decision, make_decision
from tests.policy.samples import SCOPE


class FixedEngine:
    """An engine answering a fixed result (or failing) for every rule."""

    name = "fixed"
    bundle_revision = "fixed-1"

    def __init__(self, result: Any = None, error: str | None = None) -> None:
        self.result = result
        self.error = error

    def evaluate(self, path: str, input: Mapping[str, Any]) -> Decision:
        if self.error is not None:
            return failed_decision(
                path, self.error, bundle_revision="fixed-1", engine="fixed", seconds=0.0
            )
        return make_decision(
            path, self.result, bundle_revision="fixed-1", engine="fixed", seconds=0.0
        )

    def close(self) -> None:
        pass


@pytest.fixture()
def client(embedded: EmbeddedEngine) -> PolicyClient:
    """A client over the shared embedded engine with its own cache."""
    return PolicyClient(embedded)


def test_admission(client: PolicyClient, scope: dict[str, Any]) -> None:
    """admission returns allow, cache, priority, reason and the decision."""
    a = client.admission(scope, 100, None)
    assert (a.allow, a.cache, a.priority, a.reason) == (True, True, 50, "admitted")
    assert a.decision.path == "kvgov/admission/decision"
    r = client.admission({**scope, "classification": "restricted"}, 100, 90)
    assert (r.allow, r.cache, r.priority) == (True, False, 90)


def test_admission_denies_unknown_classification(
    client: PolicyClient, scope: dict[str, Any]
) -> None:
    """An unknown classification is denied, and not cached."""
    a = client.admission({**scope, "classification": "secret"}, 1, None)
    assert not a.allow and not a.cache and "unknown classification" in a.reason


def test_admission_denies_missing_field(client: PolicyClient, scope: dict[str, Any]) -> None:
    """A scope missing a field is denied."""
    del scope["template_version"]
    assert not client.admission(scope, 1, None).allow


def test_sharing(client: PolicyClient, scope: dict[str, Any]) -> None:
    """Same tenant may share; another tenant may not by default."""
    assert client.sharing(scope, scope).allow
    other = client.sharing({**scope, "tenant": "globex"}, scope)
    assert not other.allow and "never allowed above public" in other.reason


def test_sharing_through_a_group(scope: dict[str, Any]) -> None:
    """A share group grants cross-tenant reuse of public blocks, and names the groups."""
    data = {
        "kvgov": {
            "config": {
                "share_groups": {
                    "docs": {
                        "publishers": ["acme"],
                        "readers": ["globex"],
                        "classifications": ["public"],
                    }
                }
            }
        }
    }
    c = PolicyClient.create(policy_data=data, run_tests=False)
    pub = {**scope, "classification": "public"}
    assert c.sharing({**pub, "tenant": "globex"}, pub).allow
    g = c.share_groups(pub)
    assert (g.publish, g.read) == ("docs", ("docs",))
    r = c.share_groups({**pub, "tenant": "globex"})
    assert (r.publish, r.read) == (None, ("docs",))


def test_share_groups_default(client: PolicyClient, scope: dict[str, Any]) -> None:
    """Without share groups a scope keys in its tenant's own namespace."""
    g = client.share_groups(scope)
    assert (g.publish, g.read) == (None, ())


def test_retention(client: PolicyClient, scope: dict[str, Any]) -> None:
    """retention gives the classification's TTL, 0 for restricted."""
    assert client.retention(scope).ttl_seconds == 3600
    assert client.retention({**scope, "classification": "restricted"}).ttl_seconds == 0


def test_offload(client: PolicyClient, scope: dict[str, Any]) -> None:
    """offload follows the tiers of the classification."""
    assert client.offload(scope, "host").allow
    assert not client.offload(scope, "disk").allow


def test_classifications(client: PolicyClient) -> None:
    """classifications lists the four labels."""
    assert client.classifications() == {"public", "internal", "confidential", "restricted"}


def test_cached_accessor_keeps_decision_id(client: PolicyClient, scope: dict[str, Any]) -> None:
    """A repeated accessor call is a cache hit with the same decision id."""
    a = client.admission(scope, 10, None)
    b = client.admission(dict(scope), 10, None)
    assert b.decision.cached and b.decision.decision_id == a.decision.decision_id
    assert client.cache_stats().hits >= 1
    assert client.admission(scope, 10, None) is b
    assert client.bundle_revision == a.decision.bundle_revision


def test_concurrent_hits_share_one_typed_answer(scope: dict[str, Any]) -> None:
    """Threads asking the same question get one typed answer, and every call is counted."""
    c = PolicyClient(EmbeddedEngine(run_tests=False))
    first = c.admission(scope, 10, None)
    kept = c.admission(scope, 10, None)  # the first hit keeps the typed answer
    answers: list[Any] = []

    def ask() -> None:
        answers.extend(c.admission(scope, 10, None) for _ in range(200))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a is kept for a in answers)
    assert kept.decision.decision_id == first.decision.decision_id
    stats = c.cache_stats()
    assert (stats.hits, stats.misses) == (801, 1)
    c.close()


def test_scope_key_is_exact() -> None:
    """scope_key is the values tuple only for exact str/None scopes."""
    assert scope_key(SCOPE) == tuple(SCOPE.values())
    assert scope_key({**SCOPE, "tenant": 1}) is None
    assert scope_key({**SCOPE, "extra": "x"}) is None
    assert scope_key({k: v for k, v in SCOPE.items() if k != "model"}) is None


def test_engine_error_fails_closed(scope: dict[str, Any]) -> None:
    """An engine error denies every accessor in the most restrictive way."""
    c = PolicyClient(FixedEngine(error="boom"))
    a = c.admission(scope, 1, None)
    assert (a.allow, a.cache, a.priority) == (False, False, 0) and a.decision.error == "boom"
    assert not c.sharing(scope, scope).allow
    g = c.share_groups(scope)
    assert (g.publish, g.read) == (None, ())
    assert c.retention(scope).ttl_seconds == 0
    assert not c.offload(scope, "host").allow
    assert c.classifications() == frozenset()


BAD_ADMISSION = [
    None,
    "yes",
    [1],
    {"allow": "true", "cache": True, "priority": 1, "reason": ""},
    {"allow": True, "cache": True, "priority": 101, "reason": ""},
    {"allow": True, "cache": True, "priority": True, "reason": ""},
    {"allow": True, "cache": 1, "priority": 1, "reason": ""},
    {"allow": True, "reason": "x"},
]
BAD_ALLOW_REASON = [None, True, {"allow": 1, "reason": "x"}, {"allow": True}, {"reason": "x"}]
BAD_GROUPS: list[Any] = [
    None,
    [],
    {"publish": 3, "read": []},
    {"publish": None, "read": [1]},
    {"publish": None, "read": "g"},
    {"read": []},
]
BAD_RETENTION = [
    None,
    5,
    {"ttl_seconds": -1},
    {"ttl_seconds": "1"},
    {"ttl_seconds": float("inf")},
    {"ttl_seconds": True},
    {},
]


@pytest.mark.parametrize("result", BAD_ADMISSION)
def test_wrong_shaped_admission_denies(scope: dict[str, Any], result: Any) -> None:
    """A wrong-shaped admission result denies, uncached, with an error."""
    a = PolicyClient(FixedEngine(result=result)).admission(scope, 1, None)
    assert (a.allow, a.cache, a.priority) == (False, False, 0) and a.decision.error is not None


@pytest.mark.parametrize("result", BAD_ALLOW_REASON)
def test_wrong_shaped_sharing_and_offload_deny(scope: dict[str, Any], result: Any) -> None:
    """A wrong-shaped sharing or offload result denies with an error."""
    c = PolicyClient(FixedEngine(result=result))
    s, o = c.sharing(scope, scope), c.offload(scope, "host")
    assert not s.allow and s.decision.error is not None
    assert not o.allow and o.decision.error is not None


@pytest.mark.parametrize("result", BAD_GROUPS)
def test_wrong_shaped_groups_read_nothing(scope: dict[str, Any], result: Any) -> None:
    """A wrong-shaped share-groups result publishes and reads nothing, with an error."""
    g = PolicyClient(FixedEngine(result=result)).share_groups(scope)
    assert (g.publish, g.read) == (None, ()) and g.decision.error is not None


@pytest.mark.parametrize("result", BAD_RETENTION)
def test_wrong_shaped_retention_is_zero(scope: dict[str, Any], result: Any) -> None:
    """A wrong-shaped retention result gives a TTL of 0, with an error."""
    t = PolicyClient(FixedEngine(result=result)).retention(scope)
    assert t.ttl_seconds == 0 and t.decision.error is not None


def test_wrong_shaped_classifications_are_empty() -> None:
    """A classifications result that is not a list of strings gives no labels."""
    assert PolicyClient(FixedEngine(result=[1, "a"])).classifications() == frozenset()


def test_wrong_shape_keeps_the_decision_id(scope: dict[str, Any]) -> None:
    """A shape error replaces the decision but keeps its id for the audit trail."""
    c = PolicyClient(FixedEngine(result={"allow": 1, "reason": "x"}), cache_size=0)
    s = c.sharing(scope, scope)
    assert not s.allow and s.decision.error is not None
    assert s.decision.error.startswith("wrong-shaped result")
    assert s.decision.engine == "fixed" and len(s.decision.decision_id) == 36


def test_allow_false_forces_cache_false(scope: dict[str, Any]) -> None:
    """A policy that denies but says cache=true is read as cache=false."""
    c = PolicyClient(
        FixedEngine(result={"allow": False, "cache": True, "priority": 5, "reason": "no"})
    )
    a = c.admission(scope, 1, None)
    assert not a.allow and not a.cache


def test_create_rejects_unknown_engine() -> None:
    """An unknown engine name, or opa-server without a URL, raises PolicyError."""
    with pytest.raises(PolicyError):
        PolicyClient.create(engine="nope")
    with pytest.raises(PolicyError):
        PolicyClient.create(engine="opa-server")


def test_create_with_engine_instance(scope: dict[str, Any]) -> None:
    """create accepts an engine instance and wraps it in a cache."""
    c = PolicyClient.create(engine=FixedEngine(result={"ttl_seconds": 5}))
    assert c.retention(scope).ttl_seconds == 5
    assert c.engine.name == "fixed"


def test_reload_through_the_client(scope: dict[str, Any]) -> None:
    """reload swaps the embedded bundle; an OPA-style engine refuses."""
    c = PolicyClient.create(run_tests=False)
    before = c.bundle_revision
    c.reload(policy_data={"kvgov": {"config": {"retention_seconds": {"internal": 2}}}})
    assert c.bundle_revision != before and c.retention(scope).ttl_seconds == 2
    with pytest.raises(PolicyError):
        PolicyClient(FixedEngine()).reload()
    c.close()
