"""Stock and governed UnifiedRadixCache driven by the same request streams (needs SGLang).

Per request, as SGLang's scheduler does: touch an earlier request's prefix (every
third request, so LRU order and thus evictions depend on it), match the prompt (all
but its last token), lock the matched node, evict if the allocator is short,
allocate the rest and write it (non-zero KV, as a forward pass would), insert the
whole prompt, unlock. Within
one scope every result is the stock cache's; across scopes nothing matches; every
page the allocator holds free reads zero in every K and V buffer; the trail verifies.
"""

from __future__ import annotations

import random
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from sglang.srt.mem_cache.allocator import (  # noqa: E402
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402

from kvgov.audit.verify import verify  # noqa: E402
from kvgov.govern.sglang.cache import GovernedUnifiedRadixCache  # noqa: E402

PAGE = 16
POOL = 2048  # tokens: 128 pages, so the streams evict


def _build(
    governed: bool, tmp: Path, environ: dict[str, str] | None = None, page: int = PAGE
) -> tuple[Any, Any, Any]:
    """A cache over a 2-layer MHA pool; page 1 gets SGLang's page-size-1 allocator."""
    r2t = ReqToTokenPool(size=8, max_context_len=1024, device="cpu", enable_memory_saver=False)
    kv = MHATokenToKVPool(
        size=POOL,
        page_size=page,
        dtype=torch.float32,
        head_num=1,
        head_dim=4,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )
    if page == 1:
        alloc = TokenToKVPoolAllocator(
            size=POOL, dtype=torch.float32, device="cpu", kvcache=kv, need_sort=False
        )
    else:
        alloc = PagedTokenToKVPoolAllocator(
            size=POOL,
            page_size=page,
            dtype=torch.float32,
            device="cpu",
            kvcache=kv,
            need_sort=False,
        )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=r2t,
        token_to_kv_pool_allocator=alloc,
        page_size=page,
        tree_components=(ComponentType.FULL,),
    )
    if not governed:
        return UnifiedRadixCache(params), alloc, kv
    GovernedUnifiedRadixCache.kvgov_environ = {
        "KVGOV_AUDIT_URL": f"sqlite:///{tmp}/audit.db",
        "KVGOV_EPHEMERAL_SECRET": "1",
        "KVGOV_DEFAULT_CLASSIFICATION": "internal",
        "KVGOV_DEFAULT_TEMPLATE": "v1",
        **(environ or {}),
    }
    return GovernedUnifiedRadixCache(params), alloc, kv


def _req(
    i: int, tenant: str, toks: array, extra_key: str | None = None, **custom: str
) -> SimpleNamespace:
    return SimpleNamespace(
        rid=f"r{i}",
        origin_input_ids=list(toks),
        lora_id=None,
        extra_key=extra_key,
        cache_salt=None,
        session=None,
        sampling_params=SimpleNamespace(custom_params={"kvgov_tenant": tenant, **custom}),
    )


def _stream(n: int, seed: int) -> list[array]:
    rng = random.Random(seed)
    out = []
    for r in range(n):
        sys_prompt = rng.randrange(6)
        toks = array("q", range(sys_prompt * 256, sys_prompt * 256 + 256))
        toks.extend(range(100_000 + r * 96, 100_000 + r * 96 + rng.choice((64, 80, 96))))
        out.append(toks)
    return out


