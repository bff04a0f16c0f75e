"""Prefix caching off: vLLM's ``KVCacheCoordinatorNoPrefixCache``, governed.

Without prefix caching vLLM hashes, looks up, caches and shares nothing; a block is a
request's from allocation to release. What kvgov still owes is the rest of the contract:
every block has its request's owner while the request holds it, and is ordered zeroed
(and audited) when it leaves, at request end, preemption, abort, or when a purge of the
running tenant lets it go. Three layouts vLLM runs only this way on its CPU build
(``benchmarks/vllm-cpu.md``):

* plain attention (one full-attention group);
* a Mamba hybrid in ``mamba_cache_mode="none"``: the state group's blocks span the
  model's length (one state block per request) while the attention group's are the
  engine's block size; the scheduler block size is their least common multiple, and no
  hash block size applies (nothing is hashed), so kvgov governs it as it is;
* an encoder-decoder model (Whisper): a decoder self-attention group and a
  cross-attention group (``CrossAttentionManager``, the encoder's 1,500 positions per
  request), which vLLM never caches.

The fake worker (``harness.FakeWorker``) checks that no block is written while it still
holds another request's bytes, and ``remnants`` that no block is left holding a
request's bytes unowned: stock vLLM is the control that shows the check fails without
kvgov.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgov.exceptions import UnsupportedEngine
from tests.govern.vllm.kv_specs import kv_specs

pytestmark = pytest.mark.vllm

BS = 16
MODEL_LEN = 512  # the Mamba "none" group's block size: vLLM makes it the model's length


def _prompt(i: int, n: int = 90) -> list[int]:
    return [(i * 97 + j) % 1000 for j in range(n)]


def _specs(*kinds: str) -> list[Any]:
    return kv_specs(*kinds, mamba_block_size=MODEL_LEN, mamba_cache_mode="none")


def _plain(vllm: Any, cls: Any = None, **kwargs: Any) -> Any:
    more = {"cls": cls} if cls is not None else {}
    return vllm.scheduler(caching=False, **more, **kwargs)


def _mamba(vllm: Any, cls: Any = None, **kwargs: Any) -> Any:
    """A full-attention + Mamba hybrid as vLLM's engine builds it without prefix caching."""
    more = {"cls": cls} if cls is not None else {}
    return vllm.scheduler(
        specs=_specs("full", "mamba"),
        caching=False,
        mamba_cache_mode="none",
        max_model_len=MODEL_LEN,
        block_size=MODEL_LEN,  # lcm(16, 512): what vLLM's engine gives the scheduler
        **more,
        **kwargs,
    )


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Whisper: config, feature extractor and tokenizer (its processor needs them)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import vllm_cpu_tiny_model

    out = tmp_path_factory.mktemp("tiny-whisper")
    vllm_cpu_tiny_model.write_whisper(str(out))
    return out


def _cross(vllm: Any, whisper_dir: Path, cls: Any = None, **kwargs: Any) -> Any:
    more = {"cls": cls} if cls is not None else {}
    return vllm.scheduler(
        specs=_specs("full", "cross"),
        caching=False,
        model_dir=whisper_dir,
        tokenizer=whisper_dir,
        max_model_len=448,
        **more,
        **kwargs,
    )


ENCODER_TOKENS = 1500


def _audio_request(vllm: Any, req_id: str, tenant: str, *, max_tokens: int = 6) -> Any:
    """A Whisper request: a 4-token decoder prompt, the encoder's 1,500 audio positions."""
    return vllm.request(
        req_id,
        [1, 2, 3, 4],
        tenant=tenant,
        mm=[(f"audio-{req_id}", 0, ENCODER_TOKENS)],
        modality="audio",
        max_tokens=max_tokens,
    )


def _group_ids(sched: Any, req_id: str) -> list[list[int]]:
    return [list(ids) for ids in sched.kv_cache_manager.get_block_ids(req_id)]


def _check_clean(vllm: Any, sched: Any) -> None:
    worker = vllm.worker(sched)
    assert worker.violations == []
    assert worker.remnants(sched) == []
    pool = sched.kv_cache_manager.block_pool
    assert all(b.block_hash is None for b in pool.blocks), "nothing is cached"
    owners = sched.kvgov.gov.ledger.owners.table
    assert all(o is None for o in owners), "no block keeps an owner once released"
    sched.kvgov.gov._check_invariants()


