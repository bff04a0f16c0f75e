"""A request's own-scope reuse folded into its admission event: every query answers the same.

The vLLM binding writes the first reuse of a request's own scope's cached blocks in
its ``admission`` event (``details.own_reuse``) instead of a ``reuse`` event after it
(``VllmGovernance.fold_own_reuse``). One workload is replayed under both layouts, on
the same clock, into two audit databases: every compliance command (``kvgov audit
reuse``, ``erasure``, ``denials``, ``decisions``, ``events`` with each filter and
``--count-by``, ``export`` in every format, the OPA decision log) must print the same
records. Only what names a stored row differs, necessarily: the folded trail has one
row fewer per such request, so the event ids, sequence numbers and chain hashes after
the first fold are not the same (a folded reuse carries its admission's); both
trails verify.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kvgov.audit import verify
from kvgov.govern import refusal
from kvgov.policy import engine
from tests.support.audit_answers import commands

pytestmark = pytest.mark.vllm

TENANTS = ("bank", "clinic", "acme")
#: The workload's middle, for ``events --since --until``.
WINDOW = ("2023-11-14T22:13:25+00:00", "2023-11-14T22:13:30+00:00")
GROUP = {"pub": {"publishers": ["bank", "clinic"], "classifications": ["public"]}}
POLICY = {
    "kvgov": {
        "config": {
            "share_groups": GROUP,
            "tenants": {"denied": {"admission": False}},
        }
    }
}


def _prompt(i: int, n: int = 70) -> list[int]:
    return [(i * 131 + j) % 50_000 for j in range(n)]


def _workload(vllm: Any, clock: Any, url: str) -> None:
    """Own-scope reuse (folded), cross-tenant reuse in a share group and a hit over two
    owners (never folded), denials, capacity evictions, a purge, an invalidation."""
    sched = vllm.scheduler(
        num_blocks=48, kvgov={"audit_url": url, "worker_id": "engine-0", "policy_data": POLICY}
    )
    shared, ext, more = _prompt(0), _prompt(1, 32), _prompt(2, 32)
    steps: list[tuple[str, list[int], str, str, str]] = [
        # request id, tokens, tenant, classification, template
        ("own-a1", shared, "acme", "internal", "sys-v3"),
        ("own-a2", shared, "acme", "internal", "sys-v3"),  # acme's own blocks: folded
        ("own-b1", shared, "bank", "internal", "sys-v3"),
        ("own-b2", shared, "bank", "internal", "sys-v3"),
        ("pub-b1", shared, "bank", "public", "sys-v3"),
        ("pub-c1", [*shared, *ext], "clinic", "public", "sys-v3"),  # bank's: cross-tenant
        ("pub-b2", shared, "bank", "public", "sys-v3"),  # its own again: folded
        ("pub-b3", [*shared, *ext, *more], "bank", "public", "sys-v3"),  # bank's and clinic's
        ("tpl-1", _prompt(3), "clinic", "internal", "v2"),
        ("tpl-2", _prompt(3), "clinic", "internal", "v2"),  # folded
    ]
    steps += [(f"fill-{i}", _prompt(10 + i), "acme", "internal", "sys-v3") for i in range(8)]
    steps += [("own-b3", shared, "bank", "internal", "sys-v3")]
    for req_id, tokens, tenant, classification, template in steps:
        clock.advance(1.0)
        request = vllm.request(
            req_id, tokens, tenant=tenant, classification=classification, template=template
        )
        vllm.run(sched, request)
    clock.advance(1.0)
    vllm.run(sched, vllm.request("d0", shared, tenant="denied"))
    vllm.run(sched, vllm.request("bad", shared, xargs={"kvgov_priority": 500}))
    clock.advance(1.0)
    sched.kvgov_call("purge_tenant", "acme")
    clock.advance(1.0)
    sched.kvgov_call("invalidate", {"template_version": "v2"})
    clock.advance(1.0)
    vllm.run(sched, vllm.request("own-c1", _prompt(4), tenant="clinic"))
    vllm.run(sched, vllm.request("own-c2", _prompt(4), tenant="clinic"))  # folded
    clock.advance(1.0)
    vllm.run(sched)
    sched.shutdown()


def _stored(url: str) -> dict[str, int]:
    """Rows by type, as stored (what the queries answer from)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            sql = text("SELECT type, count(*) FROM audit_events GROUP BY type")
            return {str(k): int(n) for k, n in conn.execute(sql).all()}
    finally:
        engine.dispose()


def test_both_layouts_answer_every_query_the_same(
    vllm: Any, clock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvgov.govern.vllm.binding import VllmGovernance

    answers, stored = {}, {}
    for fold in (False, True):
        url = f"sqlite:///{tmp_path / f'fold-{fold}.db'}"
        monkeypatch.setattr(VllmGovernance, "fold_own_reuse", fold)
        clock.now = 1_700_000_000.0
        # decision ids are random: the same numbers in both replays, in the same order
        names = itertools.count(1)
        monkeypatch.setattr(engine, "new_decision_id", lambda n=names: str(uuid.UUID(int=next(n))))
        monkeypatch.setattr(refusal.uuid, "uuid4", lambda n=names: uuid.UUID(int=next(n)))
        _workload(vllm, clock, url)
        assert verify(url).ok
        answers[fold], stored[fold] = (
            commands(url, tmp_path, (*TENANTS, "denied"), WINDOW),
            _stored(url),
        )
    separate, folded = answers[False], answers[True]
    # the workload reaches what the layouts differ on, and what they must not
    counts = separate["count-by type"]
    assert counts["reuse"] >= 6 and counts["cross_tenant_reuse"] >= 2
    assert counts["policy_denied"] >= 2 and counts["erasure"] == 1
    assert counts["eviction"] >= 1 and counts["invalidation"] == 1
    # the folded trail holds one row fewer per folded reuse, and nothing else differs
    assert stored[False] == counts
    folded_reuses = stored[False]["reuse"] - stored[True]["reuse"]
    assert folded_reuses >= 5
    assert {**stored[True], "reuse": stored[False]["reuse"]} == stored[False]
    for name in separate:
        assert folded[name] == separate[name], name