def _drive(cache: Any, alloc: Any, kv: Any, reqs: list[SimpleNamespace]) -> list[tuple[int, ...]]:
    results = []
    for i, req in enumerate(reqs):
        if i % 3 == 2:  # the scheduler touches a waiting request's prefix: LRU order changes
            old = reqs[i - 2]
            cache.touch_prefix(RadixKey(array("q", old.origin_input_ids), old.extra_key))
        toks = array("q", req.origin_input_ids)
        n = len(toks)
        m = cache.match_prefix(
            MatchPrefixParams(
                key=RadixKey(toks, req.extra_key, limit=n - 1, cache_salt=req.cache_salt), req=req
            )
        )
        lock = cache.lock(m.last_device_node)
        prefix_len = m.device_prefix_len
        prefix = cache.path_device_indices(m.last_device_node)[:prefix_len]
        short = (n - prefix_len) - alloc.available_size()
        evicted = cache.evict(EvictParams(num_tokens=short)).num_tokens_evicted if short > 0 else 0
        new = alloc.alloc(n - prefix_len)
        for buf in (*kv.k_buffer, *kv.v_buffer):  # the forward pass writes the new KV
            buf[new] = 1.0
        value = torch.cat((prefix, new))
        res = cache.insert(
            InsertParams(
                key=RadixKey(toks, req.extra_key, cache_salt=req.cache_salt),
                value=value,
                prev_prefix_len=prefix_len,
            )
        )
        cache.unlock(lock)
        results.append((prefix_len, evicted, res.prefix_len))
    return results


def _drive_checkpoint(
    cache: Any, alloc: Any, kv: Any, reqs: list[SimpleNamespace]
) -> list[tuple[int, ...]]:
    """As the scheduler finishes a request: match, lock, allocate, write, ``checkpoint``."""
    results = []
    for req in reqs:
        toks = list(req.origin_input_ids)
        n = len(toks)
        m = cache.match_prefix(
            MatchPrefixParams(key=RadixKey(array("q", toks), req.extra_key, limit=n - 1), req=req)
        )
        prefix_len = m.device_prefix_len
        req.lock = cache.lock(m.last_device_node)
        prefix = cache.path_device_indices(m.last_device_node)[:prefix_len]
        short = (n - prefix_len) - alloc.available_size()
        evicted = cache.evict(EvictParams(num_tokens=short)).num_tokens_evicted if short > 0 else 0
        new = alloc.alloc(n - prefix_len)
        for buf in (*kv.k_buffer, *kv.v_buffer):
            buf[new] = 1.0
        cache.req_to_token_pool.write((0, slice(0, n)), torch.cat((prefix, new)).to(torch.int32))
        req.kv = SimpleNamespace(
            req_pool_idx=0, cache_protected_len=prefix_len, cache_inserted_len=prefix_len
        )
        req.full_untruncated_fill_ids = array("q", toks)
        req.origin_input_ids = array("q", toks)
        req.finished = lambda: True
        req.finished_reason = None
        req.priority = 0
        req.session_id = None
        req.kv_rotation_base = None
        cache.checkpoint(req, up_to=n)
        cache.unlock(req.lock)
        results.append((prefix_len, evicted, req.kv.cache_protected_len, alloc.available_size()))
    return results


def _free_pages_read_zero(alloc: Any, kv: Any) -> bool:
    page = int(alloc.page_size)
    free = alloc.get_all_free_pages()
    slots = (free.unsqueeze(1) * page + torch.arange(page)).reshape(-1)
    return all(bool((buf[slots] == 0).all()) for buf in (*kv.k_buffer, *kv.v_buffer))


