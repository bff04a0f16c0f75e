"""The fleet agent in the governed vLLM scheduler (docs/fleet.md): orders run at a step
boundary (the start of ``schedule()``), an erasure completes when the step that carried
its zeroing came back, a wrongly signed order is refused and audited, a rollout leaves
no decision of the old bundle served, and an idle engine counts queued orders as work."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kvgov.audit import AuditQueries, SigningKey, upgrade
from kvgov.audit.fleet import FleetStore, OrderResult, sign_order
from kvgov.exceptions import BindingConfigError
from kvgov.govern.fleet import bundle_digest
from tests.govern.fleet.conftest import blocking_bundle

pytestmark = pytest.mark.vllm


def _key() -> SigningKey:
    return SigningKey.from_private_key(Ed25519PrivateKey.generate(), "configured")


def _keys_file(path: Path, *keys: SigningKey) -> Path:
    path.write_bytes(
        b"".join(
            k.private_key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
            for k in keys
        )
    )
    path.chmod(0o600)
    return path


@pytest.fixture()
def operator() -> SigningKey:
    return _key()


@pytest.fixture()
def fleet(vllm: Any, operator: SigningKey, tmp_path: Path) -> dict[str, Any]:
    """The settings of a governed scheduler in a fleet on the harness's SQLite trail."""
    upgrade(vllm.audit_url)
    return {
        "fleet_url": vllm.audit_url,
        "fleet_engine_id": "vllm-1",
        "fleet_operator_keys_file": str(_keys_file(tmp_path / "operators.pem", operator)),
        "fleet_poll_interval": 3600.0,  # the test fetches itself (agent.sync)
    }


def _issue(url: str, key: SigningKey, kind: str, payload: dict[str, Any]) -> str:
    with FleetStore(url, auto_upgrade=False) as store:
        return store.issue(sign_order(key, kind, payload)).order_id


def _result(url: str, order_id: str) -> OrderResult:
    with FleetStore(url, auto_upgrade=False) as store:
        (result,) = store.results(order_id)
    return result


def _prompt(seed: int, n: int = 64) -> list[int]:
    return [(seed * 97 + j) % 900 + 1 for j in range(n)]


def _step(vllm: Any, sched: Any, *, before_return: Any = None) -> Any:
    """One step as the harness runs it, with a look between schedule and its return."""
    from vllm.v1.outputs import ModelRunnerOutput

    so = sched.schedule()
    vllm.worker(sched).apply(so)
    if before_return is not None:
        before_return(so)
    req_ids = list(so.num_scheduled_tokens)
    out = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[1000] for _ in req_ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )
    sched.update_from_output(so, out)
    return so


def test_a_purge_runs_at_the_boundary_and_completes_when_its_zeroing_came_back(
    vllm: Any, fleet: dict[str, Any], operator: SigningKey
) -> None:
    sched = vllm.scheduler(kvgov=fleet)
    agent = sched.kvgov_fleet.agent
    vllm.run(sched, vllm.request("a1", _prompt(1), tenant="acme"))
    vllm.run(sched, vllm.request("g1", _prompt(2), tenant="globex"))
    acme = [b for b in sched.kvgov_call("state")["cached"]
            if vllm.worker(sched).content[b] == "a1"]  # fmt: skip
    assert acme and not sched.has_requests()
    order_id = _issue(vllm.audit_url, operator, "purge", {"tenant": "acme"})
    agent.sync()  # fetched and queued: not run on the fetching thread
    assert set(acme) <= set(sched.kvgov_call("state")["cached"])
    assert sched.has_requests()  # the idle engine has a step to run: the order's

    def not_yet(so: Any) -> None:  # the order ran at the start of schedule(); not complete
        assert set(acme) <= set(so.new_block_ids_to_zero)
        assert agent.executed == 1 and agent.pending_results() == 0

    _step(vllm, sched, before_return=not_yet)
    assert all(vllm.worker(sched).content[b] is None for b in acme)  # the worker zeroed them
    assert agent.pending_results() == 1 and not sched.has_requests()
    agent.sync()  # the result written
    result = _result(vllm.audit_url, order_id)
    assert (result.engine_id, result.status, result.verified) == ("vllm-1", "completed", True)
    confirmed = vllm.events(sched, type="fleet_order")
    (event,) = [e for e in confirmed if e.event_id == result.event_id]
    assert event.details["order_id"] == order_id
    assert (event.details["outcome"], event.details["verified"]) == ("confirmed", True)
    with AuditQueries(vllm.audit_url) as q:
        erasure = q.event(event.details["evidence_event_id"])
    assert erasure is not None and erasure.type == "erasure"
    assert erasure.details["order_id"] == order_id
    assert set(acme) <= set(erasure.block_ids)
    agent.sync()
    assert agent.drain() == 0  # run once
    sched.shutdown()
    with FleetStore(vllm.audit_url, auto_upgrade=False) as store:
        (engine,) = store.engines()
    assert (engine.engine_id, engine.kind) == ("vllm-1", "vllm")
    assert engine.stopped_us is not None


