"""GovernedKVConnector: two governed schedulers sharing one real Redis, with a worker side each.

Each test uses its own key prefix in Redis (127.0.0.1:6379) and drives the
connector's scheduler side through vLLM's scheduler and its worker side on real
tensors, as vLLM's runner would (load before the forward pass, save after it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

PROMPT = list(range(700, 860))  # 10 full blocks of 16
REDIS = "redis://127.0.0.1:6379/0"
NUM_BLOCKS = 200
#: the offload policy allows the connector's tier ("fleet") for "internal" KV
ALLOW_TIER = {"kvgov": {"config": {"offload_tiers": {"internal": ["host", "fleet"]}}}}


@pytest.fixture()
def prefix(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import redis

    monkeypatch.setenv("KVGOV_KEK", "ab" * 32)
    p = f"kvgov-test:{uuid.uuid4().hex}"
    yield p
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=f"{p}:*"):
        client.delete(key)
    client.close()


class Server:
    """A governed scheduler with the connector, and its worker side on real KV tensors."""

    def __init__(
        self, vllm: Any, settings: dict[str, Any], policy_data: dict[str, Any] | None = None
    ) -> None:
        import torch
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        from kvgov.govern.vllm.kv_connector import GovernedKVConnector

        self.h = vllm
        transfer = KVTransferConfig(
            kv_connector="GovernedKVConnector",
            kv_connector_module_path="kvgov.govern.vllm.kv_connector",
            kv_role="kv_both",
            kv_connector_extra_config={"kvgov": settings},
        )
        self.sched = vllm.scheduler(
            kv_transfer_config=transfer,
            num_blocks=NUM_BLOCKS,
            kvgov={"policy_data": ALLOW_TIER if policy_data is None else policy_data},
        )
        self.conn: GovernedKVConnector = self.sched.connector
        self.worker = GovernedKVConnector(
            self.sched.vllm_config, KVConnectorRole.WORKER, self.sched.kv_cache_config
        )
        self.kv = torch.zeros(2, NUM_BLOCKS, 16, 4)
        self.worker.register_kv_caches({"layer0": self.kv})
        self.invalid: set[int] = set()

    def step(self) -> Any:
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        so = self.sched.schedule()
        for b in so.new_block_ids_to_zero or ():
            self.kv[:, b] = 0
        self.worker.bind_connector_metadata(so.kv_connector_metadata)
        self.worker.start_load_kv(None)
        for new in so.scheduled_new_reqs:  # the forward pass: KV of each computed block
            first = new.num_computed_tokens // 16
            for i, b in enumerate(new.block_ids[0][first:], start=first):
                self.kv[:, b] = float(i + 1)
        self.worker.wait_for_save()
        errors = self.worker.get_block_ids_with_load_errors()
        self.invalid |= errors
        out = KVConnectorOutput(
            kv_connector_worker_meta=self.worker.build_connector_worker_meta(),
            invalid_block_ids=errors,
        )
        self.worker.clear_connector_metadata()
        req_ids = list(so.num_scheduled_tokens)
        self.sched.update_from_output(
            so,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[[1000] for _ in req_ids],
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=[],
                kv_connector_output=out,
            ),
        )
        return so

    def run(
        self, req_id: str, tenant: str, xargs: dict[str, Any] | None = None
    ) -> tuple[int, list[int]]:
        """Serve one request; returns its tokens first reused and its first block table."""
        self.sched.add_request(self.h.request(req_id, PROMPT, tenant=tenant, xargs=xargs))
        hit, table = -1, []
        for _ in range(50):
            if not self.sched.has_requests():
                break
            so = self.step()
            for new in so.scheduled_new_reqs:
                if new.req_id == req_id and hit < 0:
                    hit, table = new.num_computed_tokens, list(new.block_ids[0])
        return hit, table

    def events(self, sequence_id: str | None = None) -> list[Any]:
        """The connector's events (both servers audit to one database, as a fleet does)."""
        return [
            e
            for e in self.h.events(self.sched)
            if "connector" in e.details and sequence_id in (None, e.sequence_id)
        ]


def _settings(prefix: str, vllm: Any, **more: Any) -> dict[str, Any]:
    return {
        "redis_url": REDIS,
        "key_store_url": vllm.audit_url,
        "prefix": prefix,
        "key_recheck_s": 0.001,
        **more,
    }


def _servers(vllm: Any, prefix: str, **more: Any) -> tuple[Server, Server]:
    return Server(vllm, _settings(prefix, vllm, **more)), Server(
        vllm, _settings(prefix, vllm, **more)
    )


