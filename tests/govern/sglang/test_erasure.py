"""Purge, invalidation and refused request ids on SGLang's tree (needs SGLang).

The cache is driven as SGLang's scheduler drives it (``test_differential._drive``);
an erasure must leave every page the erased owner wrote free and reading zero in
every K and V buffer, audited with ``verified`` from ownership, and nothing of
the owner matchable afterwards.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402

from kvgov.audit.verify import verify  # noqa: E402

from .test_differential import _build, _drive, _req, _stream  # noqa: E402


def _match(gov: object, req: object) -> int:
    toks = array("q", req.origin_input_ids)  # type: ignore[attr-defined]
    m = gov.match_prefix(  # type: ignore[attr-defined]
        MatchPrefixParams(key=RadixKey(toks, None, limit=len(toks) - 1), req=req)
    )
    return int(m.device_prefix_len)


def test_purge_zeroes_every_page_the_tenant_owned_and_nothing_of_it_matches(
    tmp_path: Path,
) -> None:
    stream = _stream(12, seed=4)
    gov, alloc, kv = _build(True, tmp_path)
    try:
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        _drive(gov, alloc, kv, [_req(50 + i, "globex", t) for i, t in enumerate(stream[:3])])
        ledger = gov.kvgov.gov.ledger
        owned = ledger.owners.of_tenant("acme")
        assert owned and ledger.owners.of_tenant("globex")
        assert not gov.kvgov.zeroer.reads_zero(owned)  # the tenant's KV is there
        assert _match(gov, _req(90, "acme", stream[-1])) > 0

        report = gov.kvgov.purge_tenant("acme")

        assert report.verified and report.held_blocks == 0
        assert report.blocks_zeroized >= len(owned)
        assert gov.kvgov.zeroer.reads_zero(owned)
        assert ledger.owners.of_tenant("acme") == []
        free = set(alloc.get_all_free_pages().tolist())
        assert set(owned) <= free
        assert all(_match(gov, _req(100 + i, "acme", t)) == 0 for i, t in enumerate(stream))
    finally:
        gov.kvgov_close()
    report = verify(f"sqlite:///{tmp_path}/audit.db")
    assert report.ok, report


def test_a_page_a_running_request_holds_is_counted_held_and_never_matched_again(
    tmp_path: Path,
) -> None:
    stream = _stream(4, seed=5)
    gov, alloc, kv = _build(True, tmp_path)
    try:
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        running = _req(10, "acme", stream[0])
        toks = array("q", running.origin_input_ids)
        m = gov.match_prefix(
            MatchPrefixParams(key=RadixKey(toks, None, limit=len(toks) - 1), req=running)
        )
        assert m.device_prefix_len > 0
        lock = gov.lock(m.last_device_node)  # a running request holds its prefix

        report = gov.kvgov.purge_tenant("acme")

        assert report.held_blocks > 0 and not report.verified
        # the held pages stay in the tree, but the tenant's namespace is retired
        assert _match(gov, _req(11, "acme", stream[0])) == 0
        gov.unlock(lock)
        again = gov.kvgov.purge_tenant("acme")
        assert again.held_blocks == 0 and again.verified
    finally:
        gov.kvgov_close()


def test_invalidate_drops_every_page_of_the_matching_scopes(tmp_path: Path) -> None:
    stream = _stream(6, seed=6)
    gov, alloc, kv = _build(True, tmp_path)
    try:
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        owned = gov.kvgov.gov.ledger.owners.of_tenant("acme")
        report = gov.kvgov.invalidate({"template_version": "v1"})
        assert report.verified and report.blocks_zeroized >= len(owned)
        assert gov.kvgov.zeroer.reads_zero(owned)
        assert _match(gov, _req(20, "acme", stream[0])) == 0
    finally:
        gov.kvgov_close()


def test_a_request_id_the_trail_cannot_hold_is_refused_and_audited(tmp_path: Path) -> None:
    stream = _stream(2, seed=7)
    gov, alloc, kv = _build(True, tmp_path)
    try:
        bad = _req(0, "acme", stream[0])
        bad.rid = "r\x00" + "x" * 10
        _drive(gov, alloc, kv, [bad])
        denials = gov.kvgov.gov.ledger.unattributed.denials
        assert denials["scope"] == 1 and denials["error"] == 0  # refused up front, not failed
        assert gov.kvgov.gov.ledger.owners.of_tenant("acme") == []  # cached nothing shared
        good = _req(1, "acme", stream[0])
        assert _match(gov, good) == 0  # the refused request published nothing
    finally:
        gov.kvgov_close()
    report = verify(f"sqlite:///{tmp_path}/audit.db")
    assert report.ok, report


def test_sweeps_are_batched_at_most_one_per_interval(tmp_path: Path) -> None:
    from kvgov.exceptions import InvalidArgument

    gov, alloc, kv = _build(True, tmp_path)
    try:
        governance = gov.kvgov
        with pytest.raises(InvalidArgument):
            governance.sweep_interval = -1.0
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(_stream(4, seed=9))])
        sweeps = 0
        sweep = governance.gov.sweep

        def counting() -> int:
            nonlocal sweeps
            sweeps += 1
            return sweep()

        governance.gov.sweep = counting  # type: ignore[method-assign]
        deadlines = governance.gov.ledger.deadlines

        def expire() -> None:  # a page whose retention ends now: a sweep is due
            deadlines.keyed([1], 0.0)
            deadlines.cached([1])

        governance.sweep_interval = 3600.0
        expire()
        governance.sweep_due()
        expire()
        governance.sweep_due()  # within the interval: no second sweep of the whole tree
        assert sweeps == 1
        governance.sweep_interval = 0.0
        governance.sweep_due()
        assert sweeps == 2
    finally:
        gov.kvgov_close()
