"""kvgov's HiCache L3 backend through SGLang's ``HiCacheStorage`` interface (needs SGLang).

A governed cache admits the requests (its governance is the backend's); the backend
stores pages in a temp-dir disk tier and the real Redis (127.0.0.1:6379), sealed under
the owner's data key. The pages are an SGLang host pool's flat data pages (built on the
CPU), written and read through the interface SGLang's controller calls (``batch_set``,
``batch_exists``, ``batch_get``, and the zero-copy ``batch_*_v1`` on the host pool).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.hicache_storage")

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402

from kvgov.audit.queries import AuditQueries  # noqa: E402
from kvgov.govern.sglang.storage import GovernedHiCacheStorage  # noqa: E402
from kvgov.offload import DiskTier, LocalKEK, RedisTier  # noqa: E402
from tests.support.offload import MemoryKeyStore  # noqa: E402
from tests.support.redis import SHARED_REDIS  # noqa: E402

from .test_differential import PAGE, _build, _req, _stream  # noqa: E402

KEK = LocalKEK(bytes(range(32)))


def _config(tp_rank: int = 0) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=2,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name="m",
    )


class Rig:
    """A governed cache, an SGLang host pool on its KV pool, kvgov's backend over both."""

    def __init__(self, tmp: Path, prefix: str) -> None:
        self.tmp = tmp
        self.cache, self.alloc, self.kv = _build(True, tmp)
        self.host = MHATokenToKVPoolHost(
            self.kv._mha_buffer_info(),
            2.0,
            0,
            PAGE,
            "layer_first",
            pin_memory=False,
            device="cpu",
            device_capacity_tokens=self.kv.size,
            start_layer=0,
            end_layer=self.kv.layer_num,
        )
        self.disk = DiskTier(tmp / "disk", 1 << 24, name="disk", fsync=False)
        self.redis = RedisTier(SHARED_REDIS, 1 << 24, name="redis", prefix=prefix, timeout=1.0)
        self.keys = MemoryKeyStore()
        self.backend = self.open_backend()
        self.cache.kvgov_storage = self.backend  # what init_hicache does once SGLang built it

    def open_backend(self, config: HiCacheStorageConfig | None = None) -> GovernedHiCacheStorage:
        backend = GovernedHiCacheStorage(
            config or _config(), tiers=[self.disk, self.redis], key_store=self.keys, kek=KEK
        )
        backend.register_mem_pool_host(self.host)
        backend.kvgov_attach(self.cache.kvgov)
        return backend

    def names(self, i: int, tenant: str, toks: Any, **custom: str) -> list[str]:
        """Admit a request as the scheduler would; bind and return SGLang's page names.

        Its classification is ``public`` unless given (the default policy lets public
        scopes offload to disk and Redis; ``internal`` to host memory only).
        """
        req = _req(i, tenant, toks, **{"kvgov_classification": "public", **custom})
        ns = self.cache.kvgov_admit(req)
        return self.cache.kvgov_storage_bind(list(toks), ns, None)

    def owner(self, i: int, tenant: str, toks: Any, **custom: str) -> Any:
        """The L3 owner the governed cache gives a request's namespace."""
        req = _req(i, tenant, toks, **{"kvgov_classification": "public", **custom})
        return self.cache.kvgov_storage_owner(self.cache.kvgov_admit(req))

    def pages(self, n: int, seed: int = 7) -> list[torch.Tensor]:
        """``n`` flat data pages of distinctive values (what a forward pass wrote)."""
        gen = torch.Generator().manual_seed(seed)
        size = self.host.get_dummy_flat_data_page().numel()
        return [torch.rand(size, generator=gen) * 1000 + 1 for _ in range(n)]

    def load(self, names: list[str]) -> list[torch.Tensor | None]:
        return self.backend.batch_get(names, [self.host.get_dummy_flat_data_page() for _ in names])

    def redis_client(self) -> Any:
        """A raw client of the same Redis (an operator's, an attacker's access)."""
        import redis

        return redis.Redis.from_url(SHARED_REDIS)

    def events(self, etype: str) -> list[Any]:
        self.cache.kvgov.gov.audit.flush()
        with AuditQueries(f"sqlite:///{self.tmp}/audit.db") as q:
            return list(q.events(type=etype))

    def close(self) -> None:
        self.backend.close()
        self.cache.kvgov_close()


