"""KV connectors under the governed scheduler: governed by kind, or refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgov.exceptions import BindingConfigError, UnsupportedEngine

pytestmark = pytest.mark.vllm

PROMPT = list(range(500, 660))  # 10 full blocks of 16
MODULE = "tests.govern.vllm.fake_connectors"
BLOCK_STORE = MODULE + ".BlockHashStore"
SALT = MODULE + ".SaltRecorder"


def _transfer(name: str, module: str | None = MODULE) -> Any:
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector=name, kv_role="kv_both", kv_connector_module_path=module)


@pytest.fixture(autouse=True)
def _empty_stores() -> Iterator[None]:
    from tests.govern.vllm import fake_connectors

    fake_connectors.BlockHashStore.saved.clear()
    fake_connectors.SaltRecorder.seen.clear()
    yield
    fake_connectors.BlockHashStore.saved.clear()
    fake_connectors.SaltRecorder.seen.clear()


def test_a_connector_keyed_by_token_ids_alone_is_refused_by_name(vllm: Any, tmp_path: Path) -> None:
    """vLLM's ExampleConnector ignores cache_salt: refused, its class and the reason named."""
    from vllm.config import KVTransferConfig

    connector = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    with pytest.raises(UnsupportedEngine, match=r"ExampleConnector \(it keys KV by a hash"):
        vllm.scheduler(kv_transfer_config=connector)


def test_an_undeclared_connector_is_refused_even_under_a_governed_name(vllm: Any) -> None:
    """A third-party class is refused unless declared, whatever name it is registered under."""
    with pytest.raises(UnsupportedEngine, match=r"BlockHashStore .*declare it in connector_kinds"):
        vllm.scheduler(kv_transfer_config=_transfer("BlockHashStore"))


def test_a_declared_kind_that_does_not_exist_is_a_config_error(vllm: Any) -> None:
    with pytest.raises(BindingConfigError, match="connector_kinds"):
        vllm.scheduler(
            kv_transfer_config=_transfer("BlockHashStore"),
            kvgov={"connector_kinds": {BLOCK_STORE: "token_ids"}},
        )


def _servers(vllm: Any, n: int = 2) -> list[Any]:
    return [
        vllm.scheduler(
            kv_transfer_config=_transfer("BlockHashStore"),
            kvgov={"connector_kinds": {BLOCK_STORE: "block_hashes"}},
        )
        for _ in range(n)
    ]


def test_a_block_hash_connector_shares_kv_across_servers_only_within_a_scope(vllm: Any) -> None:
    """One store behind two servers: A's KV reaches A on the other server, never B; audited."""
    one, two = _servers(vllm)
    vllm.run(one, vllm.request("a1", PROMPT, tenant="A"))
    assert vllm.hit(two, vllm.request("b2", PROMPT, tenant="B")) == 0
    assert vllm.hit(two, vllm.request("a2", PROMPT, tenant="A")) >= 9 * 16

    restores = [e for e in vllm.events(two) if e.type == "offload_restore"]
    assert [(e.tenant, e.sequence_id) for e in restores] == [("A", "a2")]
    assert restores[0].requester_tenant == "A"
    assert restores[0].details["connector"] == BLOCK_STORE
    assert two.kvgov_connector.hit_tokens == {"A": restores[0].reused_tokens}


def test_blocks_a_connector_loads_are_owned_by_the_request(vllm: Any) -> None:
    """The blocks vLLM allocates for external tokens are recorded as the requester's."""
    one, two = _servers(vllm)
    vllm.run(one, vllm.request("a1", PROMPT, tenant="A"))
    request = vllm.request("a2", PROMPT, tenant="A", max_tokens=50)
    two.add_request(request)
    vllm.step(two)
    ids = two.kv_cache_manager.get_block_ids("a2")[0]
    owners = {two.kvgov.gov.ledger.owners.table[i] for i in ids}
    assert len(ids) >= 10
    assert {o.tenant for o in owners} == {"A"}


def test_the_control_stock_scheduler_shares_a_tenants_kv_with_another(vllm: Any) -> None:
    """Without kvgov the same connector (unscoped hashes) hands A's KV to B: the leak is visible."""
    from vllm.v1.core.sched.scheduler import Scheduler

    one = vllm.scheduler(Scheduler, kv_transfer_config=_transfer("BlockHashStore"))
    two = vllm.scheduler(Scheduler, kv_transfer_config=_transfer("BlockHashStore"))
    vllm.run(one, vllm.request("a1", PROMPT, tenant="A"))
    assert vllm.hit(two, vllm.request("b2", PROMPT, tenant="B")) >= 9 * 16


def test_a_cache_salt_connector_sees_the_namespace_digest_never_the_clients_salt(
    vllm: Any,
) -> None:
    """LMCache-style: the salt is kvgov's, per scope; the client's salt only refines it."""
    from tests.govern.vllm import fake_connectors

    sched = vllm.scheduler(
        kv_transfer_config=_transfer("SaltRecorder"),
        kvgov={"connector_kinds": {SALT: "cache_salt"}},
    )
    vllm.run(
        sched,
        vllm.request("a1", PROMPT, tenant="A", salt="client-salt"),
        vllm.request("a2", PROMPT, tenant="A", salt="client-salt"),
        vllm.request("b1", PROMPT, tenant="B", salt="client-salt"),
        vllm.request("a3", PROMPT, tenant="A"),
    )
    salts = dict(fake_connectors.SaltRecorder.seen)
    assert "client-salt" not in salts.values()
    assert salts["a1"] == salts["a2"]  # one scope, one client salt: one salt
    assert len({salts["a1"], salts["b1"], salts["a3"]}) == 3
    assert all(len(s) == 64 for s in salts.values())


