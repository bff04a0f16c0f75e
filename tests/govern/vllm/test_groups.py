"""Every attention KV cache group governed: hybrid full + sliding-window, chunked local attention.

vLLM's ``HybridKVCacheCoordinator`` keeps one pool for every group; a sliding-window
group frees the blocks that fall out of its window while the request runs. Each of
them leaves an owner: it is cached (owner and retention kept) or ordered zeroed.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.exceptions import UnsupportedEngine
from tests.govern.vllm.kv_specs import kv_specs

pytestmark = pytest.mark.vllm

WINDOW = 32  # two blocks of 16: far smaller than the prompts below
PROMPT = list(range(300, 460))  # 160 tokens: 10 blocks


def _specs(*kinds: str) -> list[Any]:
    return kv_specs(*kinds, window=WINDOW, mamba_shapes=((1,),))


def _group_ids(sched: Any, req_id: str) -> list[list[int]]:
    return [list(ids) for ids in sched.kv_cache_manager.get_block_ids(req_id)]


@pytest.mark.parametrize("layout", [("full", "sliding"), ("full", "chunked"), ("sliding",)])
def test_each_group_is_keyed_in_the_request_scope(vllm: Any, layout: tuple[str, ...]) -> None:
    """Same prompt, same tenant: reused in every group; another tenant: nothing, in any group."""
    sched = vllm.scheduler(specs=_specs(*layout))
    vllm.run(sched, vllm.request("a1", PROMPT, tenant="acme"))
    assert vllm.hit(sched, vllm.request("b1", PROMPT, tenant="globex")) == 0
    assert vllm.hit(sched, vllm.request("a2", PROMPT, tenant="acme")) > 0
    vllm.run(sched)
    worker = vllm.worker(sched)
    assert worker.violations == []
    assert worker.remnants(sched) == []
    sched.kvgov.gov._check_invariants()


def test_stock_vllm_leaks_across_tenants_in_every_group(vllm: Any) -> None:
    """The control: vLLM's own hybrid coordinator serves one tenant's blocks to another."""
    sched = vllm.stock(specs=_specs("full", "sliding"))
    vllm.run(sched, vllm.request("a1", PROMPT, tenant="acme"))
    assert vllm.hit(sched, vllm.request("b1", PROMPT, tenant="globex")) > 0


def test_blocks_of_every_group_get_the_request_owner(vllm: Any) -> None:
    """New blocks of the full and the sliding-window group are owned by the request's scope."""
    sched = vllm.scheduler(specs=_specs("full", "sliding"))
    sched.add_request(vllm.request("r", PROMPT, tenant="acme", max_tokens=4))
    vllm.step(sched)
    full, sliding = _group_ids(sched, "r")
    owners = sched.kvgov.gov.ledger.owners.table
    real = [b for b in full + sliding if b != 0]
    assert sliding and {b for b in sliding if b != 0}.isdisjoint(full)
    assert {owners[b].tenant for b in real} == {"acme"}


@pytest.mark.parametrize("retention", [0, None], ids=["sparse", "dense"])
def test_a_window_slide_zeroes_the_dropped_blocks_while_the_request_runs(
    vllm: Any, retention: int | None
) -> None:
    """Blocks that fall out of the window mid-request leave their owner: those vLLM does not
    keep cached go out in a zero list before the request ends, the rest stay cached and owned.

    ``sparse`` is vLLM's default retention (only the windows a later hit can reach are
    cached), ``dense`` caches every full block."""
    sched = vllm.scheduler(specs=_specs("full", "sliding"), retention_interval=retention)
    req = vllm.request("r", PROMPT, tenant="acme", max_tokens=40)
    sched.add_request(req)
    vllm.step(sched)
    _, first_window = _group_ids(sched, "r")
    zeroed_while_running: set[int] = set()
    while "r" in sched.requests:
        so, _ = vllm.step(sched)
        if "r" in sched.requests:
            zeroed_while_running |= set(so.new_block_ids_to_zero or ())
    _, sliding_now = _group_ids(sched, "r") if "r" in sched.requests else ([], [])
    dropped = {b for b in first_window if b != 0} - set(sliding_now)
    assert dropped
    pool = sched.kv_cache_manager.block_pool
    uncached = {b for b in dropped if pool.blocks[b].block_hash is None}
    assert bool(uncached) == (retention == 0)
    assert uncached <= zeroed_while_running
    owners = sched.kvgov.gov.ledger.owners.table
    for b in dropped - uncached:  # kept cached: still the request's, findable by its scope only
        assert owners[b] is not None and owners[b].tenant == "acme"
    vllm.run(sched)
    assert vllm.worker(sched).violations == []
    assert vllm.worker(sched).remnants(sched) == []