@pytest.fixture()
def rig(tmp_path: Path, redis_prefix: str) -> Iterator[Rig]:
    r = Rig(tmp_path, redis_prefix)
    try:
        yield r
    finally:
        r.close()


def test_it_is_an_sglang_storage_backend() -> None:
    assert issubclass(GovernedHiCacheStorage, HiCacheStorage)


def test_a_scope_finds_its_own_pages_and_they_round_trip(rig: Rig) -> None:
    toks = _stream(1, seed=3)[0]
    names = rig.names(0, "acme", toks)
    assert len(names) == len(toks) // PAGE
    pages = rig.pages(len(names))

    assert rig.backend.batch_set(names, pages)
    assert rig.backend.batch_exists(names) == len(names)
    got = rig.load(names)
    assert all(g is not None and torch.equal(g, p) for g, p in zip(got, pages, strict=True))

    # a later request of the same scope (same tokens) finds them
    again = rig.names(1, "acme", toks)
    assert again == names and rig.backend.batch_exists(again) == len(names)
    saves = [e for e in rig.events("offload") if e.details.get("backend") == "kvgov.sglang/hicache"]
    assert saves and saves[0].tenant == "acme" and saves[0].details["outcome"] == "save_stored"
    loads = [e for e in rig.events("offload_restore") if e.details.get("outcome") == "loaded"]
    assert loads and loads[0].reused_tokens == len(names) * PAGE


def test_another_tenant_or_scope_finds_nothing_for_the_same_tokens(rig: Rig) -> None:
    toks = _stream(1, seed=3)[0]
    names = rig.names(0, "acme", toks)
    assert rig.backend.batch_set(names, rig.pages(len(names)))

    for i, (tenant, custom) in enumerate([("globex", {}), ("acme", {"kvgov_template": "v2"})]):
        theirs = rig.names(10 + i, tenant, toks, **custom)
        assert theirs and theirs != names  # SGLang's names differ: kvgov's namespace seeds them
        assert rig.backend.batch_exists(theirs) == 0
        assert rig.load(theirs)[0] is None

    # even under SGLang's very names, another owner's object key differs: 0 hits
    globex = rig.owner(20, "globex", toks)
    assert globex is not None
    rig.backend.bind(names, globex)
    assert rig.backend.batch_exists(names) == 0 and rig.load(names)[0] is None
    misses = [e for e in rig.events("offload_restore") if e.details.get("outcome") == "miss"]
    assert any(e.tenant == "globex" for e in misses)


def test_a_name_no_governed_request_bound_is_neither_stored_nor_found(rig: Rig) -> None:
    toks = _stream(1, seed=5)[0]
    names = rig.names(0, "acme", toks)
    stranger = ["ab" * 32, "cd" * 32]
    assert not rig.backend.batch_set(stranger, rig.pages(2))
    assert rig.backend.batch_exists(stranger) == 0
    assert rig.backend.batch_set(names, rig.pages(len(names)))
    # a rank of another shard (another TP rank) finds none of this rank's pages
    other = rig.open_backend(_config(tp_rank=1))
    try:
        other.bind(names, rig.owner(1, "acme", toks))
        assert other.batch_exists(names) == 0
    finally:
        other.close()
    refused = [e for e in rig.events("offload_refused") if e.details.get("reason") == "unbound"]
    assert refused


def test_the_offload_policy_decides_which_scopes_reach_the_tiers(rig: Rig) -> None:
    toks = _stream(1, seed=4)[0]
    # internal data may go to host memory only (the default policy): this rig has none
    assert rig.owner(0, "acme", toks, kvgov_classification="internal") is None
    assert rig.names(1, "acme", toks, kvgov_classification="internal") == []
    denied = [
        e for e in rig.events("offload_restore") if e.details.get("reason") == "offload_denied"
    ]
    assert denied and denied[0].tenant == "acme"


