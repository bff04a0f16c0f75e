"""The governed cache under audit-store and policy faults: nothing stalls, nothing lies.

* A purge while PostgreSQL is frozen returns within the audit log's deadline, says
  its evidence is only spooled, and other tenants are admitted meanwhile (no database
  wait holds the cache lock).
* The policy engine down at start, then back: admissions are refused (audited)
  while it is down and served when it returns.
* The policy engine down mid-run, under load: every admission that needs a new
  decision is refused and audited, decisions already cached keep answering, nothing
  crashes or leaks a block, and service resumes when OPA returns, without a restart.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from kvgov.allocator import KVSpec
from kvgov.audit import AuditQueries
from kvgov.exceptions import PolicyDenied
from kvgov.govern import CacheScope, GovernedKVCache
from kvgov.policy import OpaServerEngine
from kvgov.policy.embedded import EmbeddedEngine
from tests.policy.opa_fake import FakeOpa
from tests.support.pg_proxy import ProxiedPg

from .conftest import FaultReport
from .proxy import FreezableProxy

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype=torch.float32)
SECRET = b"k" * 32


class TimedLock:
    """The governor's re-entrant lock, recording how long each outermost hold lasted."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._depth = threading.local()
        self.holds: list[tuple[str, float]] = []

    def __enter__(self) -> TimedLock:
        self._inner.acquire()
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            self._depth.since = time.monotonic()
        self._depth.n = depth + 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth.n -= 1
        if self._depth.n == 0:
            name = threading.current_thread().name
            self.holds.append((name, time.monotonic() - self._depth.since))
        self._inner.release()


def _scope(tenant: str) -> CacheScope:
    return CacheScope(
        tenant=tenant,
        classification="internal",
        model="m",
        model_revision="r1",
        tokenizer="t",
        tokenizer_revision="v1",
        template_version="s1",
    )