def test_a_purge_held_by_a_running_request_is_unverified(
    vllm: Any, fleet: dict[str, Any], operator: SigningKey
) -> None:
    sched = vllm.scheduler(kvgov=fleet)
    agent = sched.kvgov_fleet.agent
    sched.add_request(vllm.request("a1", _prompt(1), tenant="acme", max_tokens=50))
    _step(vllm, sched)  # acme's request runs, holding its blocks
    order_id = _issue(vllm.audit_url, operator, "purge", {"tenant": "acme"})
    agent.sync()
    _step(vllm, sched)
    agent.sync()
    result = _result(vllm.audit_url, order_id)
    assert (result.status, result.verified) == ("unverified", False)
    assert result.detail["held_blocks"] > 0


def test_a_wrongly_signed_order_is_refused_and_audited(
    vllm: Any, fleet: dict[str, Any], operator: SigningKey
) -> None:
    sched = vllm.scheduler(kvgov=fleet)
    agent = sched.kvgov_fleet.agent
    vllm.run(sched, vllm.request("a1", _prompt(1), tenant="acme"))
    cached = sched.kvgov_call("state")["cached"]
    order_id = _issue(vllm.audit_url, _key(), "purge", {"tenant": "acme"})
    agent.sync()
    vllm.run(sched)
    assert agent.executed == 1
    assert sched.kvgov_call("state")["cached"] == cached  # nothing erased
    agent.sync()
    result = _result(vllm.audit_url, order_id)
    assert result.status == "refused"
    assert "not a trusted operator key" in result.detail["reason"]
    (event,) = [e for e in vllm.events(sched, type="fleet_order") if e.event_id == result.event_id]
    assert (event.details["outcome"], event.details["order_id"]) == ("refused", order_id)


def test_after_a_rollout_no_decision_of_the_old_bundle_is_served(
    vllm: Any, fleet: dict[str, Any], operator: SigningKey, tmp_path: Path
) -> None:
    sched = vllm.scheduler(kvgov=fleet)
    agent = sched.kvgov_fleet.agent
    before = sched.kvgov.gov.policy.bundle_revision
    run = vllm.run(sched, vllm.request("b1", _prompt(3), tenant="blocked"))
    assert run.finals["b1"].finish_reason is not None and "b1" not in sched.requests
    assert "kvgov:" not in str(run.finals["b1"].stop_reason)  # admitted: decided and cached
    bundle = blocking_bundle(tmp_path / "bundle")
    files = {p.name: p.read_text(encoding="utf-8") for p in bundle.iterdir() if p.is_file()}
    order_id = _issue(vllm.audit_url, operator, "rollout",
                      {"files": files, "digest": bundle_digest(files)})  # fmt: skip
    agent.sync()
    # fetched, not yet run: the engine still decides under the old bundle
    assert sched.kvgov.admit(vllm.request("b2", _prompt(3), tenant="blocked")) is None
    vllm.run(sched, vllm.request("b3", _prompt(3), tenant="blocked"))  # its step runs the order
    after = sched.kvgov.gov.policy.bundle_revision
    assert after != before
    refused = vllm.run(sched, vllm.request("b4", _prompt(3), tenant="blocked"))
    assert str(refused.finals["b4"].stop_reason).startswith("kvgov:")
    agent.sync()
    result = _result(vllm.audit_url, order_id)
    assert result.status == "completed"
    assert result.detail["policy_revision"] == after


def test_an_idle_engine_is_woken_when_an_order_is_queued(
    vllm: Any, fleet: dict[str, Any], operator: SigningKey
) -> None:
    """The agent's thread calls the engine core's wake-up when it queues an order."""
    sched = vllm.scheduler(kvgov={**fleet, "fleet_poll_interval": 0.05})
    woken = threading.Event()
    sched.kvgov_fleet.set_wake(woken.set)
    _issue(vllm.audit_url, operator, "purge", {"tenant": "acme"})
    assert woken.wait(60)
    assert sched.has_requests()
    vllm.run(sched)
    assert sched.kvgov_fleet.agent.executed == 1


def test_fleet_url_needs_an_engine_id_and_operator_keys(
    vllm: Any, fleet: dict[str, Any], tmp_path: Path
) -> None:
    no_id = {k: v for k, v in fleet.items() if k != "fleet_engine_id"}
    with pytest.raises(BindingConfigError) as info:
        vllm.scheduler(kvgov=no_id)
    assert info.value.setting == "fleet_engine_id"
    no_keys = {k: v for k, v in fleet.items() if k != "fleet_operator_keys_file"}
    with pytest.raises(BindingConfigError) as info:
        vllm.scheduler(kvgov=no_keys)
    assert info.value.setting == "fleet_operator_keys_file"