def _held(vllm: Any, sched: Any, req_ids: list[str], *, until_done: bool = True) -> Any:
    """Step until every request is gone, checking each step that every block a request
    holds has its tenant as owner and that no request starts on a hit; the blocks each
    held, and the zero lists."""
    held: dict[str, set[int]] = {r: set() for r in req_ids}
    zeroed: list[int] = []
    owners = sched.kvgov.gov.ledger.owners.table
    while sched.has_requests():
        so, _ = vllm.step(sched)
        assert all(new.num_computed_tokens == 0 for new in so.scheduled_new_reqs)
        zeroed.extend(so.new_block_ids_to_zero or ())
        for r in req_ids:
            if r not in sched.requests:
                continue
            tenant = sched.requests[r].sampling_params.extra_args["kvgov_tenant"]
            for ids in _group_ids(sched, r):
                for b in ids:
                    if b == 0:
                        continue
                    held[r].add(b)
                    assert owners[b] is not None and owners[b].tenant == tenant, (r, b)
        if not until_done:
            break
    return held, zeroed


# ---------------------------------------------------------------------- the configurations


@pytest.mark.parametrize("layout", ["plain", "mamba", "cross"])
def test_prefix_caching_off_starts_governed_with_no_prefix_coordinator(
    vllm: Any, layout: str, request: pytest.FixtureRequest
) -> None:
    """Each layout starts governed over vLLM's no-prefix-cache coordinator; the Mamba one
    has groups of two block sizes (16-token attention blocks, 512-token state blocks)."""
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinatorNoPrefixCache

    if layout == "plain":
        sched = _plain(vllm)
    elif layout == "mamba":
        sched = _mamba(vllm)
        sizes = [g.kv_cache_spec.block_size for g in sched.kv_cache_config.kv_cache_groups]
        assert sizes == [BS, MODEL_LEN] and sched.hash_block_size == MODEL_LEN
    else:
        sched = _cross(vllm, request.getfixturevalue("whisper_dir"))
        assert sched.is_encoder_decoder
    assert type(sched.kv_cache_manager.coordinator) is KVCacheCoordinatorNoPrefixCache
    assert sched.kvgov is not None


# ---------------------------------------------------------------------- plain attention


def test_plain_blocks_are_owned_then_zeroed_and_audited(vllm: Any) -> None:
    """Two tenants, the same prompt: no hit (nothing is cached), every held block owned by
    its request's tenant, every block zeroed when its request ends; the trail has each
    admission (no reuse) and the ordered and done zeroizations naming both tenants."""
    sched = _plain(vllm)
    a = vllm.request("a", _prompt(1, 100), tenant="acme", max_tokens=20)
    g = vllm.request("g", _prompt(1, 100), tenant="globex", max_tokens=20)
    sched.add_request(a)
    sched.add_request(g)
    held, zeroed = _held(vllm, sched, ["a", "g"])
    assert held["a"] and held["g"] and set(zeroed) >= held["a"] | held["g"]
    assert vllm.hit(sched, vllm.request("a2", _prompt(1, 100), tenant="acme")) == 0
    _check_clean(vllm, sched)
    admissions = vllm.events(sched, type="admission")
    assert {e.tenant for e in admissions} == {"acme", "globex"}
    assert not vllm.events(sched, type="reuse")
    assert not vllm.events(sched, type="cross_tenant_reuse")
    zero = vllm.events(sched, type="zeroization")
    for state in ("ordered", "done"):
        assert {e.tenant for e in zero if e.details.get("state") == state} >= {"acme", "globex"}


def test_plain_preemption_zeroes_the_preempted_blocks(vllm: Any) -> None:
    sched = _plain(vllm, num_blocks=14)
    a = vllm.request("a", _prompt(2, 80), tenant="acme", max_tokens=80)
    b = vllm.request("b", _prompt(3, 80), tenant="globex", max_tokens=80)
    vllm.run(sched, a, b, max_steps=400)
    assert a.num_preemptions + b.num_preemptions > 0
    _check_clean(vllm, sched)


