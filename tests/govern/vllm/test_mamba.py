"""Mamba / linear-attention state groups governed: a full-attention + Mamba hybrid.

vLLM's hybrid coordinator keeps one pool for the attention group and the state group.
In "align" mode (prefix caching on) a Mamba group holds, per request, the state at its
last block boundary and the running state; it frees the older state blocks each step,
caches the state at block boundaries under the request's block hash and hits one state
block at the end of a prefix (the blocks before it are vLLM's null block). Every state
block that leaves an owner is cached (owner and retention kept) or ordered zeroed,
like an attention block; the fake worker checks no block, state blocks included, is
written while it still holds another request's bytes.

The CPU build of vLLM runs no Mamba hybrid with prefix caching on (Jamba's Mamba1
kernel is missing, GraniteMoeHybrid's Mamba2 fails with it), so "align" mode is tested
here, with a fake worker, and the workers' zeroers on state tensors of their own
(``test_the_zeroers_clear_mamba_state_tensors``); a Mamba2 hybrid without prefix caching
("none" mode) runs on the real engine in ``e2e/test_mamba_no_prefix.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.exceptions import UnsupportedEngine
from tests.govern.vllm.kv_specs import kv_specs

pytestmark = pytest.mark.vllm

BS = 16
PROMPT = list(range(300, 460))  # 160 tokens: 10 blocks


def _specs(*kinds: str) -> list[Any]:
    return kv_specs(*kinds, mamba_cache_mode="align")


def _hybrid(vllm: Any, **kwargs: Any) -> Any:
    return vllm.scheduler(specs=_specs("full", "mamba"), mamba_cache_mode="align", **kwargs)


def _group_ids(sched: Any, req_id: str) -> list[list[int]]:
    return [list(ids) for ids in sched.kv_cache_manager.get_block_ids(req_id)]


def _prompt(i: int, n: int = 90) -> list[int]:
    return [(i * 97 + j) % 30_000 for j in range(n)]


def _check_clean(vllm: Any, sched: Any) -> None:
    worker = vllm.worker(sched)
    assert worker.violations == []
    assert worker.remnants(sched) == []
    sched.kvgov.gov._check_invariants()


def test_a_mamba_hybrid_is_governed_with_its_coordinator(vllm: Any) -> None:
    """The scheduler starts over a full-attention + Mamba config (vLLM's hybrid
    coordinator), and every new block of both groups gets the request's owner."""
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    sched = _hybrid(vllm)
    assert isinstance(sched.kv_cache_manager.coordinator, HybridKVCacheCoordinator)
    sched.add_request(vllm.request("r", PROMPT, tenant="acme", max_tokens=4))
    vllm.step(sched)
    full, state = _group_ids(sched, "r")
    owners = sched.kvgov.gov.ledger.owners.table
    real_state = [b for b in state if b != 0]
    assert real_state and set(real_state).isdisjoint(full)
    assert {owners[b].tenant for b in full + real_state} == {"acme"}


def test_no_hit_across_scopes_in_any_group(vllm: Any) -> None:
    """Same prompt: another tenant hits nothing in either group, the same tenant reuses
    its attention blocks and the state block at the end of the hit."""
    sched = _hybrid(vllm)
    vllm.run(sched, vllm.request("a1", PROMPT, tenant="acme"))
    other = vllm.request("b1", PROMPT, tenant="globex")
    sched.kvgov.admit(other)
    assert sched.kv_cache_manager.coordinator.find_longest_cache_hit_per_group(
        other.block_hashes, len(PROMPT) - 1
    )[1] == (0, 0)
    assert vllm.hit(sched, vllm.request("b2", PROMPT, tenant="globex")) == 0
    again = vllm.request("a2", PROMPT, tenant="acme", max_tokens=4)
    sched.add_request(again)
    so, _ = vllm.step(sched)
    [new] = so.scheduled_new_reqs
    assert new.num_computed_tokens == 9 * BS  # a hit stops before the prompt's last token
    full, state = new.block_ids
    owners = sched.kvgov.gov.ledger.owners.table
    hit_state = [b for b in state[:9] if b != 0]
    assert len(hit_state) == 1 and owners[hit_state[0]].tenant == "acme"
    assert {owners[b].tenant for b in full[:9]} == {"acme"}
    vllm.run(sched)
    _check_clean(vllm, sched)