def test_one_scope_matches_stock_and_freed_pages_read_zero(tmp_path: Path) -> None:
    stream = _stream(60, seed=1)
    stock, s_alloc, s_kv = _build(False, tmp_path)
    gov, g_alloc, g_kv = _build(True, tmp_path)
    try:
        want = _drive(stock, s_alloc, s_kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        got = _drive(gov, g_alloc, g_kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        assert got == want
        assert sum(r[0] for r in want) > 0 and sum(r[1] for r in want) > 0  # hits and evictions
        assert g_alloc.available_size() == s_alloc.available_size()
        g_alloc.alloc(PAGE)  # an allocation zeroes what is pending first
        assert _free_pages_read_zero(g_alloc, g_kv)
        assert not _free_pages_read_zero(s_alloc, s_kv)  # stock leaves the KV in freed pages
    finally:
        gov.kvgov_close()
    report = verify(f"sqlite:///{tmp_path}/audit.db")
    assert report.ok, report
    assert report.events > 0


def test_page_size_one_matches_stock_and_freed_slots_read_zero(tmp_path: Path) -> None:
    """SGLang's page-size-1 allocator (its own free path, no _release_page_ids) is governed."""
    stream = _stream(40, seed=11)
    stock, s_alloc, s_kv = _build(False, tmp_path, page=1)
    gov, g_alloc, g_kv = _build(True, tmp_path, page=1)
    try:
        assert type(g_alloc).__name__ == "GovernedTokenToKVPoolAllocator"
        want = _drive(stock, s_alloc, s_kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        got = _drive(gov, g_alloc, g_kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        assert got == want
        assert sum(r[0] for r in want) > 0 and sum(r[1] for r in want) > 0  # hits and evictions
        assert g_alloc.available_size() == s_alloc.available_size()
        g_alloc.alloc(1)  # an allocation zeroes what is pending first
        assert _free_pages_read_zero(g_alloc, g_kv)
        assert not _free_pages_read_zero(s_alloc, s_kv)
        assert gov.kvgov.gov.ledger.counters["acme"].blocks_zeroized > 0
        other = _drive(gov, g_alloc, g_kv, [_req(99, "globex", stream[-1])])
        assert other[0][0] == 0  # across scopes nothing matches at page size 1 either
    finally:
        gov.kvgov_close()
    report = verify(f"sqlite:///{tmp_path}/audit.db")
    assert report.ok, report


def test_checkpoint_matches_stock_within_one_scope(tmp_path: Path) -> None:
    stream = _stream(40, seed=6)
    stock, s_alloc, s_kv = _build(False, tmp_path)
    gov, g_alloc, g_kv = _build(True, tmp_path)
    try:
        want = _drive_checkpoint(
            stock, s_alloc, s_kv, [_req(i, "acme", t) for i, t in enumerate(stream)]
        )
        reqs = [_req(i, "acme", t) for i, t in enumerate(stream)]
        got = _drive_checkpoint(gov, g_alloc, g_kv, reqs)
        assert got == want
        assert sum(r[0] for r in want) > 0 and sum(r[1] for r in want) > 0  # hits and evictions
        owners = gov.kvgov.gov.ledger.owners
        assert all(o is None or o.tenant == "acme" for o in owners.table)
        assert owners.of_tenant("acme")  # the checkpointed pages are owned
        # a checkpointed request of another tenant matches nothing of acme's
        other = _drive_checkpoint(gov, g_alloc, g_kv, [_req(99, "globex", stream[-1])])
        assert other[0][0] == 0
        g_alloc.alloc(PAGE)
        assert _free_pages_read_zero(g_alloc, g_kv)
    finally:
        gov.kvgov_close()
    report = verify(f"sqlite:///{tmp_path}/audit.db")
    assert report.ok, report


def test_across_scopes_nothing_matches(tmp_path: Path) -> None:
    stream = _stream(20, seed=2)
    gov, alloc, kv = _build(True, tmp_path)
    try:
        _drive(gov, alloc, kv, [_req(i, "acme", t) for i, t in enumerate(stream)])
        # another tenant, the same prompts, and extra_key / cache_salt a client chose
        other = [_req(100 + i, "globex", t, extra_key=None) for i, t in enumerate(stream)]
        results = _drive(gov, alloc, kv, other[:1])
        assert results[0][0] == 0
        # acme still hits its own
        again = _drive(gov, alloc, kv, [_req(200, "acme", stream[-1])])
        assert again[0][0] > 0
    finally:
        gov.kvgov_close()


def test_a_key_kvgov_did_not_issue_matches_nothing(tmp_path: Path) -> None:
    stream = _stream(4, seed=3)
    gov, alloc, kv = _build(True, tmp_path)
    try:
        reqs = [_req(i, "acme", t) for i, t in enumerate(stream)]
        _drive(gov, alloc, kv, reqs)
        # a caller replaying the namespace string without going through admission
        forged = RadixKey(array("q", stream[0]), reqs[0].extra_key + "x")
        assert gov.match_prefix(MatchPrefixParams(key=forged)).device_prefix_len == 0
        stolen = RadixKey(array("q", stream[0]), reqs[0].extra_key)  # issued: a scheduler key
        assert gov.match_prefix(MatchPrefixParams(key=stolen)).device_prefix_len > 0
    finally:
        gov.kvgov_close()