def test_window_slide_without_prefix_caching_zeroes_every_dropped_block(vllm: Any) -> None:
    """Prefix caching off: every block the window drops is zeroed before the request ends."""
    sched = vllm.scheduler(specs=_specs("full", "sliding"), caching=False)
    sched.add_request(vllm.request("r", PROMPT, tenant="acme", max_tokens=40))
    vllm.step(sched)
    _, first_window = _group_ids(sched, "r")
    zeroed: set[int] = set()
    while "r" in sched.requests:
        so, _ = vllm.step(sched)
        if "r" in sched.requests:
            zeroed |= set(so.new_block_ids_to_zero or ())
    dropped = {b for b in first_window if b != 0}
    assert dropped and dropped <= zeroed


def test_purge_and_eviction_cover_every_group(vllm: Any) -> None:
    """Under eviction pressure and a purge, no block of any group is written while it still
    holds someone else's KV, nothing is left unowned and unzeroed, and the purge erases the
    tenant's blocks of both groups."""
    sched = vllm.scheduler(specs=_specs("full", "sliding"), num_blocks=40)
    for i in range(8):
        prompt = [(i * 97 + j) % 30_000 for j in range(90)]
        vllm.run(sched, vllm.request(f"r{i}", prompt, tenant=("acme", "globex")[i % 2]))
    from vllm.v1.core.kv_cache_utils import get_group_id

    owners = sched.kvgov.gov.ledger.owners.table
    pool = sched.kv_cache_manager.block_pool

    def acme_cached_groups() -> set[int]:
        return {
            get_group_id(b.block_hash)
            for b in pool.blocks
            if b.block_hash is not None and owners[b.block_id].tenant == "acme"
        }

    assert acme_cached_groups() == {0, 1}  # the full and the sliding-window group
    report = sched.kvgov_call("purge_tenant", "acme")
    assert report["blocks_zeroized"] > 0
    assert acme_cached_groups() == set()
    vllm.run(sched)  # the idle engine's zeroing step
    assert not any(o is not None and o.tenant == "acme" for o in owners)
    worker = vllm.worker(sched)
    assert worker.violations == []
    assert worker.remnants(sched) == []
    stats = sched.kvgov_call("stats")
    assert stats["total"]["evictions"]["capacity"] > 0
    sched.kvgov.gov._check_invariants()


def test_a_cut_hit_ends_at_the_same_token_in_every_group(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the sharing policy cuts a hybrid hit, every group's blocks end at the cut: the
    sliding-window group gets the window before the cut, not a truncated later window."""
    sched = vllm.scheduler(specs=_specs("full", "sliding"))
    vllm.run(sched, vllm.request("a1", PROMPT, tenant="acme"))
    binding = sched.kvgov
    cut = 5 * 16
    calls: list[int] = []

    def judge(request: Any, hit_groups: Any, hit_tokens: int) -> int:
        calls.append(hit_tokens)
        return min(hit_tokens, cut)

    monkeypatch.setattr(binding, "judge_hit", judge)
    req = vllm.request("a2", PROMPT, tenant="acme")
    sched.kvgov.admit(req)
    blocks, tokens, *_ = sched.kv_cache_manager.get_computed_blocks(req)
    assert tokens == cut and calls[0] > cut
    full, sliding = blocks.blocks
    assert len(full) == len(sliding) == cut // 16
    assert all(not b.is_null for b in full)
    window = [b for b in sliding if not b.is_null]
    assert window and window[-1].block_hash is not None
    lookup = sched.kv_cache_manager.coordinator.find_longest_cache_hit(req.block_hashes, cut)
    assert [b.block_id for b in sliding] == [b.block_id for b in lookup[0][1]]


def _tensors(*layers: str) -> list[Any]:
    """One KV tensor over ``layers``, as a real engine's config has (the check reads only
    that there are some)."""
    from vllm.v1.kv_cache_interface import KVCacheTensor

    return [KVCacheTensor(size=1 << 20, layers=list(layers), layer_stride=1 << 10, block_stride=16)]


@pytest.mark.parametrize(
    ("on_cpu", "zeroer"),
    [(True, False), (True, True), (False, False)],
    ids=["cpu-runner-vllm-zeroer", "cpu-runner-kvgov-zeroer", "other-runner"],
)
def test_a_window_only_model_is_refused_on_the_cpu_build_without_kvgovs_zeroer(
    vllm: Any, monkeypatch: pytest.MonkeyPatch, on_cpu: bool, zeroer: bool
) -> None:
    """vLLM's CPU runner zeroes full-attention layers' tensors only: a model whose every
    layer has a window would have its freed blocks ordered zeroed and never cleared, so
    the CPU build refuses it unless kvgov's CPU zeroer (every attention layer) is in the
    process; the GPU runner's zeroer clears every attention layer."""
    from types import SimpleNamespace

    from kvgov.govern.vllm import fence, groups

    monkeypatch.setattr(groups, "current_platform", SimpleNamespace(is_cpu=lambda: on_cpu))
    monkeypatch.setattr(fence, "cpu_zeroer_installed", lambda: zeroer)
    if on_cpu and not zeroer:
        with pytest.raises(UnsupportedEngine, match="CPU zeroer"):
            vllm.scheduler(specs=_specs("sliding"), kv_cache_tensors=_tensors("layer0"))
    else:
        vllm.scheduler(specs=_specs("sliding"), kv_cache_tensors=_tensors("layer0"))
    # beside full attention (one layer each, one allocation): the full layer's zeroing
    # clears the window layer's bytes too (the e2e test reads it back on the CPU build)
    vllm.scheduler(specs=_specs("full", "sliding"), kv_cache_tensors=_tensors("layer0", "layer1"))


