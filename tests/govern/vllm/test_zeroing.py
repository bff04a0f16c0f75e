"""Every block that leaves an owner is ordered zeroed before anyone can be scheduled onto it."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm


def _prompt(i: int, n: int = 70) -> list[int]:
    return [(i * 131 + j) % 50_000 for j in range(n)]


def test_freed_and_evicted_blocks_are_zeroed_before_reuse(vllm: Any) -> None:
    """Under eviction pressure, two tenants, a purge: no step ever writes into a block still
    holding someone else's KV, and nothing is left in a block that is neither owned nor cached."""
    sched = vllm.scheduler(num_blocks=24)
    for i in range(12):
        vllm.run(sched, vllm.request(f"r{i}", _prompt(i), tenant=("acme", "globex")[i % 2]))
        if i == 6:
            sched.kvgov_call("purge_tenant", "acme")
    vllm.run(sched)  # the idle engine's zeroing step
    worker = vllm.worker(sched)
    assert worker.violations == []
    assert worker.remnants(sched) == []
    stats = sched.kvgov_call("stats")
    assert stats["total"]["evictions"]["capacity"] > 0
    assert stats["total"]["evictions"]["purged"] > 0
    sched.kvgov.gov._check_invariants()


def test_stock_vllm_leaves_remnants(vllm: Any) -> None:
    """The control: vLLM's scheduler leaves a finished request's tail block unzeroed."""
    sched = vllm.stock(num_blocks=24)
    vllm.run(sched, vllm.request("r", _prompt(0)))
    assert vllm.worker(sched).remnants(sched) != []


def test_a_freed_tail_block_goes_out_with_the_next_step(vllm: Any) -> None:
    """A finished request's unhashed tail block is in the very next step's zero list."""
    sched = vllm.scheduler()
    req = vllm.request("r", _prompt(0))  # 70 tokens: 4 full blocks, a partial tail
    sched.add_request(req)
    vllm.step(sched)
    tail = sched.kv_cache_manager.get_block_ids("r")[0][-1]
    vllm.step(sched)  # the second token finishes it: its blocks are freed
    assert "r" not in sched.requests
    assert sched.has_requests()  # idle, but a zeroing is pending
    so, _ = vllm.step(sched)
    assert so.total_num_scheduled_tokens == 0
    assert tail in so.new_block_ids_to_zero
    assert not sched.has_requests()


def test_new_blocks_are_not_listed_for_zeroing(vllm: Any) -> None:
    """vLLM's own record of new blocks (forced on by the plugin) is off: a step's zero list
    holds only blocks that left an owner, never the ones just handed out."""
    sched = vllm.scheduler()
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    assert [m.records_new_block_ids for m in managers] == [False]
    sched.add_request(vllm.request("r", _prompt(0)))
    so, _ = vllm.step(sched)
    assert sched.kv_cache_manager.get_block_ids("r")[0]
    assert so.new_block_ids_to_zero is None


def test_zeroing_is_audited_ordered_then_done(vllm: Any) -> None:
    """A block's zeroization is audited "ordered" when it leaves its owner, "done" when the
    step that carried it to the workers came back."""
    sched = vllm.scheduler()
    vllm.run(sched, vllm.request("r", _prompt(0)))
    events = vllm.events(sched, type="zeroization")
    ordered = [e for e in events if e.details.get("state") == "ordered"]
    done = [e for e in events if e.details.get("state") == "done"]
    assert ordered and done
    assert {b for e in ordered for b in e.block_ids} == {b for e in done for b in e.block_ids}
    assert all(e.tenant == "acme" for e in ordered + done)