def test_plain_abort_zeroes_the_aborted_requests_blocks(vllm: Any) -> None:
    from vllm.v1.request import RequestStatus

    sched = _plain(vllm)
    sched.add_request(vllm.request("a", _prompt(4), tenant="acme", max_tokens=50))
    vllm.step(sched)
    vllm.step(sched)
    held = {b for ids in _group_ids(sched, "a") for b in ids}
    assert held
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    so, _ = vllm.step(sched)  # the idle engine's step carries the zeroing
    assert held <= set(so.new_block_ids_to_zero or ())
    vllm.run(sched)
    _check_clean(vllm, sched)


def test_plain_purge_of_a_running_tenant(vllm: Any) -> None:
    """``purge_tenant`` while the tenant's request runs: nothing is cached to evict, its
    held blocks are counted, stay its request's until it ends, then are zeroed; the
    other tenant is untouched; the erasure is audited."""
    sched = _plain(vllm)
    sched.add_request(vllm.request("a", _prompt(5), tenant="acme", max_tokens=30))
    sched.add_request(vllm.request("g", _prompt(6), tenant="globex", max_tokens=30))
    vllm.step(sched)
    vllm.step(sched)
    acme = {b for ids in _group_ids(sched, "a") for b in ids}
    report = sched.kvgov_call("purge_tenant", "acme")
    assert report["held_blocks"] == len(acme), report
    owners = sched.kvgov.gov.ledger.owners.table
    assert all(owners[b].tenant == "acme" for b in acme), "still its running request's"
    _, zeroed = _held(vllm, sched, ["a", "g"])
    assert acme <= set(zeroed)
    _check_clean(vllm, sched)
    assert [e.tenant for e in vllm.events(sched, type="erasure")] == ["acme"]


def test_plain_stock_control_leaves_kv_behind(vllm: Any) -> None:
    """The control: stock vLLM without prefix caching leaves finished requests' KV in their
    freed blocks (the fake worker's remnants), which the governed runs above do not."""
    sched = vllm.stock(caching=False)
    vllm.run(sched, vllm.request("a", _prompt(7), tenant="acme"))
    assert vllm.worker(sched).remnants(sched)


# ---------------------------------------------------------------------- Mamba "none" mode