def test_stock_vllm_serves_one_tenants_state_to_another(vllm: Any) -> None:
    """The control: vLLM's own hybrid coordinator hands acme's attention blocks and
    Mamba state to globex."""
    sched = vllm.stock(specs=_specs("full", "mamba"), mamba_cache_mode="align")
    vllm.run(sched, vllm.request("a1", PROMPT, tenant="acme"))
    assert vllm.hit(sched, vllm.request("b1", PROMPT, tenant="globex")) > 0


@pytest.mark.parametrize("retention", [0, None], ids=["sparse", "dense"])
def test_state_blocks_a_running_request_drops_are_zeroed_while_it_runs(
    vllm: Any, retention: int | None
) -> None:
    """Decoding past block boundaries, vLLM releases the request's older state blocks:
    those it does not cache go out in a zero list while the request runs, the cached ones
    stay the request's (findable by its scope only).

    ``sparse`` is vLLM's default retention (only the states a later hit can reach are
    cached: the rest are freed unhashed), ``dense`` caches the state at every boundary."""
    sched = _hybrid(vllm, retention_interval=retention)
    sched.add_request(vllm.request("r", PROMPT, tenant="acme", max_tokens=60))
    vllm.step(sched)
    seen_state = {b for b in _group_ids(sched, "r")[1] if b != 0}
    zeroed_while_running: set[int] = set()
    now: set[int] = set()
    while "r" in sched.requests:
        so, _ = vllm.step(sched)
        if "r" in sched.requests:
            zeroed_while_running |= set(so.new_block_ids_to_zero or ())
            now = {b for b in _group_ids(sched, "r")[1] if b != 0}
            seen_state |= now
    pool = sched.kv_cache_manager.block_pool
    owners = sched.kvgov.gov.ledger.owners.table
    dropped = seen_state - now
    assert len(dropped) >= 3  # the state moved past three block boundaries
    uncached = {b for b in dropped if pool.blocks[b].block_hash is None}
    assert bool(uncached) == (retention == 0)
    assert uncached <= zeroed_while_running
    for b in dropped - uncached:
        assert owners[b] is not None and owners[b].tenant == "acme"
    vllm.run(sched)
    _check_clean(vllm, sched)


def test_request_end_zeroes_every_unhashed_block_of_both_groups(vllm: Any) -> None:
    """A finished request's blocks of both groups leave it: each is cached or in the next
    step's zero list."""
    sched = _hybrid(vllm)
    sched.add_request(vllm.request("r", _prompt(1, 70), tenant="acme", max_tokens=3))
    held: set[int] = set()
    while "r" in sched.requests:
        vllm.step(sched)
        if "r" in sched.requests:
            held |= {b for g in _group_ids(sched, "r") for b in g if b != 0}
    pool = sched.kv_cache_manager.block_pool
    unhashed = {b for b in held if pool.blocks[b].block_hash is None}
    assert unhashed
    run = vllm.run(sched)
    assert unhashed <= {b for z in run.zero_lists for b in z}
    _check_clean(vllm, sched)


def test_preemption_zeroes_the_preempted_requests_state(vllm: Any) -> None:
    """A pool too small for both requests' decode: vLLM preempts one, freeing its blocks of
    both groups; none is written by another request before it is zeroed."""
    sched = _hybrid(vllm, num_blocks=16)
    a = vllm.request("a", _prompt(2, 80), tenant="acme", max_tokens=80)
    b = vllm.request("b", _prompt(3, 80), tenant="globex", max_tokens=80)
    vllm.run(sched, a, b, max_steps=400)
    assert a.num_preemptions + b.num_preemptions > 0
    _check_clean(vllm, sched)


