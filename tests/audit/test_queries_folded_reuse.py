"""An admission that holds its request's own reuse answers every query as two events would.

The vLLM binding writes a request's first reuse of its own scope's cached blocks into
its ``admission`` event (``details.own_reuse``, :data:`kvgov.audit.events.OWN_REUSE_KEY`)
instead of a ``reuse`` event after it. Here two trails record the same acts on the
same clock, one each way, and every query of :class:`AuditQueries` returns the same
records but for what names a stored row (event id, sequence number, hash). The
binding's own replay of a vLLM workload under both layouts, through the ``kvgov audit``
commands, is ``tests/govern/vllm/test_event_layout.py``.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import AuditEvent, AuditLog, AuditQueries, AuditRecord, EventType
from kvgov.audit.events import OWN_REUSE_KEY
from kvgov.exceptions import MalformedAuditRow

from .conftest import FixedClock, attacker

ROW_NAMES = ("event_id", "seq", "hash")
SCOPE = {
    "classification": "internal",
    "model": "m",
    "model_revision": "r1",
    "tokenizer": "t",
    "tokenizer_revision": "v1",
    "template_version": "sys-v3",
}
ADMISSION_DETAILS = {
    "cache": True,
    "priority": 50,
    "reason": "ok",
    "requested_priority": None,
    "ttl_seconds": 3600,
}


class StepClock(FixedClock):
    """A clock that moves only when told (two events of one act share a time)."""

    def __call__(self) -> float:
        return self.now


def _admission(tenant: str, seq_id: str, ids: tuple[int, ...], hit: int, fold: bool) -> AuditEvent:
    details = dict(ADMISSION_DETAILS)
    if fold:
        details[OWN_REUSE_KEY] = {"blocks": hit, "reused_tokens": hit * 16}
    return AuditEvent(
        EventType.ADMISSION,
        tenant=tenant,
        **SCOPE,
        sequence_id=seq_id,
        block_ids=ids,
        token_count=len(ids) * 16,
        reused_tokens=hit * 16,
        decision_id=f"dec-{seq_id}",
        policy_revision="rev-a",
        details=details,
    )


def _trail(url: str, tmp_path: Path, fold: bool) -> None:
    clock = StepClock()
    with AuditLog(url, "w1", clock=clock, spool_path=tmp_path / f"{fold}.jsonl") as log:
        for i, (tenant, hit) in enumerate(
            [("acme", 0), ("acme", 3), ("beta", 0), ("beta", 2), ("acme", 1)]
        ):
            clock.now += 1
            ids = tuple(range(10 * i, 10 * i + 4))
            log.record(_admission(tenant, f"s{i}", ids, hit, fold and hit > 0))
            if hit and not fold:
                log.record(
                    AuditEvent(
                        EventType.REUSE,
                        tenant=tenant,
                        requester_tenant=tenant,
                        **SCOPE,
                        sequence_id=f"s{i}",
                        block_ids=ids[:hit],
                        reused_tokens=hit * 16,
                    )
                )
            if i == 2:
                clock.now += 1
                log.record(
                    AuditEvent(
                        EventType.CROSS_TENANT_REUSE,
                        tenant="acme",
                        requester_tenant="beta",
                        **SCOPE,
                        block_ids=(10,),
                        reused_tokens=16,
                        decision_id="dec-x",
                        policy_revision="rev-b",
                    )
                )
                log.record(AuditEvent(EventType.POLICY_DENIED, tenant="beta", decision_id="d"))
        clock.now += 1
        log.record(AuditEvent(EventType.ERASURE, tenant="acme", block_ids=(1, 2)))


def _plain(records: Any) -> list[dict[str, Any]]:
    out = []
    for r in records:
        d = r.to_dict() if isinstance(r, AuditRecord) else dict(r)
        out.append({k: v for k, v in d.items() if k not in ROW_NAMES})
    return out


def _answers(url: str) -> dict[str, Any]:
    with AuditQueries(url) as q:
        out: dict[str, Any] = {
            "denials": _plain(q.denials()),
            "events": _plain(q.events()),
            "events limit": _plain(q.events(limit=4)),
            "reuse limit": _plain(q.events(type="reuse", limit=1)),
            "admission limit": _plain(q.events(type="admission", limit=2)),
            "decisions a": _plain(q.decisions("rev-a")),
            "decisions b": _plain(q.decisions("rev-b")),
            "iter reuse": _plain(q.iter_events(["reuse"])),
            "iter reuse beta": _plain(q.iter_events(["reuse", "cross_tenant_reuse"], "beta")),
            "iter all": _plain(q.iter_all()),
            "window": _plain(q.events(since=1_700_000_002, until=1_700_000_004)),
        }
        for tenant in ("acme", "beta"):
            out[f"reuse {tenant}"] = _plain(q.reuse(tenant))
            out[f"erasure {tenant}"] = _plain(q.erasure(tenant))
            out[f"events {tenant}"] = _plain(q.events(tenant=tenant))
            out[f"counts {tenant}"] = q.counts("type", tenant)
        for kind in ("admission", "reuse", "cross_tenant_reuse"):
            out[f"events {kind}"] = _plain(q.events(type=kind))
        for by in ("type", "tenant", "requester_tenant", "stream", "policy_revision"):
            out[f"counts {by}"] = q.counts(by)
        for fmt in ("jsonl", "json", "csv"):
            buf = io.StringIO()
            q.export(buf, fmt)
            if fmt == "jsonl":
                rows: Any = [json.loads(line) for line in buf.getvalue().splitlines()]
            elif fmt == "json":
                rows = json.loads(buf.getvalue())
            else:
                rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
            out[f"export {fmt}"] = _plain(rows)
    return out


def test_every_query_answers_the_same(db_url: str, tmp_path: Path) -> None:
    """Both layouts: the same records, in the same order, but for the rows' names."""
    folded_url = db_url
    separate_url = f"sqlite:///{tmp_path / 'separate.db'}"
    _trail(separate_url, tmp_path, fold=False)
    _trail(folded_url, tmp_path, fold=True)
    separate, folded = _answers(separate_url), _answers(folded_url)
    assert separate["counts type"]["reuse"] == 3  # what the layouts differ on is there
    for name in separate:
        assert folded[name] == separate[name], name
    with AuditQueries(folded_url) as q:  # the folded reuse names the row that holds it
        (admission, reuse) = q.events(tenant="beta")[2:4]
        assert (admission.type, reuse.type) == ("admission", "reuse")
        assert (reuse.event_id, reuse.seq, reuse.hash) == (
            admission.event_id,
            admission.seq,
            admission.hash,
        )
        assert q.event(admission.event_id) == admission
        assert OWN_REUSE_KEY not in admission.details


@pytest.mark.parametrize(
    "fold",
    [
        {"blocks": 0, "reused_tokens": 0},
        {"blocks": 5, "reused_tokens": 80},  # more blocks than the admission lists
        {"blocks": 1},
        {"blocks": 1, "reused_tokens": 16, "x": 1},
        {"blocks": "1", "reused_tokens": 16},
        [1, 16],
    ],
)
def test_a_malformed_fold_stops_the_queries(
    sqlite_url: str, tmp_path: Path, fold: Any, clock: FixedClock
) -> None:
    """An edited ``own_reuse`` is a malformed row, never a guessed reuse."""
    db_url = sqlite_url
    with AuditLog(db_url, "w1", clock=clock, spool_path=tmp_path / "s.jsonl") as log:
        log.record(_admission("acme", "s0", (1, 2, 3, 4), 1, fold=True))
    details = json.dumps({**ADMISSION_DETAILS, OWN_REUSE_KEY: fold}).replace("'", "''")
    attacker(db_url, f"UPDATE audit_events SET details = '{details}'")
    with AuditQueries(db_url) as q:
        with pytest.raises(MalformedAuditRow, match="own_reuse"):
            q.events()
        with pytest.raises(MalformedAuditRow, match="own_reuse"):
            q.counts("type")