def test_the_tiers_hold_no_plaintext_of_a_page_and_no_tenant(rig: Rig) -> None:
    toks = _stream(1, seed=6)[0]
    names = rig.names(0, "acme-private-bank", toks)
    pages = rig.pages(len(names), seed=11)
    assert rig.backend.batch_set(names, pages)

    stored = [p.read_bytes() for p in (rig.tmp / "disk").rglob("*") if p.is_file()]
    client = rig.redis_client()
    keys = list(client.scan_iter(match=f"{rig.redis.prefix}*"))
    stored += [v for v in (client.get(k) for k in keys if client.type(k) == b"string") if v]
    assert len(stored) >= 2 * len(names)  # every page in both tiers
    blob = b"".join(stored) + b"".join(keys)
    for page in pages:
        raw = page.numpy().tobytes()
        assert raw[:64] not in blob and raw[-64:] not in blob
    for name in names:
        assert name.encode() not in blob and bytes.fromhex(name) not in blob
    assert b"acme-private-bank" not in blob


def test_a_tampered_object_is_refused_and_audited(rig: Rig) -> None:
    toks = _stream(1, seed=9)[0]
    names = rig.names(0, "acme", toks)
    pages = rig.pages(len(names))
    assert rig.backend.batch_set(names, pages)
    owner = rig.owner(1, "acme", toks)
    assert owner is not None
    path = rig.disk.path_of(rig.backend.object_key(names[0], owner))
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x01  # one bit of the ciphertext
    path.write_bytes(bytes(data))

    got = rig.load(names[:1])  # the disk copy is refused; Redis's genuine copy loads
    assert got[0] is not None and torch.equal(got[0], pages[0])
    refused = rig.events("offload_refused")
    assert any(e.details.get("reason") == "tampered" and e.tenant == "acme" for e in refused)

    key = rig.redis.object_key(rig.backend.object_key(names[1], owner))
    client = rig.redis_client()
    value = bytearray(client.get(key))
    value[-20] ^= 0x01
    client.set(key, bytes(value), keepttl=True)
    data = bytearray(rig.disk.path_of(rig.backend.object_key(names[1], owner)).read_bytes())
    data[-20] ^= 0x01
    rig.disk.path_of(rig.backend.object_key(names[1], owner)).write_bytes(bytes(data))
    assert rig.load(names[1:2])[0] is None  # both copies refused: a miss, never bad KV


def test_purge_tenant_shreds_its_stored_pages(rig: Rig) -> None:
    toks = _stream(1, seed=12)[0]
    acme = rig.names(0, "acme", toks)
    globex = rig.names(1, "globex", toks)
    assert rig.backend.batch_set(acme, rig.pages(len(acme)))
    assert rig.backend.batch_set(globex, rig.pages(len(globex)))
    owner = rig.owner(2, "acme", toks)
    assert owner is not None
    sealed = rig.disk.get(rig.backend.object_key(acme[0], owner))
    assert sealed is not None

    report = rig.cache.kvgov.purge_tenant("acme")

    assert report.destroyed_key_ids  # the tenant's data key is gone
    assert rig.backend.batch_exists(acme) == 0
    # a copy kept aside (a backup of the disk, a Redis replica) no longer opens
    rig.disk.put(sealed, 0)
    rig.backend.bind(acme, owner)
    assert rig.load(acme[:1])[0] is None
    refused = rig.events("offload_refused")
    assert any(e.details.get("reason") == "key_destroyed" for e in refused)
    erasure = rig.events("erasure")
    assert erasure and erasure[-1].details["offload"]["shredded"] is True
    # the other tenant keeps its pages
    assert rig.backend.batch_exists(globex) == len(globex)


def test_zero_copy_v1_reads_and_writes_the_host_pool(rig: Rig) -> None:
    toks = _stream(1, seed=13)[0]
    names = rig.names(0, "acme", toks)
    n = len(names)
    src = rig.host.alloc(n * PAGE)
    for i, page in enumerate(rig.pages(n)):
        rig.host.set_from_flat_data_page(int(src[i * PAGE]), page)
    assert all(rig.backend.batch_set_v1(names, src))
    dst = rig.host.alloc(n * PAGE)
    assert all(rig.backend.batch_get_v1(names, dst))
    for i in range(n):
        a = rig.host.get_data_page(int(src[i * PAGE]), flat=True)
        b = rig.host.get_data_page(int(dst[i * PAGE]), flat=True)
        assert torch.equal(a, b)