def test_purge_reaches_the_workers_of_an_idle_engine(vllm: Any) -> None:
    """purge_tenant evicts the tenant's cached blocks; the idle engine runs one step that carries
    them; the tenant then hits nothing while another tenant's cache is intact."""
    sched = vllm.scheduler()
    prompt = _prompt(1, 160)
    vllm.run(sched, vllm.request("a", prompt), vllm.request("g", prompt, tenant="globex"))
    report = sched.kvgov_call("purge_tenant", "acme")
    assert report["blocks_zeroized"] == 10 and report["verified"] is False
    assert sched.has_requests()
    pending = sched.kvgov_call("state")["pending_zero"]
    so, _ = vllm.step(sched)
    assert sorted(so.new_block_ids_to_zero) == sorted(pending)
    assert vllm.hit(sched, vllm.request("a2", prompt)) == 0
    assert vllm.hit(sched, vllm.request("g2", prompt, tenant="globex")) == 144
    (erasure,) = vllm.events(sched, type="erasure")
    assert erasure.tenant == "acme" and len(erasure.block_ids) == 10


def test_a_purge_detaches_blocks_a_running_request_holds(vllm: Any) -> None:
    """A running request's cached blocks become unreachable at once and are zeroed at its end;
    it caches nothing more."""
    sched = vllm.scheduler()
    prompt = _prompt(2, 160)
    req = vllm.request("a", prompt, max_tokens=40)
    sched.add_request(req)
    vllm.step(sched)
    report = sched.kvgov_call("purge_tenant", "acme")
    assert report["detached_blocks"] == 10 and report["in_flight_sequences"] == ["a"]
    # verified rests on ownership: every block the running request holds is still held
    assert report["held_blocks"] >= 10 and report["verified"] is False
    run = vllm.run(sched)
    assert "a" in run.finals
    assert vllm.worker(sched).remnants(sched) == []
    assert not any(b.block_hash is not None for b in sched.kv_cache_manager.block_pool.blocks)


def test_invalidate_drops_a_model_revision(vllm: Any) -> None:
    """invalidate(model_revision=...) evicts every block keyed under it, zeroed at the next step."""
    sched = vllm.scheduler()
    prompt = _prompt(3, 160)
    vllm.run(sched, vllm.request("a", prompt), vllm.request("g", prompt, tenant="globex"))
    report = sched.kvgov_call("invalidate", {"model_revision": "r1"})
    assert report["blocks_zeroized"] == 20
    vllm.run(sched)
    assert vllm.worker(sched).remnants(sched) == []
    assert vllm.hit(sched, vllm.request("a2", prompt)) == 0


def test_retention_is_enforced_by_the_step_itself(vllm: Any, clock: Any) -> None:
    """A cached block past its retention is evicted by the next schedule(), zeroed in that step."""
    retention = {"kvgov": {"config": {"retention_seconds": {"internal": 30}}}}
    sched = vllm.scheduler(kvgov={"policy_data": retention})
    prompt = _prompt(4, 160)
    vllm.run(sched, vllm.request("a", prompt))
    clock.advance(29)
    assert vllm.hit(sched, vllm.request("a2", prompt)) == 144  # hit: its deadline restarts
    clock.advance(31)
    assert sched.has_requests() is False
    so, _ = vllm.step(sched)  # what an engine does once a request arrives
    assert len(so.new_block_ids_to_zero) >= 10
    (sweep,) = vllm.events(sched, type="retention_sweep")
    assert len(sweep.block_ids) >= 10
    assert vllm.hit(sched, vllm.request("a3", prompt)) == 0


def test_reset_prefix_cache_orders_every_cached_block_zeroed(vllm: Any) -> None:
    """vLLM's reset (after a weight update) drops every hash: those blocks left their owner."""
    sched = vllm.scheduler()
    vllm.run(sched, vllm.request("a", _prompt(5, 160)))
    cached = sched.kvgov_call("state")["cached"]
    assert sched.reset_prefix_cache()
    so, _ = vllm.step(sched)
    assert sorted(so.new_block_ids_to_zero) == sorted(cached)
    assert sum(e.details["reason"] == "reset" for e in vllm.events(sched, type="eviction")) == 1