def test_a_cache_salt_connector_gets_a_consistent_keyed_chain(vllm: Any) -> None:
    """After the salt swap the request is hashed again: A's second request still hits A's blocks."""
    sched = vllm.scheduler(
        kv_transfer_config=_transfer("SaltRecorder"),
        kvgov={"connector_kinds": {SALT: "cache_salt"}},
    )
    vllm.run(sched, vllm.request("a1", PROMPT, tenant="A", salt="s"))
    assert vllm.hit(sched, vllm.request("a2", PROMPT, tenant="A", salt="s")) >= 9 * 16
    assert vllm.hit(sched, vllm.request("b1", PROMPT, tenant="B", salt="s")) == 0


def test_blocks_an_async_load_fills_are_not_zeroed_before_the_load_ends(vllm: Any) -> None:
    """Aborted while its KV loads: its blocks are zeroed only once the connector releases them."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    loader = MODULE + ".AsyncLoader"
    sched = vllm.scheduler(
        kv_transfer_config=_transfer("AsyncLoader"),
        kvgov={"connector_kinds": {loader: "block_hashes"}},
    )
    sched.add_request(vllm.request("a1", PROMPT, tenant="A"))
    so = sched.schedule()
    loading = set(sched.kv_cache_manager.get_block_ids("a1")[0])
    assert len(loading) >= 9
    sched.update_from_output(so, ModelRunnerOutput(req_ids=[], req_id_to_index={}))
    sched.finish_requests("a1", RequestStatus.FINISHED_ABORTED)
    for _ in range(3):  # the load is still running: nothing of it may be zeroed
        so = sched.schedule()
        assert not loading & set(so.new_block_ids_to_zero or ())
        sched.update_from_output(so, ModelRunnerOutput(req_ids=[], req_id_to_index={}))
    done = KVConnectorOutput(finished_recving={"a1"})  # the load ended: vLLM frees them
    so = sched.schedule()
    sched.update_from_output(
        so, ModelRunnerOutput(req_ids=[], req_id_to_index={}, kv_connector_output=done)
    )
    zeroed: set[int] = set()
    for _ in range(3):
        so = sched.schedule()
        zeroed |= set(so.new_block_ids_to_zero or ())
        sched.update_from_output(so, ModelRunnerOutput(req_ids=[], req_id_to_index={}))
    assert loading <= zeroed


def test_a_block_freed_and_handed_to_an_async_load_is_zeroed_at_its_next_release(
    vllm: Any,
) -> None:
    """Freed by A and handed to B's async load in one step: not zeroed with the load, later.

    vLLM keeps the blocks an async load fills out of that step's zeroing (the zeroing
    would race the host-submitted read). Such a block that just left its owner is zeroed
    when it leaves its new owner, before anyone else gets it, and that step's "done"
    covers A's order too.
    """
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    loader = MODULE + ".AsyncLoaderForLoads"
    sched = vllm.scheduler(
        num_blocks=8,
        kv_transfer_config=_transfer("AsyncLoaderForLoads"),
        kvgov={"connector_kinds": {loader: "block_hashes"}},
    )
    worker = vllm.worker(sched)
    vllm.run(sched, vllm.request("a1", PROMPT[:80], tenant="A"))  # its 5 full blocks cached
    written_by_a = {b for b, who in enumerate(worker.content) if who == "a1"}
    assert len(written_by_a) >= 5

    sched.add_request(vllm.request("load1", PROMPT[:96], tenant="B"))  # an 80-token async load
    so = sched.schedule()
    loading = set(sched.kv_cache_manager.get_block_ids("load1")[0])
    reused = loading & written_by_a
    assert len(loading) == 5 and reused  # A's blocks, evicted or freed, now filled by the load
    assert not loading & set(so.new_block_ids_to_zero or ())
    for b in loading:  # the load writes them; the step's zeroing must not wipe that
        worker.content[b] = "load1"
    worker.apply(so)
    assert all(worker.content[b] == "load1" for b in loading)
    sched.update_from_output(so, ModelRunnerOutput(req_ids=[], req_id_to_index={}))

    sched.finish_requests("load1", RequestStatus.FINISHED_ABORTED)  # released: zeroed now
    done = KVConnectorOutput(finished_recving={"load1"})
    so = sched.schedule()
    worker.apply(so)
    sched.update_from_output(
        so, ModelRunnerOutput(req_ids=[], req_id_to_index={}, kv_connector_output=done)
    )
    zeroed: set[int] = set()
    while sched.has_requests():
        so, _ = vllm.step(sched)
        zeroed |= set(so.new_block_ids_to_zero or ())
    assert loading <= zeroed
    assert all(worker.content[b] is None for b in loading)
    vllm.run(sched, vllm.request("c1", PROMPT[:96], tenant="C"))  # reuses them: all zero
    assert not worker.violations
    done_a = {
        b
        for e in vllm.events(sched, type="zeroization")
        if e.tenant == "A" and e.details["state"] == "done"
        for b in e.block_ids
    }
    assert reused <= done_a