def test_kvgovs_cpu_zeroer_clears_every_attention_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU runner's zeroer, as kvgov's plugin installs it: the given blocks of every
    attention layer's tensor read zero (vLLM's own, the control, clears the full-attention
    layer only), a tensor two layers view is cleared once, a runner-only layer is left
    alone, a Mamba layer's state is cleared too (test_mamba.py has conv and ssm states),
    and other blocks keep their bytes."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec
    from vllm.v1.worker import cpu_model_runner

    from kvgov.govern.vllm import fence

    full, sliding, mamba = _specs("full", "sliding", "mamba")
    vllm_zero = cpu_model_runner.CPUModelRunner._zero_block_ids
    if getattr(vllm_zero, "_kvgov", False):  # the plugin already replaced it here
        vllm_zero = None

    def runner() -> Any:
        kv = {n: torch.ones(6, 2, 4) for n in ("f", "s1", "s2", "enc", "m")}
        kv["s3"] = kv["s2"]  # two layers viewing one tensor
        groups = [
            KVCacheGroupSpec(["f"], full),
            KVCacheGroupSpec(["s1", "s2", "s3", "enc"], sliding),
            KVCacheGroupSpec(["m"], mamba),
        ]
        return SimpleNamespace(
            kv=kv,
            runner_only_attn_layers={"enc"},
            kv_cache_config=SimpleNamespace(kv_cache_groups=groups),
            compilation_config=SimpleNamespace(
                static_forward_context={n: SimpleNamespace(kv_cache=t) for n, t in kv.items()}
            ),
        )

    if vllm_zero is not None:
        control = runner()
        vllm_zero(control, [1, 4])
        assert not control.kv["f"][[1, 4]].any(), "vLLM's zeroer clears full attention"
        assert control.kv["s1"][[1, 4]].all(), "control: vLLM's leaves a window layer's KV"
    # the class's zeroer is restored after the test, whichever this process had
    monkeypatch.setattr(
        cpu_model_runner.CPUModelRunner,
        "_zero_block_ids",
        cpu_model_runner.CPUModelRunner._zero_block_ids,
    )
    with monkeypatch.context() as m:
        m.setattr("vllm.platforms.current_platform", SimpleNamespace(is_cpu=lambda: True))
        if vllm_zero is not None:
            assert fence.install_cpu_zeroer()
        assert fence.cpu_zeroer_installed()
        r = runner()
        cpu_model_runner.CPUModelRunner._zero_block_ids(r, [1, 4])
    for name in ("f", "s1", "s2", "s3"):
        assert not r.kv[name][[1, 4]].any(), name
        assert r.kv[name][[0, 2, 3, 5]].all(), name
    assert r.kv["enc"].all()
    assert not r.kv["m"][[1, 4]].any() and r.kv["m"][[0, 2, 3, 5]].all()


def test_more_window_layers_than_full_ones_are_refused_on_the_cpu_build() -> None:
    """A window group spanning more bytes a block than the full-attention group: its
    pages past the full layers' would stay unzeroed on the CPU build."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    from kvgov.govern.vllm.groups import check_cpu_zeroing

    full, sliding = _specs("full", "sliding")
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=_tensors("f", "s1", "s2"),
        kv_cache_groups=[KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["s1", "s2"], sliding)],
    )
    with pytest.raises(UnsupportedEngine, match="SlidingWindowSpec"):
        check_cpu_zeroing(config, on_cpu=True, zeroer=False)
    check_cpu_zeroing(config, on_cpu=True, zeroer=True)  # kvgov's zeroer clears every layer
    check_cpu_zeroing(config, on_cpu=False, zeroer=False)
    config.kv_cache_tensors = []  # no worker holds KV (a scheduler-only configuration)
    check_cpu_zeroing(config, on_cpu=True, zeroer=False)