def test_a_tenants_blocks_saved_on_one_server_load_on_another_for_that_tenant_only(
    vllm: Any, prefix: str
) -> None:
    one, two = _servers(vllm, prefix)
    one.run("a1", "A")
    saves = [e for e in one.events() if e.type == "offload"]
    assert saves and all(e.tenant == "A" for e in saves)
    assert sum(len(e.block_ids) for e in saves) >= 9

    assert two.run("b1", "B")[0] == 0  # before A's load: no restore figure yet, it is looked up
    misses = [e for e in two.events(sequence_id="b1") if e.details.get("outcome") == "miss"]
    assert [(e.tenant, e.details["reason"]) for e in misses] == [("B", "absent")]

    hit, table = two.run("a2", "A")
    assert hit >= 9 * 16
    for i, b in enumerate(table[: hit // 16]):  # the KV server 1 computed, verified and decrypted
        assert bool((two.kv[:, b] == float(i + 1)).all())
    assert not two.invalid
    restores = [e for e in two.events() if e.type == "offload_restore" and e.reused_tokens]
    assert [(e.tenant, e.requester_tenant) for e in restores] == [("A", "A")]


def test_a_scope_the_offload_policy_keeps_off_the_tier_is_neither_saved_nor_loaded(
    vllm: Any, prefix: str
) -> None:
    """The default policy lets "internal" KV go to "host" only: the connector's tier
    ("fleet") gets nothing of it, and its lookups are audited as denied misses."""
    import redis

    default = {"kvgov": {"config": {"offload_tiers": {"internal": ["host"]}}}}
    one = Server(vllm, _settings(prefix, vllm), policy_data=default)
    one.run("a1", "A")
    assert not [e for e in one.events() if e.type == "offload"]
    assert not list(redis.Redis.from_url(REDIS).scan_iter(match=f"{prefix}:*:o:*"))
    assert one.run("a2", "A")[0] >= 9 * 16  # the device cache still serves it
    one.sched.reset_prefix_cache()
    assert one.run("a3", "A")[0] == 0
    misses = [e for e in one.events(sequence_id="a3") if e.details.get("outcome") == "miss"]
    assert [e.details["reason"] for e in misses] == ["offload_denied"]


def test_a_request_with_a_public_prefix_is_neither_saved_nor_loaded(vllm: Any, prefix: str) -> None:
    """Its blocks are of two scopes (the prefix's public one, the rest's) and the tier
    names one a request: fail closed, its lookups audited as ``public_prefix`` misses,
    while the same tenant's requests without one use the tier."""
    import redis

    one = Server(vllm, _settings(prefix, vllm))
    public = {"kvgov_public_prefix_tokens": 64}
    one.run("a1", "A", public)
    assert not [e for e in one.events() if e.type == "offload"]
    assert not list(redis.Redis.from_url(REDIS).scan_iter(match=f"{prefix}:*:o:*"))
    one.sched.reset_prefix_cache()
    assert one.run("a2", "A", public)[0] == 0
    misses = [e for e in one.events(sequence_id="a2") if e.details.get("outcome") == "miss"]
    assert [e.details["reason"] for e in misses] == ["public_prefix"]
    one.run("a3", "A")  # no prefix: saved as before
    assert [e for e in one.events(sequence_id="a3") if e.type == "offload"]


def test_redis_keys_and_objects_name_no_tenant(vllm: Any, prefix: str) -> None:
    import redis

    one, _two = _servers(vllm, prefix)
    tenant = "acme-private-bank"
    one.run("a1", tenant)
    client = redis.Redis.from_url(REDIS)
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    assert any(b":o:" in k for k in keys)
    secrets = (tenant.encode(), tenant.encode().hex().encode())
    for key in keys:
        assert not any(s in key for s in secrets)
        value = client.dump(key) or b""
        assert not any(s in value for s in secrets)


def test_a_purge_on_one_server_shreds_the_tenants_objects_for_the_fleet(
    vllm: Any, prefix: str
) -> None:
    """Server 2 cannot load A's objects once server 1 purged A, even from a copy of Redis."""
    import redis

    from kvgov.offload import MissReason

    one, two = _servers(vllm, prefix)
    one.run("a1", "A")
    client = redis.Redis.from_url(REDIS)
    backup = {k: client.get(k) for k in client.scan_iter(match=f"{prefix}:*:o:*")}
    assert len(backup) >= 9

    report = one.sched.kvgov_call("purge_tenant", "A")
    assert report["destroyed_key_ids"]
    assert not list(client.scan_iter(match=f"{prefix}:*:o:*"))  # deleted
    assert two.run("a2", "A")[0] == 0  # nothing left to find

    for key, blob in backup.items():  # a backup of Redis restored: nothing in it decrypts
        client.set(key, blob)
    names = two.conn.kvgov_names()
    for key in backup:
        block_key = bytes.fromhex(key.rsplit(b":", 1)[1].decode())
        ((digest, (root, _scope)),) = two.conn.kvgov_known.items()  # A's one scope
        got = two.conn.fleet.load(block_key, names.scope(root, digest), names.tenant("A"))
        assert not got.hit
        assert {r.reason for r in got.refusals} == {MissReason.KEY_DESTROYED}


def test_a_tampered_object_is_refused_audited_and_recomputed(vllm: Any, prefix: str) -> None:
    import redis

    one, two = _servers(vllm, prefix)
    one.run("a1", "A")
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=f"{prefix}:*:o:*"):
        blob = bytearray(client.get(key) or b"")
        blob[-20] ^= 0x01  # one bit of ciphertext
        client.set(key, bytes(blob))

    hit, _table = two.run("a2", "A")
    assert hit > 0
    assert two.invalid  # the refused block (and those after it) recomputed
    refused = [e for e in two.events() if e.type == "offload_refused"]
    assert refused and {e.details["reason"] for e in refused} == {"tampered"}
    assert refused[0].tenant == "A"


def test_redis_down_is_a_miss_not_a_failure(vllm: Any, prefix: str) -> None:
    down = _settings(prefix, vllm, redis_url="redis://127.0.0.1:1/0", timeout_s=0.05)
    server = Server(vllm, down)
    assert server.run("a1", "A")[0] == 0
    assert server.run("a2", "A")[0] >= 9 * 16  # the device cache still serves it
    misses = [e for e in server.events(sequence_id="a1") if e.details.get("outcome") == "miss"]
    assert [e.details["reason"] for e in misses] == ["unavailable"]
    failed = [e for e in server.events() if e.type == "offload"]
    assert failed and all(e.details["outcome"] == "save_unavailable" for e in failed)


def test_a_load_is_skipped_when_recomputing_is_cheaper(vllm: Any, prefix: str) -> None:
    one, two = _servers(vllm, prefix)
    one.run("a1", "A")
    two.conn.cost.restore_bytes_per_s = 1.0  # one byte a second: never worth it
    two.conn.cost.prefill_tokens_per_s = 1e9
    two.conn.cost.block_bytes = 1024
    assert two.run("a2", "A")[0] == 0
    misses = [e for e in two.events(sequence_id="a2") if e.details.get("outcome") == "miss"]
    assert [e.details["reason"] for e in misses] == ["recompute_cheaper"]
    assert misses[0].details["restore_bytes_per_s"] == 1.0  # the figures behind it
    metrics = two.conn.kvgov_metrics()
    assert metrics["skipped_loads"] >= 1 and metrics["offload_pays"] is False


def test_a_stale_cost_figure_lets_loads_and_saves_measure_again(vllm: Any, prefix: str) -> None:
    """One slow restore sample must not switch the tier off for good: while the figure is
    fresh, server 2 skips the load and its saves; once it is older than cost_max_age_s,
    both go ahead, and the load's measurement replaces the stale figure."""
    from kvgov.govern.fleet_kv import CostModel
    from tests.support.clock import FakeClock

    one, two = _servers(vllm, prefix, cost_max_age_s=60.0)
    one.run("a1", "A")  # server 1 saves A's blocks
    assert two.run("a0", "A")[0] >= 9 * 16  # server 2's first load (not a sample)
    two.sched.reset_prefix_cache()
    clock = FakeClock()
    cost = two.conn.cost = CostModel(max_age_s=60.0, clock=clock)
    cost.restored(nbytes=10 * 512, seconds=1000.0, blocks=10)  # 5 bytes/s: one slow sample
    cost.prefilled(tokens=16, seconds=1e-6)

    assert two.run("a2", "A")[0] == 0  # the fresh figure declines the load...
    misses = [e for e in two.events(sequence_id="a2") if e.details.get("outcome") == "miss"]
    assert [e.details["reason"] for e in misses] == ["recompute_cheaper"]
    assert not [e for e in two.events(sequence_id="a2") if e.type == "offload"]
    assert cost.skipped_saves >= 1  # ...and server 2's own saves

    samples: list[tuple[int, float, int]] = []
    restored = cost.restored

    def spy(nbytes: int, seconds: float, blocks: int) -> None:
        samples.append((nbytes, seconds, blocks))
        restored(nbytes, seconds, blocks)

    cost.restored = spy  # type: ignore[method-assign]
    clock.advance(61.0)  # the restore figure is stale: it no longer decides
    two.sched.reset_prefix_cache()
    hit, table = two.run("a3", "A")
    assert hit >= 9 * 16  # loaded from the tier
    for i, b in enumerate(table[: hit // 16]):
        assert bool((two.kv[:, b] == float(i + 1)).all())
    saves = [e for e in two.events(sequence_id="a3") if e.type == "offload"]
    assert saves and all(e.details["outcome"] == "save_stored" for e in saves)
    ((nbytes, seconds, _blocks),) = samples  # the load measured the tier again
    assert cost.restore_bytes_per_s == nbytes / seconds  # replaced, not averaged in
    assert cost.metrics(16)["restore_age_s"] == 0.0
    worker = two.worker.kvgov_metrics()  # the worker keeps the figures it reported
    assert worker["block_bytes"] == nbytes // _blocks


def test_a_workers_first_load_is_not_a_cost_sample(vllm: Any, prefix: str) -> None:
    """A worker's first load also opens its Redis connection and reads its first data key
    (the warm-up round of bench_fleet.py: 128-468 MB/s where the next loads ran at
    585-715): the figure starts at the second load."""
    one, two = _servers(vllm, prefix)
    one.run("a1", "A")
    assert two.run("a2", "A")[0] >= 9 * 16
    assert two.conn.cost.restore_samples == 0 and two.conn.cost.restore_bytes_per_s is None
    assert two.worker.cost.restore_samples == 0
    two.sched.reset_prefix_cache()
    assert two.run("a3", "A")[0] >= 9 * 16
    assert two.conn.cost.restore_samples == 1 and two.worker.cost.restore_samples == 1
    assert two.conn.cost.restore_bytes_per_s == two.worker.cost.restore_bytes_per_s


def test_a_host_blocks_kv_is_copied_with_memcpy_not_torchs_parallel_copy(
    vllm: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load and a save copy each layer's block between the tier's buffer and the KV
    tensor. torch's ``copy_`` splits a copy of that size across its OpenMP threads, which
    in vLLM's CPU worker waited for a core the engine's other processes held (2-57 ms a
    2.25 MiB block instead of 0.2 ms): a contiguous host block is copied as bytes on the
    calling thread instead; a strided view or another device still takes ``copy_``."""
    import torch

    one = Server(vllm, _settings(prefix, vllm))
    worker = one.worker
    kv = {
        "a": torch.zeros(NUM_BLOCKS, 2, 16, 4),  # block-major: a block is contiguous
        "b": torch.zeros(NUM_BLOCKS, 3, 8, dtype=torch.bfloat16),
    }
    worker.register_kv_caches(kv)
    kv["a"][5] = torch.randn(2, 16, 4)
    kv["b"][5] = torch.randn(3, 8).to(torch.bfloat16)
    copies: list[Any] = []
    copy = torch.Tensor.copy_

    def spy(self: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
        copies.append(self.shape)
        return copy(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    scratch = bytearray(worker.kvgov_block_nbytes())
    staged = worker.kvgov_stage(5, scratch)
    worker.kvgov_fill(7, staged)
    staged.release()
    assert copies == []
    for t in kv.values():
        assert torch.equal(t[7], t[5]) and bool(t[5].any())

    strided = {"a": torch.zeros(2, NUM_BLOCKS, 16, 4)}  # a block is two strided halves
    worker.register_kv_caches(strided)
    strided["a"][:, 5] = torch.randn(2, 16, 4)
    worker.kvgov_fill(7, worker.kvgov_stage(5, bytearray(worker.kvgov_block_nbytes())))
    assert len(copies) == 2 and torch.equal(strided["a"][:, 7], strided["a"][:, 5])


def test_a_save_leaves_no_plaintext_copy_of_the_kv_behind(
    vllm: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker stages each block's KV in one buffer for sealing and zeroes it after the
    step's saves: the plaintext handed to the tier's sealer is a view of that buffer,
    which reads zero once the step is done (an immutable copy could never be cleared),
    and what was sealed is the block's KV (server 2 loads it back)."""
    one, two = _servers(vllm, prefix)
    seen: list[tuple[Any, bytes]] = []
    save = one.worker.fleet.save

    def spy(key: bytes, scope: bytes, tenant: str, deadline: float, payload: Any) -> Any:
        assert isinstance(payload, memoryview), type(payload)
        seen.append((payload.obj, bytes(payload)))
        return save(key, scope, tenant, deadline, payload)

    monkeypatch.setattr(one.worker.fleet, "save", spy)
    one.run("a1", "A")
    assert len(seen) >= 9
    assert any(any(plain) for _buf, plain in seen), "the staged KV was the block's"
    for buf, _plain in seen:
        assert isinstance(buf, bytearray) and not any(buf), "the staging buffer reads zero"
    hit, table = two.run("a2", "A")
    assert hit >= 9 * 16
    for i, b in enumerate(table[: hit // 16]):
        assert bool((two.kv[:, b] == float(i + 1)).all())