def test_eviction_and_purge_cover_the_state_group(vllm: Any) -> None:
    """Under eviction pressure and a purge no block of either group is written while it
    holds someone else's bytes, and the purge erases the tenant's cached state blocks."""
    from vllm.v1.core.kv_cache_utils import get_group_id

    sched = _hybrid(vllm, num_blocks=40)
    for i in range(8):
        vllm.run(sched, vllm.request(f"r{i}", _prompt(i), tenant=("acme", "globex")[i % 2]))
    owners = sched.kvgov.gov.ledger.owners.table
    pool = sched.kv_cache_manager.block_pool

    def acme_cached_groups() -> set[int]:
        return {
            get_group_id(b.block_hash)
            for b in pool.blocks
            if b.block_hash is not None and owners[b.block_id].tenant == "acme"
        }

    assert acme_cached_groups() == {0, 1}  # the attention and the state group
    report = sched.kvgov_call("purge_tenant", "acme")
    assert report["blocks_zeroized"] > 0
    assert acme_cached_groups() == set()
    vllm.run(sched)  # the idle engine's zeroing step
    assert not any(o is not None and o.tenant == "acme" for o in owners)
    stats = sched.kvgov_call("stats")
    assert stats["total"]["evictions"]["capacity"] > 0
    _check_clean(vllm, sched)


def test_a_cut_hit_ends_at_the_same_token_in_the_state_group(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the sharing policy cuts a hybrid hit, the hit ends at the deepest state at or
    before the cut, at the same token in both groups: not at the state of the uncut hit.

    A request caches the state at its prompt's last block boundary before the prompt's
    end and at each boundary its decode crosses: a 96-token prompt the states at 80 and 96
    tokens, the 160-token one at 144 and 160."""
    sched = _hybrid(vllm)
    vllm.run(sched, vllm.request("a0", PROMPT[:96], tenant="acme"))
    vllm.run(sched, vllm.request("a1", PROMPT, tenant="acme"))
    binding = sched.kvgov
    cut = 7 * BS  # no state between 96 and 144 tokens
    calls: list[int] = []

    def judge(request: Any, hit_groups: Any, hit_tokens: int) -> int:
        calls.append(hit_tokens)
        return min(hit_tokens, cut)

    monkeypatch.setattr(binding, "judge_hit", judge)
    req = vllm.request("a2", PROMPT, tenant="acme")
    sched.kvgov.admit(req)
    blocks, tokens, *_ = sched.kv_cache_manager.get_computed_blocks(req)
    assert calls == [9 * BS, 6 * BS]  # the uncut hit, then the one found under the cut
    assert tokens == 6 * BS
    full, state = blocks.blocks
    assert len(full) == len(state) == 6
    assert all(not b.is_null for b in full)
    assert [b.is_null for b in state] == [True] * 5 + [False]
    lookup = sched.kv_cache_manager.coordinator.find_longest_cache_hit(req.block_hashes, cut)
    assert state[-1].block_id == lookup[0][1][-1].block_id


def test_a_share_group_hit_is_judged_over_both_groups(vllm: Any) -> None:
    """Two publishers of a share group: the reader's hit covers the attention blocks and
    the state block at its end, all judged (the positions the policy judges list both
    groups in prefix order, the state block last, so a refusal anywhere cuts both
    groups there: test_a_cut_hit_ends_at_the_same_token_in_the_state_group), and the
    reuse is audited naming both tenants."""
    from kvgov.govern.vllm.groups import hit_positions

    group = {"g": {"publishers": ["bank", "clinic"], "classifications": ["public"]}}
    sched = _hybrid(vllm, kvgov={"policy_data": {"kvgov": {"config": {"share_groups": group}}}})
    vllm.run(sched, vllm.request("b1", PROMPT, tenant="bank", classification="public"))
    reader = vllm.request("c1", PROMPT, tenant="clinic", classification="public", max_tokens=4)
    sched.kvgov.admit(reader)
    blocks, tokens, *_ = sched.kv_cache_manager.get_computed_blocks(reader)
    n = tokens // BS
    assert n == 9
    full, state = blocks.blocks
    assert len(full) == len(state) == n
    found = hit_positions(blocks.blocks)
    assert [i for i, _ in found] == [*range(n - 1), n - 1, n - 1]
    assert found[-1] == (n - 1, state[-1].block_id)  # the state block comes last
    sched.add_request(reader)
    so, _ = vllm.step(sched)
    assert so.scheduled_new_reqs[0].num_computed_tokens == n * BS
    owners = sched.kvgov.gov.ledger.owners.table
    assert owners[state[-1].block_id].tenant == "bank"
    (event,) = vllm.events(sched, type="cross_tenant_reuse")
    assert (event.tenant, event.requester_tenant) == ("bank", "clinic")
    vllm.run(sched)
    _check_clean(vllm, sched)


def test_copy_on_write_moves_the_owner_with_the_hash(vllm: Any) -> None:
    """vLLM's ``move_block_hashes`` (a copy-on-write of a cached entry): the destination
    takes the source's owner, the source stays with its holder, unhashed, and is ordered
    zeroed when it leaves it; a purge then reaches the destination."""
    sched = _hybrid(vllm)
    sched.add_request(vllm.request("r", PROMPT, tenant="acme", max_tokens=50))
    vllm.step(sched)
    pool = sched.kv_cache_manager.block_pool
    owners = sched.kvgov.gov.ledger.owners.table
    full, _ = _group_ids(sched, "r")
    src = pool.blocks[full[0]]
    key = src.block_hash
    assert key is not None and src.ref_cnt == 1
    [dst] = pool.get_new_blocks(1)
    assert owners[dst.block_id] is None
    pool.move_block_hashes(src, dst)
    assert src.block_hash is None and dst.block_hash == key
    assert owners[dst.block_id] is owners[src.block_id]
    pool.free_blocks([dst])  # the copy ran: the entry is cached, the acme owner kept
    assert dst.ref_cnt == 0 and dst.block_hash == key
    sched.kvgov_call("purge_tenant", "acme")
    assert dst.block_hash is None
    zeroed: set[int] = set()
    while sched.has_requests():
        so, _ = vllm.step(sched)
        zeroed |= set(so.new_block_ids_to_zero or ())
    assert {src.block_id, dst.block_id} <= zeroed
    sched.kvgov.gov._check_invariants()


def test_a_mamba_group_is_refused_without_kvgovs_state_zeroer(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's zeroers skip Mamba layers: without kvgov's wrapper in the zeroing the
    workers run, a freed state block would be ordered zeroed and never cleared."""
    from types import SimpleNamespace

    from kvgov.govern.vllm import fence, groups

    for on_cpu in (True, False):
        monkeypatch.setattr(groups, "current_platform", SimpleNamespace(is_cpu=lambda c=on_cpu: c))
        with monkeypatch.context() as m:
            m.setattr(fence, "cpu_zeroer_installed", lambda: False)
            m.setattr(fence, "state_zeroer_installed", lambda: False)
            with pytest.raises(UnsupportedEngine, match="Mamba state group"):
                _hybrid(vllm)
        _hybrid(vllm)


def test_a_mamba_block_size_other_than_the_hash_block_size_is_refused(vllm: Any) -> None:
    """Under a caching coordinator, a Mamba group whose blocks are of another size (outside
    "align" mode vLLM makes them the model's length) is refused, as any group whose block
    size is not the hash block size (hits are judged in whole blocks of one size). With
    prefix caching off and no KV connector nothing is hashed, and the same groups are
    governed (``test_no_prefix_cache.py``)."""
    import dataclasses

    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    from kvgov.govern.vllm.groups import check_groups

    sched = _hybrid(vllm)
    full, mamba = _specs("full", "mamba")
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["f"], full),
            KVCacheGroupSpec(
                ["m"], dataclasses.replace(mamba, block_size=128, mamba_cache_mode="none")
            ),
        ],
    )
    with pytest.raises(UnsupportedEngine, match="blocks of 128 tokens"):
        check_groups(config, sched.kv_cache_manager.coordinator, BS)


