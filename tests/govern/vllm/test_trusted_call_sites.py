"""On vLLM's scheduler, the binding's fast events are the events AuditEvent would build.

Every event built with ``trusted_event`` (admission, reuse, eviction, zeroization
ordered and done) is built again with every check of ``AuditEvent`` and compared
(``tests.support.trusted``): two tenants, shared prompts, capacity evictions, a purge.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.trusted import shadow_trusted_events

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("fold", [True, False])
def test_every_trusted_event_matches_the_checked_one(
    vllm: Any, monkeypatch: pytest.MonkeyPatch, fold: bool
) -> None:
    """Both event layouts (own-scope reuse in the admission event, or its own event)."""
    from kvgov.govern.vllm.binding import VllmGovernance

    monkeypatch.setattr(VllmGovernance, "fold_own_reuse", fold)
    seen = shadow_trusted_events(monkeypatch, "kvgov.govern.vllm.binding")
    sched = vllm.scheduler(num_blocks=24)
    shared = [(7 * j) % 50_000 for j in range(70)]
    for i in range(10):
        tokens = shared if i % 2 else [(i * 131 + j) % 50_000 for j in range(70)]
        vllm.run(sched, vllm.request(f"r{i}", tokens, tenant=("acme", "globex")[i % 3 == 0]))
        if i == 6:
            sched.kvgov_call("purge_tenant", "globex")
    vllm.run(sched)  # the idle engine's zeroing step
    sched.kvgov.gov.audit.flush()
    assert {"admission", "eviction", "zeroization"} <= set(seen)
    assert ("reuse" in seen) is not fold  # folded: every reuse here is a first, own-scope one
    states = {e.details.get("state") for e in vllm.events(sched, type="zeroization")}
    assert {"ordered", "done"} <= states