def test_mamba_none_mode_state_block_is_owned_then_zeroed(vllm: Any) -> None:
    """Each request holds one state block (it spans the model's length) and its attention
    blocks, all owned by its tenant while it runs; every one is zeroed when it ends."""
    sched = _mamba(vllm)
    sched.add_request(vllm.request("a", _prompt(8, 100), tenant="acme", max_tokens=40))
    sched.add_request(vllm.request("g", _prompt(9, 100), tenant="globex", max_tokens=40))
    vllm.step(sched)
    for r in ("a", "g"):
        full, state = _group_ids(sched, r)
        assert len(state) == 1 and state[0] != 0, state
        assert len(full) == -(-101 // BS)
    held, zeroed = _held(vllm, sched, ["a", "g"])
    assert held["a"] | held["g"] <= set(zeroed)
    _check_clean(vllm, sched)
    zero = vllm.events(sched, type="zeroization")
    assert {e.tenant for e in zero if e.details.get("state") == "done"} >= {"acme", "globex"}


def test_mamba_none_mode_preemption_and_abort(vllm: Any) -> None:
    """A pool too small for both requests' decode: vLLM preempts one, freeing its state and
    attention blocks; an aborted request's state block is zeroed by the next step."""
    from vllm.v1.request import RequestStatus

    sched = _mamba(vllm, num_blocks=16)
    a = vllm.request("a", _prompt(10, 80), tenant="acme", max_tokens=80)
    b = vllm.request("b", _prompt(11, 80), tenant="globex", max_tokens=80)
    vllm.run(sched, a, b, max_steps=400)
    assert a.num_preemptions + b.num_preemptions > 0
    _check_clean(vllm, sched)
    sched.add_request(vllm.request("c", _prompt(12), tenant="acme", max_tokens=50))
    vllm.step(sched)
    (state,) = _group_ids(sched, "c")[1]
    sched.finish_requests("c", RequestStatus.FINISHED_ABORTED)
    so, _ = vllm.step(sched)
    assert state in (so.new_block_ids_to_zero or ())
    _check_clean(vllm, sched)


def test_mamba_none_mode_purge_of_a_running_tenant(vllm: Any) -> None:
    sched = _mamba(vllm)
    sched.add_request(vllm.request("a", _prompt(13), tenant="acme", max_tokens=30))
    vllm.step(sched)
    held = {b for ids in _group_ids(sched, "a") for b in ids if b != 0}
    report = sched.kvgov_call("purge_tenant", "acme")
    assert report["held_blocks"] == len(held), report
    _, zeroed = _held(vllm, sched, ["a"])
    assert held <= set(zeroed)
    _check_clean(vllm, sched)


def test_mamba_none_mode_stock_control_leaves_state_behind(vllm: Any) -> None:
    """Stock vLLM zeroes a Mamba model's blocks when it hands them out (its own
    ``needs_kv_cache_zeroing``), not when they are freed: a finished request's state and
    KV stay in the worker until the block's next owner."""
    sched = _mamba(vllm, cls=_stock_class())
    vllm.run(sched, vllm.request("a", _prompt(14), tenant="acme"))
    assert vllm.worker(sched).remnants(sched)


def _stock_class() -> Any:
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


# ---------------------------------------------------------------------- cross attention


def test_cross_attention_blocks_are_owned_then_zeroed(vllm: Any, whisper_dir: Path) -> None:
    """Whisper-shaped requests of two tenants: each holds its decoder blocks and the
    cross-attention blocks of the encoder's 1,500 positions, owned by its tenant while it
    runs, all zeroed when it ends; an abort and a purge of a running tenant likewise."""
    from vllm.v1.request import RequestStatus

    sched = _cross(vllm, whisper_dir)
    sched.add_request(_audio_request(vllm, "a", "acme"))
    sched.add_request(_audio_request(vllm, "g", "globex"))
    vllm.step(sched)
    for r in ("a", "g"):
        _, cross = _group_ids(sched, r)
        assert len(cross) == -(-ENCODER_TOKENS // BS), cross
    held, zeroed = _held(vllm, sched, ["a", "g"])
    assert held["a"] | held["g"] <= set(zeroed)
    _check_clean(vllm, sched)

    sched.add_request(_audio_request(vllm, "x", "acme", max_tokens=40))
    vllm.step(sched)
    aborted = {b for ids in _group_ids(sched, "x") for b in ids}
    sched.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    so, _ = vllm.step(sched)
    assert aborted <= set(so.new_block_ids_to_zero or ())

    sched.add_request(_audio_request(vllm, "p", "initech", max_tokens=20))
    vllm.step(sched)
    purged = {b for ids in _group_ids(sched, "p") for b in ids}
    assert sched.kvgov_call("purge_tenant", "initech")["held_blocks"] == len(purged)
    _, zeroed = _held(vllm, sched, ["p"])
    assert purged <= set(zeroed)
    _check_clean(vllm, sched)


def test_cross_attention_stock_control_leaves_kv_behind(vllm: Any, whisper_dir: Path) -> None:
    sched = _cross(vllm, whisper_dir, cls=_stock_class())
    vllm.run(sched, _audio_request(vllm, "a", "acme"))
    assert vllm.worker(sched).remnants(sched)


# ---------------------------------------------------------------------- still refused


def test_mixed_block_sizes_are_refused_where_requests_are_hashed(vllm: Any) -> None:
    """The relaxed rule holds only where nothing is hashed: the same Mamba "none" groups
    under a caching coordinator, or with a KV connector (vLLM hashes every request for
    it, prefix caching off too), are refused with the reason."""
    import dataclasses

    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    from kvgov.govern.vllm.groups import check_groups

    full, mamba = _specs("full", "mamba")
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["m"], mamba)],
    )
    none = _mamba(vllm).kv_cache_manager.coordinator
    check_groups(config, none, MODEL_LEN)  # prefix caching off, no connector: governed
    with pytest.raises(UnsupportedEngine, match="with a KV connector"):
        check_groups(config, none, MODEL_LEN, connector=True)
    caching = vllm.scheduler().kv_cache_manager.coordinator
    with pytest.raises(UnsupportedEngine, match=f"blocks of {MODEL_LEN} tokens"):
        check_groups(config, caching, BS)
    align = dataclasses.replace(mamba, block_size=BS, mamba_cache_mode="align")
    config.kv_cache_groups[1] = KVCacheGroupSpec(["m"], align)
    check_groups(config, caching, BS)