def _mamba_runner(kinds: dict[str, Any]) -> Any:
    """A fake runner: a full-attention layer and a Mamba layer (conv and ssm state, views of
    one page per block, as ``MambaBase.bind_kv_cache`` makes them), all ones."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    full, mamba = kinds["full"], kinds["mamba"]
    pages = torch.ones(6, 3 * 4 + 2 * 4 * 4, dtype=torch.float32)
    conv = pages[:, :12].view(-1, 3, 4)
    ssm = pages[:, 12:].view(-1, 2, 4, 4)
    kv = {"f": torch.ones(6, 2, 4)}
    context = {"f": SimpleNamespace(kv_cache=kv["f"]), "m": SimpleNamespace(kv_cache=(conv, ssm))}
    groups = [KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["m"], mamba)]
    return SimpleNamespace(
        kv=kv,
        conv=conv,
        ssm=ssm,
        pages=pages,
        groups=groups,
        runner_only_attn_layers=set(),
        kv_cache_config=SimpleNamespace(kv_cache_groups=groups),
        compilation_config=SimpleNamespace(static_forward_context=context),
    )


def test_the_zeroers_clear_mamba_state_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both zeroers kvgov installs clear the given blocks of a Mamba layer's conv and ssm
    state (CPU torch tensors): the CPU runner's replacement, and the GPU runners'
    ``KVBlockZeroer`` wrapped; vLLM's own ``KVBlockZeroer``, the control, skips them.
    Other blocks keep their bytes."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.worker import cpu_model_runner
    from vllm.v1.worker import utils as worker_utils

    from kvgov.govern.vllm import fence

    full, mamba = _specs("full", "mamba")
    kinds = {"full": full, "mamba": mamba}

    def check(r: Any, *, state: bool) -> None:
        for t in (r.conv, r.ssm):
            assert bool(t[[1, 4]].any()) is not state
            assert t[[0, 2, 3, 5]].all()

    # the GPU runners' zeroer: vLLM's (the control), then kvgov's wrapper of it
    zeroer_cls = worker_utils.KVBlockZeroer
    for name in ("__init__", "zero_block_ids"):  # vLLM's own, the plugin's wrapping undone
        original = zeroer_cls.__dict__[name]
        monkeypatch.setattr(zeroer_cls, name, getattr(original, "__wrapped__", original))
    assert not fence.state_zeroer_installed()
    for wrapped in (False, True):
        if wrapped:
            assert fence.install_state_zeroer()
            assert fence.state_zeroer_installed()
        r = _mamba_runner(kinds)
        attn_groups = [  # the Mamba group only: vLLM's attention kernel needs Triton
            SimpleNamespace(kv_cache_spec=mamba, layer_names=["m"], kv_cache_group_id=1)
        ]
        zeroer = zeroer_cls(
            torch.device("cpu"),
            attn_groups_iter=iter(attn_groups),
            kernel_block_sizes=[BS, BS],
            static_forward_context=r.compilation_config.static_forward_context,
            num_blocks=6,
        )
        zeroer.zero_block_ids([1, 4])
        check(r, state=wrapped)

    # the CPU runner's zeroer: vLLM's (the control), then kvgov's replacement
    cpu_runner = cpu_model_runner.CPUModelRunner
    current = cpu_runner._zero_block_ids
    monkeypatch.setattr(cpu_runner, "_zero_block_ids", getattr(current, "__wrapped__", current))
    r = _mamba_runner(kinds)
    cpu_runner._zero_block_ids(r, [1, 4])
    check(r, state=False)
    assert not r.kv["f"][[1, 4]].any(), "vLLM's clears full attention"
    with monkeypatch.context() as m:
        m.setattr("vllm.platforms.current_platform", SimpleNamespace(is_cpu=lambda: True))
        assert fence.install_cpu_zeroer()
        r = _mamba_runner(kinds)
        cpu_runner._zero_block_ids(r, [1, 4])
    check(r, state=True)
    assert not r.kv["f"][[1, 4]].any() and r.kv["f"][[0, 2, 3, 5]].all()
    assert r.pages[[0, 2, 3, 5]].all()  # one indexed fill per tensor, the given rows only


def test_state_tensors_lists_each_tensor_once() -> None:
    """Two layers viewing the same state tensor: it is filled once; attention groups and
    layers without a state are left out."""
    from types import SimpleNamespace

    import torch

    from kvgov.govern.vllm import fence

    full, mamba = _specs("full", "mamba")
    conv, ssm = torch.ones(4, 2), torch.ones(4, 3)
    context = {
        "m1": SimpleNamespace(kv_cache=(conv, ssm)),
        "m2": SimpleNamespace(kv_cache=(conv, ssm)),
        "m3": SimpleNamespace(kv_cache=None),
        "f": SimpleNamespace(kv_cache=torch.ones(4, 2)),
    }
    groups = [
        SimpleNamespace(kv_cache_spec=mamba, layer_names=["m1", "m2", "m3"]),
        SimpleNamespace(kv_cache_spec=full, layer_names=["f"]),
    ]
    states = fence.state_tensors(groups, context)
    assert len(states) == 2 and states[0] is conv and states[1] is ssm
    fence.zero_states(states, [2])
    assert not conv[2].any() and not ssm[2].any() and conv[[0, 1, 3]].all()