def test_purge_under_a_frozen_database_spools_and_stalls_nobody(
    pg_proxy: ProxiedPg, tmp_path: Path, fault_report: FaultReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """purge_tenant returns with evidence 'spooled' while another tenant keeps being served."""
    monkeypatch.chdir(tmp_path)  # the spool of a PostgreSQL trail goes to the working directory
    cache = GovernedKVCache.create(
        spec=SPEC,
        num_blocks=64,
        audit_url=pg_proxy.url,
        key_secret=SECRET,
        worker_id="fault-purge",
        verify_zeroization=True,
    )
    try:
        for i in range(4):
            adm = cache.admit(f"a{i}", _scope("acme"), list(range(i * 100, i * 100 + 9)))
            cache.block(adm.block_ids[0]).fill_(1.0)
            cache.release(f"a{i}")
        cache.audit.flush()
        lock = TimedLock(cache.governor.lock)
        cache.governor.lock = lock  # type: ignore[assignment]
        pg_proxy.proxy.freeze()
        served: list[float] = []
        done = threading.Event()

        def other_tenant() -> None:
            n = 0
            while not done.is_set():
                t0 = time.monotonic()
                cache.admit(f"g{n}", _scope("globex"), list(range(5000 + n, 5009 + n)))
                cache.release(f"g{n}")
                served.append(time.monotonic() - t0)
                n += 1

        worker = threading.Thread(target=other_tenant)
        t0 = time.monotonic()
        worker.start()
        report = cache.purge_tenant("acme")
        purge_seconds = time.monotonic() - t0
        done.set()
        worker.join(timeout=30)
        assert report.evidence == "spooled"
        assert report.blocks_zeroized == 8 and report.verified
        assert purge_seconds < 10, purge_seconds
        assert served, "no admission of another tenant completed during the purge"
        # the purge waited for the frozen database (about max_queue_age, 1 s), but never
        # while holding the cache lock
        main_holds = [d for name, d in lock.holds if name == "MainThread"]
        assert purge_seconds > 0.5 and max(main_holds) < purge_seconds / 2, (
            purge_seconds,
            main_holds,
        )
        spooled_ids = cache.audit.stats().critical_spooled
        assert report.event_id in spooled_ids
        pg_proxy.proxy.thaw()
        cache.audit.flush()
    finally:
        pg_proxy.proxy.thaw()
        cache.close()
    erasures = AuditQueries(pg_proxy.direct).events(type="erasure")
    assert [e.event_id for e in erasures] == [report.event_id]
    fault_report.add(
        "purge, postgresql frozen",
        written=len(served) * 2 + 1,
        spooled=1,
        quarantined=0,
        lost=0,
        critical_lost=0,
        purge_ms=round(purge_seconds * 1000),
        slowest_other_admission_ms=round(max(served) * 1000),
    )


def _cache_on_opa(
    tmp_path: Path, opa_url: str, *, num_blocks: int, timeout: float
) -> tuple[str, GovernedKVCache]:
    """A governed cache deciding on the OPA server at opa_url, auditing to SQLite."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    cache = GovernedKVCache.create(
        spec=SPEC,
        num_blocks=num_blocks,
        audit_url=url,
        key_secret=SECRET,
        policy_engine=OpaServerEngine(opa_url, timeout=timeout),
    )
    return url, cache


def test_policy_engine_down_at_start_then_back(tmp_path: Path, fault_report: FaultReport) -> None:
    """Down at creation: refused and audited; back: served, without a restart."""
    opa = FakeOpa(EmbeddedEngine())
    opa.mode = "error500"
    url, cache = _cache_on_opa(tmp_path, opa.url, num_blocks=16, timeout=2.0)
    refused = 0
    try:
        for i in range(3):
            try:
                cache.admit(f"s{i}", _scope("acme"), list(range(9)))
            except PolicyDenied:
                refused += 1
        opa.mode = "ok"
        served = cache.admit("after", _scope("acme"), list(range(9)))
        assert len(served.block_ids) == 3
        cache.audit.flush()
        errors = AuditQueries(url).events(type="policy_error")
        assert len(errors) == refused == 3
    finally:
        cache.close()
        opa.close()
    fault_report.add(
        "policy engine down at start",
        written=refused + 1,
        spooled=0,
        quarantined=0,
        lost=0,
        critical_lost=0,
        refused=refused,
    )


def test_policy_engine_down_mid_run(tmp_path: Path, fault_report: FaultReport) -> None:
    """OPA killed while two tenants are being served, then back on the same address."""
    opa = FakeOpa(EmbeddedEngine())
    host, port = opa.url.removeprefix("http://").split(":")
    proxy = FreezableProxy((host, int(port)))
    proxy.start()
    url, cache = _cache_on_opa(
        tmp_path, f"http://127.0.0.1:{proxy.port}", num_blocks=256, timeout=0.5
    )
    phase = ["up"]
    outcomes: list[tuple[str, str]] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def serve() -> None:
        n = 0
        while not done.is_set():
            tenant = ("acme", "globex")[n % 2]
            # 8 shared prompt tokens per tenant, then a (length, priority) pair no other
            # request has: every admission asks the engine a question it has not answered
            # before (the decision cache's key), for 40,400 requests, while a request stays
            # under 110 blocks however fast the machine is (a length that grew with n ran a
            # fast CI machine out of its 256 blocks)
            priority = n % 101
            length = 1 + (n // 101) % 400
            tokens = [7] * 8 + list(range(1000, 1000 + length))
            now = phase[0]
            try:
                cache.admit(f"r{n}", _scope(tenant), tokens, priority)
                cache.release(f"r{n}")
                outcomes.append((now, "served"))
            except PolicyDenied as exc:
                outcomes.append((now, "refused:" + exc.reason))
            except BaseException as exc:  # anything else is a failure of the test
                failures.append(exc)
                return
            n += 1

    worker = threading.Thread(target=serve)
    worker.start()
    try:
        time.sleep(0.6)
        phase[0] = "down"
        proxy.kill()
        time.sleep(1.0)
        phase[0] = "back"
        proxy.start()
        time.sleep(0.8)
    finally:
        done.set()
        worker.join(timeout=30)
    try:
        assert not failures, failures
        by_phase = {p: [o for q, o in outcomes if q == p] for p in ("up", "down", "back")}
        # requests in flight when a phase changed may straddle it: judge the middle ones
        assert by_phase["up"] and all(o == "served" for o in by_phase["up"][:-1])
        down = by_phase["down"][1:-1]
        assert down, "no admission ran while OPA was down"
        assert all(o.startswith("refused:") and "unreachable" in o for o in down), down
        back = by_phase["back"][2:]
        assert back and all(o == "served" for o in back), by_phase["back"]
        cache.audit.flush()
        refused = [o for _, o in outcomes if o.startswith("refused:")]
        errors = AuditQueries(url).events(type="policy_error")
        assert len(errors) >= len(refused) > 0
        stats = cache.stats()
        assert stats.live_sequences == 0
        # A decision already cached (made while OPA was up, same bundle revision)
        # still answers while OPA is down: the same request is admitted again.
        # No serve() request left the priority to the policy, so "again" asks OPA.
        cache.admit("again", _scope("acme"), [7] * 8 + [1000])
        proxy.kill()
        cache.release("again")
        cache.admit("cached", _scope("acme"), [7] * 8 + [1000])
        cache.release("cached")
    finally:
        cache.close()
        proxy.kill()
        opa.close()
    written = sum(AuditQueries(url).counts().values())
    fault_report.add(
        "policy engine down mid-run",
        written=written,
        spooled=0,
        quarantined=0,
        lost=0,
        critical_lost=0,
        refused=len(refused),
    )
