"""HiCache's host pool zeroed, and the start-time rule for HiCache (needs SGLang).

SGLang's ``MHATokenToKVPoolHost`` is built on the CPU over a device pool, governed as
the governed cache governs it (:func:`fence.govern_host_pool`); every page it takes
back must read zero before ``alloc`` hands it out again. HiCache is accepted only with
kvgov's L3 backend; any other is refused by name.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.pool_host.mha")

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402

from kvgov.exceptions import UnsupportedEngine  # noqa: E402
from kvgov.govern.sglang import fence  # noqa: E402
from kvgov.govern.sglang.cache import (  # noqa: E402
    check_engine,
    check_hicache,
    hicache_backend_problem,
)
from kvgov.govern.sglang.host_pool import HostPoolZeroer  # noqa: E402

from .test_differential import _build  # noqa: E402

PAGE = 16
LAYOUTS = ("layer_first", "page_first", "page_first_direct")


def _host(layout: str, governed: bool) -> tuple[Any, list[tuple[int, int, float]]]:
    kv = MHATokenToKVPool(
        size=256,
        page_size=PAGE,
        dtype=torch.float32,
        head_num=2,
        head_dim=4,
        layer_num=3,
        device="cpu",
        enable_memory_saver=False,
    )
    host = MHATokenToKVPoolHost(
        kv._mha_buffer_info(),
        2.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=256,
        start_layer=0,
        end_layer=3,
    )
    calls: list[tuple[int, int, float]] = []
    if governed:
        fence.govern_host_pool(host, HostPoolZeroer(host, lambda *a: calls.append(a)))
    return host, calls


def _fill(host: Any, slots: torch.Tensor, value: float) -> None:
    page = host.get_dummy_flat_data_page()
    for start in slots[::PAGE].tolist():
        host.set_from_flat_data_page(int(start), torch.full_like(page, value))


def _zero(host: Any, slots: torch.Tensor) -> bool:
    return all(
        not bool(host.get_data_page(int(s), flat=True).any()) for s in slots[::PAGE].tolist()
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_freed_host_page_reads_zero_before_it_is_handed_out_again(layout: str) -> None:
    host, calls = _host(layout, governed=True)
    slots = host.alloc(8 * PAGE)
    _fill(host, slots, 3.5)
    freed, kept = slots[: 5 * PAGE], slots[5 * PAGE :]

    assert host.free(freed) == freed.numel()

    assert _zero(host, freed)
    assert not _zero(host, kept)  # only the freed pages: the others keep their KV
    assert len(calls) == 1 and calls[0][0] == 5  # one call, one fill, five pages
    again = host.alloc(host.available_size())
    assert _zero(host, again)  # whatever alloc hands out reads zero


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_ungoverned_host_pool_hands_out_a_tenants_kv(layout: str) -> None:
    """SGLang's own pool, for contrast: what the governance fixes."""
    host, _ = _host(layout, governed=False)
    slots = host.alloc(2 * PAGE)
    _fill(host, slots, 3.5)
    host.free(slots)
    assert not _zero(host, slots)


def test_clear_zeroes_the_whole_host_pool() -> None:
    host, _ = _host("page_first", governed=True)
    slots = host.alloc(4 * PAGE)
    _fill(host, slots, 2.0)
    host.clear()
    assert not bool(host.kv_buffer.any())


def test_a_host_pool_of_an_unknown_layout_is_refused() -> None:
    host, _ = _host("layer_first", governed=False)
    host.layout = "page_head"
    with pytest.raises(UnsupportedEngine, match="page_head"):
        HostPoolZeroer(host)


# ---------------------------------------------------------------------- the start-time rule

_KVGOV = (
    '{"backend_name": "kvgov", "module_path": "kvgov.govern.sglang.storage", '
    '"class_name": "GovernedHiCacheStorage", "kvgov": {"key_store_url": "sqlite://"}}'
)


@pytest.mark.parametrize(
    ("backend", "extra", "named"),
    [
        (None, None, "without an L3 storage backend"),
        ("file", None, "'file'"),
        ("mooncake", None, "'mooncake'"),
        ("dynamic", '{"backend_name": "mine", "module_path": "m", "class_name": "C"}', "'mine'"),
        ("dynamic", "not json", "not a JSON object"),
    ],
)
def test_hicache_with_another_l3_backend_is_refused_by_name(
    backend: str | None, extra: str | None, named: str
) -> None:
    args = SimpleNamespace(
        hicache_storage_backend=backend, hicache_storage_backend_extra_config=extra
    )
    problem = hicache_backend_problem(backend, extra)
    assert problem is not None and named in problem
    with pytest.raises(UnsupportedEngine, match="kvgov's encrypted tier") as info:
        check_hicache(args)
    assert named in str(info.value)
    ctx = SimpleNamespace(
        enable_hierarchical_cache=True, server_args=args, params=SimpleNamespace()
    )
    with pytest.raises(UnsupportedEngine):
        check_engine(ctx)  # the factory's check: before anything is built


def test_hicache_in_buffer_only_host_memory_mode_is_refused() -> None:
    """Its loads back bypass load_back, where loaded pages get their owner."""
    args = SimpleNamespace(
        hicache_storage_backend="kvgov",
        hicache_storage_backend_extra_config=None,
        hicache_host_memory_mode="buffer_only",
    )
    with pytest.raises(UnsupportedEngine, match="buffer_only"):
        check_hicache(args)
    with pytest.raises(UnsupportedEngine, match="buffer_only"):
        check_engine(
            SimpleNamespace(
                enable_hierarchical_cache=True, server_args=args, params=SimpleNamespace()
            )
        )


@pytest.mark.parametrize(("backend", "extra"), [("dynamic", _KVGOV), ("kvgov", None)])
def test_hicache_with_kvgovs_l3_backend_is_accepted(backend: str, extra: str | None) -> None:
    args = SimpleNamespace(
        hicache_storage_backend=backend, hicache_storage_backend_extra_config=extra
    )
    assert hicache_backend_problem(backend, extra) is None
    check_hicache(args)
    check_engine(
        SimpleNamespace(enable_hierarchical_cache=True, server_args=args, params=SimpleNamespace())
    )


def test_a_runtime_attach_of_another_backend_is_refused(tmp_path: Path) -> None:
    cache, _, _ = _build(True, tmp_path)
    try:
        ok, msg = cache.attach_storage_backend("file")
        assert not ok and "'file'" in msg
    finally:
        cache.kvgov_close()


def test_the_plugin_registers_kvgov_with_sglangs_storage_factory() -> None:
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from kvgov.govern.sglang import plugin

    plugin.register()
    plugin.register()  # a no-op the second time
    assert "kvgov" in StorageBackendFactory._registry
    assert StorageBackendFactory._registry["kvgov"]["loader"]().__name__ == "GovernedHiCacheStorage"
