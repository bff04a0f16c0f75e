"""The engine side: FleetAgent and a GovernedKVCache, on SQLite and PostgreSQL.

Orders run at a step boundary (here the admission hook), never on the fetching
thread; each erasure event carries the order id; a replayed order runs once; a
restarted engine runs what it missed; a wrongly signed order is refused and audited;
a rollout changes the revision so that no decision of the old bundle is served.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import AuditQueries, SigningKey
from kvgov.audit.fleet import FleetStore, sign_order
from kvgov.exceptions import PolicyDenied
from kvgov.govern import GovernedKVCache
from kvgov.govern.fleet import FleetAgent, NativeTarget, bundle_digest, trusted_keys
from tests.govern.conftest import make_scope
from tests.govern.fleet.conftest import blocking_bundle

CacheFactory = Callable[..., GovernedKVCache]


def _agent(url: str, engine_id: str, cache: GovernedKVCache, operator: SigningKey) -> FleetAgent:
    agent = FleetAgent(
        url, engine_id, NativeTarget(cache), trusted_keys([operator.private_key.public_key()])
    )
    cache.add_boundary_hook(agent.drain)
    return agent


def _issue(url: str, key: SigningKey, kind: str, payload: dict[str, object]) -> str:
    with FleetStore(url, auto_upgrade=False) as store:
        return store.issue(sign_order(key, kind, payload)).order_id


def _cached_blocks(cache: GovernedKVCache, tenant: str, seq: str) -> list[int]:
    adm = cache.admit(seq, make_scope(tenant=tenant), list(range(1, 17)))
    for b in adm.block_ids:
        cache.block(b).fill_(7.0)
    cache.release(seq)
    return list(adm.block_ids)


def test_a_purge_order_runs_at_the_boundary_with_its_order_id_and_once(
    fleet_url: str, make_cache: CacheFactory, operator: SigningKey
) -> None:
    cache = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, "native-1", cache, operator)
    acme = _cached_blocks(cache, "acme", "s1")
    order_id = _issue(fleet_url, operator, "purge", {"tenant": "acme"})
    agent.sync()  # fetched: queued, not run (this is the database thread's work)
    assert not cache.pool.read_back_zero(acme)
    cache.admit("s2", make_scope(tenant="globex"), [5, 6, 7, 8])  # a step boundary
    assert agent.executed == 1
    assert cache.pool.read_back_zero(acme)
    agent.sync()  # writes the result
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        (result,) = store.results(order_id)
    assert (result.engine_id, result.status, result.verified) == ("native-1", "completed", True)
    cache.audit.flush()
    with AuditQueries(fleet_url) as q:
        assert result.event_id is not None
        event = q.event(result.event_id)
    assert event is not None
    assert event.type == "erasure"
    assert event.details["order_id"] == order_id
    assert event.details["verified"] is True
    # replayed: the same agent fetching again, and another process of the same engine
    agent.sync()
    assert agent.drain() == 0
    again = FleetAgent(fleet_url, "native-1", NativeTarget(cache),
                       trusted_keys([operator.private_key.public_key()]))  # fmt: skip
    again.sync()
    assert again.drain() == 0
    again.stop()
    agent.stop()


def test_a_wrongly_signed_order_is_refused_and_audited(
    fleet_url: str, make_cache: CacheFactory, operator: SigningKey, intruder: SigningKey
) -> None:
    cache = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, "native-1", cache, operator)
    acme = _cached_blocks(cache, "acme", "s1")
    order_id = _issue(fleet_url, intruder, "purge", {"tenant": "acme"})
    agent.sync()
    assert agent.drain() == 1
    assert not cache.pool.read_back_zero(acme)  # nothing erased
    agent.sync()
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        (result,) = store.results(order_id)
    assert result.status == "refused"
    assert "not a trusted operator key" in result.detail["reason"]
    cache.audit.flush()
    with AuditQueries(fleet_url) as q:
        assert result.event_id is not None
        event = q.event(result.event_id)
    assert event is not None
    assert (event.type, event.details["outcome"], event.details["order_id"]) == (
        "fleet_order", "refused", order_id,
    )  # fmt: skip
    agent.stop()


def test_a_rollout_serves_no_decision_of_the_old_bundle_after_it_ran(
    fleet_url: str, make_cache: CacheFactory, operator: SigningKey, tmp_path: Path
) -> None:
    cache = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, "native-1", cache, operator)
    before = cache.policy.bundle_revision
    cache.admit("b1", make_scope(tenant="blocked"), [1, 2, 3, 4])  # decided and cached
    cache.release("b1")
    bundle = blocking_bundle(tmp_path / "bundle")
    files = {p.name: p.read_text(encoding="utf-8") for p in bundle.iterdir() if p.is_file()}
    order_id = _issue(fleet_url, operator, "rollout",
                      {"files": files, "digest": bundle_digest(files)})  # fmt: skip
    agent.sync()
    with pytest.raises(PolicyDenied):  # the hook ran the rollout before this admission
        cache.admit("b2", make_scope(tenant="blocked"), [1, 2, 3, 4])
    after = cache.policy.bundle_revision
    assert after != before
    agent.sync()
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        (result,) = store.results(order_id)
        (engine,) = store.engines()
    assert result.status == "completed"
    assert result.detail["policy_revision"] == after
    assert engine.policy_revision in (before, after)  # the next heartbeat reports it
    agent.stop()
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        assert store.engines()[0].policy_revision == after


def test_an_engine_restarted_after_the_order_runs_it_on_start(
    fleet_url: str, make_cache: CacheFactory, operator: SigningKey
) -> None:
    first = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, "native-1", first, operator)
    agent.sync()
    agent.stop()  # the engine stops before the order
    first.close()
    order_id = _issue(fleet_url, operator, "purge", {"tenant": "acme"})
    restarted = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, "native-1", restarted, operator)
    agent.sync()
    assert agent.drain() == 1
    agent.sync()
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        (result,) = store.results(order_id)
    assert (result.status, result.verified) == ("completed", True)
    agent.stop()


def test_a_database_down_never_blocks_the_boundary(
    make_cache: CacheFactory, operator: SigningKey
) -> None:
    cache = make_cache()
    url = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1
    agent = _agent(url, "native-1", cache, operator).start()
    cache.admit("s1", make_scope(), [1, 2, 3, 4])  # the hook returns at once
    assert agent.drain() == 0
    assert not agent.registered
    agent.stop()


def test_the_background_thread_delivers_an_order(
    fleet_url: str, make_cache: CacheFactory, operator: SigningKey
) -> None:
    cache = make_cache(audit_url=fleet_url)
    agent = FleetAgent(fleet_url, "native-1", NativeTarget(cache),
                       trusted_keys([operator.private_key.public_key()]),
                       poll_interval=0.1, heartbeat_interval=0.1).start()  # fmt: skip
    order_id = _issue(fleet_url, operator, "purge", {"tenant": "acme"})
    ran = 0
    for _ in range(600):  # up to a minute on a loaded machine: delivery, not speed
        ran += agent.drain()
        with FleetStore(fleet_url, auto_upgrade=False) as store:
            if store.results(order_id):
                break
        import time

        time.sleep(0.1)
    assert ran == 1
    agent.stop()
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        (result,) = store.results(order_id)
        assert result.status == "completed"
        assert store.engines()[0].stopped_us is not None


def test_results_are_written_once_when_two_threads_flush_them(
    fleet_url: str, make_cache: CacheFactory, operator: SigningKey
) -> None:
    """sync() on the caller's thread and the agent's own thread both write results:
    one writer at a time, each result once (two writers popped the same result)."""
    cache = make_cache(audit_url=fleet_url)
    agent = FleetAgent(fleet_url, "native-1", NativeTarget(cache),
                       trusted_keys([operator.private_key.public_key()]),
                       poll_interval=0.01, heartbeat_interval=0.01).start()  # fmt: skip
    ids = [_issue(fleet_url, operator, "purge", {"tenant": f"t{i}"}) for i in range(20)]
    ran = 0
    for _ in range(600):
        ran += agent.drain()
        agent.sync()
        if ran == len(ids) and agent.pending_results() == 0:
            break
    agent.stop()
    assert ran == len(ids)
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        assert sorted(r.order_id for r in store.results()) == sorted(ids)


def test_an_order_two_threads_fetch_at_once_is_queued_once(
    fleet_url: str, make_cache: CacheFactory, operator: SigningKey
) -> None:
    """sync() and the agent's thread both read the pending orders before either marks
    them seen: the order is queued, and runs, once (a replayed order executes once)."""
    cache = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, "native-1", cache, operator)
    _issue(fleet_url, operator, "purge", {"tenant": "acme"})
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        pending = store.pending("native-1")
    both_read = threading.Barrier(2)

    class Racing:
        def pending(self, engine_id: str) -> Iterator[object]:
            yield from pending
            both_read.wait(timeout=10)  # neither marks the order before both have read it

    racing: Any = Racing()
    threads = [threading.Thread(target=agent._fetch, args=(racing,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    cache.admit("s2", make_scope(tenant="globex"), [5, 6, 7, 8])  # a step boundary
    assert agent.executed == 1
    agent.stop()
