"""Signed orders and the order store (audit/fleet.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses

import pytest

from kvgov.audit import SigningKey
from kvgov.audit.fleet import FleetStore, OrderResult, sign_order, verify_order
from kvgov.exceptions import InvalidFleetOrder
from kvgov.govern.fleet import trusted_keys


def _trusted(*keys: SigningKey) -> dict[str, object]:
    return trusted_keys([k.private_key.public_key() for k in keys])  # type: ignore[return-value]


def test_a_signed_order_verifies_and_any_change_is_refused(
    operator: SigningKey, intruder: SigningKey
) -> None:
    order = sign_order(operator, "purge", {"tenant": "acme"})
    trusted = trusted_keys([operator.private_key.public_key()])
    assert verify_order(order, trusted) is None
    altered = dataclasses.replace(order, payload={"tenant": "globex"})
    assert "does not verify" in (verify_order(altered, trusted) or "")
    forged = sign_order(intruder, "purge", {"tenant": "acme"})
    assert "not a trusted operator key" in (verify_order(forged, trusted) or "")
    relabelled = dataclasses.replace(forged, signer_key_id=operator.key_id)
    assert "does not verify" in (verify_order(relabelled, trusted) or "")


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        ("drop_table", {"tenant": "acme"}),
        ("purge", {}),
        ("purge", {"tenant": ""}),
        ("purge", {"tenant": "acme", "extra": 1}),
        ("rotate_secret", {"secret_file": "/x"}),
        ("rollout", {"files": {}, "digest": "d"}),
    ],
)
def test_a_malformed_order_is_refused_before_it_is_signed(
    operator: SigningKey, kind: str, payload: dict[str, object]
) -> None:
    with pytest.raises(InvalidFleetOrder):
        sign_order(operator, kind, payload)


def test_the_store_keeps_orders_and_one_result_per_engine(
    fleet_url: str, operator: SigningKey
) -> None:
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        first = store.issue(sign_order(operator, "purge", {"tenant": "acme"}))
        second = store.issue(sign_order(operator, "invalidate", {"filter": {"model": "m"}}))
        assert first.seq < second.seq
        with pytest.raises(InvalidFleetOrder, match="already used"):
            store.issue(sign_order(operator, "purge", {"tenant": "x"}, order_id=first.order_id))
        read = store.order(first.order_id)
        assert read is not None
        assert verify_order(read, trusted_keys([operator.private_key.public_key()])) is None
        assert [o.order_id for o in store.pending("e1")] == [first.order_id, second.order_id]
        result = OrderResult(first.order_id, "e1", "completed", True, "s:1", {"blocks": 2})
        assert store.record_result(result) is True
        assert store.record_result(result) is False  # a replay writes nothing
        assert [o.order_id for o in store.pending("e1")] == [second.order_id]
        assert [o.order_id for o in store.pending("e2")] == [first.order_id, second.order_id]
        (stored,) = store.results(first.order_id)
        assert (stored.status, stored.verified, stored.detail) == ("completed", True, {"blocks": 2})


def test_engines_register_heartbeat_and_stop(fleet_url: str) -> None:
    now = [1_000_000]
    with FleetStore(fleet_url, auto_upgrade=False, clock=lambda: now[0]) as store:
        store.register(engine_id="e1", kind="native", versions={"kvgov": "1"},
                       policy_revision="r1", key_id="k1", audit_stream="s1")  # fmt: skip
        now[0] = 5_000_000
        store.heartbeat("e1", policy_revision="r2", key_id="k2")
        (e,) = store.engines()
        assert (e.heartbeat_us, e.policy_revision, e.key_id, e.stopped_us) == (
            5_000_000, "r2", "k2", None,
        )  # fmt: skip
        store.heartbeat("e1", policy_revision="r2", key_id="k2", stopped=True)
        assert store.engines()[0].stopped_us == 5_000_000
        now[0] = 9_000_000  # a restart registers again: no longer stopped
        assert store.register(engine_id="e1", kind="native", versions={}, policy_revision="r2",
                              key_id="k2", audit_stream="s2") == 9_000_000  # fmt: skip
        (e,) = store.engines()
        assert (e.stopped_us, e.audit_stream) == (None, "s2")
