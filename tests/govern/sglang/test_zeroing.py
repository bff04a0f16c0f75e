"""Zeroing and its audit on SGLang's pool, batched (needs SGLang).

Every page the allocator takes back is zeroed before any ``alloc*`` can hand it out
again; the ``zeroization`` events are written per batch of pages (one per owner per
batch), not per allocation, and before an erasure's own event; no zeroed page is
missing from them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402

from kvgov.audit.queries import AuditQueries  # noqa: E402
from kvgov.exceptions import PoolClosed  # noqa: E402
from kvgov.govern.sglang import governance  # noqa: E402

from .test_differential import POOL, _build, _drive, _req, _stream  # noqa: E402


def _zeroizations(url: str) -> list[tuple[str | None, tuple[int, ...]]]:
    with AuditQueries(url) as q:
        return [(e.tenant, tuple(e.block_ids)) for e in q.events(type="zeroization")]


def test_zeroization_events_come_per_batch_and_name_every_zeroed_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(governance, "ZERO_AUDIT_BATCH", 256, raising=False)
    gov, alloc, kv = _build(True, tmp_path)
    fills = 0
    zeroer = gov.kvgov.zeroer
    on_zeroed = zeroer.on_zeroed
    assert on_zeroed is not None

    def counting(pages: list[int], nbytes: int, seconds: float) -> None:
        nonlocal fills
        fills += 1
        on_zeroed(pages, nbytes, seconds)

    zeroer.on_zeroed = counting
    try:
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(_stream(60, seed=7))])
        zeroed = gov.kvgov.gov.ledger.counters["acme"].blocks_zeroized
    finally:
        gov.kvgov_close()
    url = f"sqlite:///{tmp_path}/audit.db"
    events = _zeroizations(url)
    assert zeroed > 256 and fills > len(events) > 0  # batched: fewer events than fills
    assert all(tenant == "acme" for tenant, _ in events)
    assert sum(len(ids) for _, ids in events) == zeroed  # none lost at close


def test_an_erasure_writes_the_pending_zeroizations_before_its_own_event(tmp_path: Path) -> None:
    gov, alloc, kv = _build(True, tmp_path)
    try:
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(_stream(30, seed=8))])
        gov.kvgov.purge_tenant("acme")
        gov.kvgov.gov.audit.flush()
        url = f"sqlite:///{tmp_path}/audit.db"
        with AuditQueries(url) as q:
            kinds = [e.type for e in q.events() if e.type in ("zeroization", "erasure")]
        zeroed = gov.kvgov.gov.ledger.counters["acme"].blocks_zeroized
        assert kinds and kinds[-1] == "erasure" and "zeroization" in kinds
        assert sum(len(ids) for _, ids in _zeroizations(url)) == zeroed
    finally:
        gov.kvgov_close()


def test_a_flush_zeroes_what_is_pending_and_stores_every_event_with_the_cache_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a batch no run reaches: before the flush, no zeroization event is written
    monkeypatch.setattr(governance, "ZERO_AUDIT_BATCH", 1 << 30, raising=False)
    gov, alloc, kv = _build(True, tmp_path)
    url = f"sqlite:///{tmp_path}/audit.db"
    try:
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(_stream(30, seed=9))])
        gov.evict(EvictParams(num_tokens=POOL))  # frees every unlocked page
        pending = gov.kvgov.zeroer.pending_ids()
        assert pending  # released and not yet zeroed: no allocation since
        assert not gov.kvgov.zeroer.reads_zero(pending)  # the KV _drive wrote, still there
        gov.kvgov_flush()
        assert gov.kvgov.zeroer.pending_ids() == []
        assert gov.kvgov.zeroer.reads_zero(pending)
        zeroed = gov.kvgov.gov.ledger.counters["acme"].blocks_zeroized
        stored = _zeroizations(url)  # read from the database, by another connection
        assert zeroed and sum(len(ids) for _, ids in stored) == zeroed
        assert set(pending) <= {b for _, ids in stored for b in ids}
        with AuditQueries(url) as q:  # every admission stored too, the cache still open
            assert len(list(q.events(type="admission"))) == 30
        assert not gov.kvgov.gov.closed
        _drive(gov, alloc, kv, [_req(30, "acme", _stream(1, seed=10)[0])])  # still serves
    finally:
        gov.kvgov_close()
    with pytest.raises(PoolClosed):
        gov.kvgov_flush()
