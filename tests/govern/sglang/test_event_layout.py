"""A request's own-scope reuse folded into its admission event on SGLang: what every query says.

The governed SGLang cache writes a request's admission event after its first match
(``SglangGovernance.fold_own_reuse``); where that match's hit, in the request's own
namespace, is only its own scope's pages, the one event also holds the reuse
(``details.own_reuse``) instead of a ``reuse`` event after it. One workload (own
reuse, a share group's own and cross-tenant reuse, a reuse found by a later match,
denials and refusals, capacity evictions, a purge) is replayed under both layouts on
the same clock into two audit databases, on SQLite and on PostgreSQL, and every
:class:`~kvgov.audit.AuditQueries` method and every ``kvgov audit`` command is asked
the same questions.

What must differ, and nothing else does:

* what names a stored row (event id, sequence number, chain hash): the folded trail
  has one row fewer per folded reuse, and a folded reuse carries its admission's;
* the admission record of a folded request: it names the reused pages
  (``block_ids``) and their tokens (``reused_tokens``), as the vLLM binding's
  admission names the blocks it starts with, where the separate layout's SGLang
  admission, written before the match, names none (0 tokens). So ``reuse``,
  ``erasure``, ``denials`` and every count answer identically, and ``events``,
  ``decisions`` and the exports (but the OPA decision log, which shows neither field)
  differ in exactly those two fields of those records.

Durations measured while replaying (a zeroization's ``details.seconds``) differ
from run to run whatever the layout, and are left out of both.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import uuid
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from kvgov.audit import AuditQueries, AuditRecord, upgrade, verify  # noqa: E402
from kvgov.audit.events import OWN_REUSE_KEY  # noqa: E402
from kvgov.govern import refusal  # noqa: E402
from kvgov.govern.sglang.governance import SglangGovernance  # noqa: E402
from kvgov.policy import engine  # noqa: E402
from tests.support.audit_answers import commands, unnamed  # noqa: E402

from .test_differential import PAGE, _build, _drive_checkpoint, _req  # noqa: E402

TENANTS = ("acme", "bank", "clinic", "denied")
#: The workload's middle, for ``events --since --until``.
WINDOW = ("2023-11-14T22:13:22+00:00", "2023-11-14T22:13:26+00:00")
START = 1_700_000_000.0
POLICY = {
    "kvgov": {
        "config": {
            "share_groups": {
                "pub": {"publishers": ["bank", "clinic"], "classifications": ["public"]}
            },
            "tenants": {"denied": {"admission": False}},
        }
    }
}


class StepClock:
    """A clock that moves only when told (the events of one step share a time)."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def _prompt(i: int, pages: int = 20) -> array:
    return array("q", range(10_000 * (i + 1), 10_000 * (i + 1) + pages * PAGE))


def _workload(cache: Any, alloc: Any, kv: Any, clock: StepClock) -> dict[str, int]:
    """Own reuse (folded), a share group's reuses (never folded), a reuse found by a later
    match (never folded), denials and refusals, capacity evictions, a purge."""
    ids = itertools.count()

    def run(tenant: str, toks: array, **custom: str) -> Any:
        clock.now += 1.0
        req = _req(next(ids), tenant, toks, **custom)
        _drive_checkpoint(cache, alloc, kv, [req])
        return req

    shared = _prompt(0)
    run("acme", shared)
    run("acme", shared)  # acme's own pages: folded
    # a part of them, at the same prompt length (one admission decided: two hit lengths)
    run("acme", array("q", [*shared[: 8 * PAGE], *_prompt(1, 12)]))  # folded
    run("bank", shared, kvgov_classification="public")
    run("clinic", shared, kvgov_classification="public")  # bank's pages: cross-tenant
    run("bank", shared, kvgov_classification="public")  # its own, in the group's namespace
    run("clinic", shared)  # clinic's own namespace: nothing there yet
    run("clinic", shared)  # folded
    # a first match that finds nothing; the pages come later; its next match finds them
    late = _req(next(ids), "clinic", _prompt(2))
    clock.now += 1.0
    toks = array("q", late.origin_input_ids)
    cache.match_prefix(MatchPrefixParams(key=RadixKey(toks, None, limit=len(toks) - 1), req=late))
    run("clinic", _prompt(2))
    _drive_checkpoint(cache, alloc, kv, [late])  # a reuse after its first match: apart
    run("clinic", _prompt(3))  # another prompt (a first match without a hit)
    clock.now += 1.0
    waiting = _req(next(ids), "acme", _prompt(4))
    _drive_checkpoint(cache, alloc, kv, [_req(next(ids), "acme", _prompt(4))])
    _drive_checkpoint(cache, alloc, kv, [waiting])  # first seen after the pages: folded
    # capacity: the pool holds 128 pages, these need more (the tree evicts, pages zeroed)
    for i in range(8):
        run("acme", _prompt(10 + i))
    run("acme", _prompt(10 + 7))  # folded
    run("denied", shared)  # the admission policy refuses it
    run("", shared)  # an invalid scope (an empty tenant): refused by the binding
    clock.now += 1.0
    cache.kvgov.purge_tenant("acme")
    run("acme", shared)  # its pages are gone: no hit
    run("acme", shared)  # folded again
    clock.now += 1.0
    cache.kvgov_close()
    gov = cache.kvgov.gov
    return {tenant: gov.ledger.counters[tenant].hit_tokens for tenant in ("acme", "bank", "clinic")}


def _records(records: Any) -> list[dict[str, Any]]:
    return [unnamed(r.to_dict() if isinstance(r, AuditRecord) else dict(r)) for r in records]


def _api(url: str, tmp_path: Path) -> dict[str, Any]:
    """Every AuditQueries method's answer, row names left out."""
    out: dict[str, Any] = {}
    with AuditQueries(url) as q:
        revisions = sorted({r.policy_revision for r in q.events() if r.policy_revision})
        assert revisions
        out["events"] = _records(q.events())
        out["denials"] = _records(q.denials())
        out["iter_all"] = _records(q.iter_all())
        for n in (1, 2, 3, 5, 8):
            out[f"events limit {n}"] = _records(q.events(limit=n))
        out["events window"] = _records(q.events(since=START + 2, until=START + 6))
        for kind in ("admission", "reuse", "cross_tenant_reuse", "policy_denied", "erasure"):
            out[f"events {kind}"] = _records(q.events(type=kind))
            out[f"events {kind} limit 2"] = _records(q.events(type=kind, limit=2))
        out["iter reuse"] = _records(q.iter_events(["reuse"]))
        for tenant in TENANTS:
            out[f"reuse {tenant}"] = _records(q.reuse(tenant))
            out[f"erasure {tenant}"] = _records(q.erasure(tenant))
            out[f"denials {tenant}"] = _records(q.denials(tenant))
            out[f"events {tenant}"] = _records(q.events(tenant=tenant))
            out[f"counts {tenant}"] = q.counts("type", tenant)
            out[f"iter reuses {tenant}"] = _records(
                q.iter_events(["reuse", "cross_tenant_reuse"], tenant)
            )
        for rev in revisions:
            out[f"decisions {rev}"] = _records(q.decisions(rev))
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
            out[f"export {fmt}"] = unnamed(rows)
    return out


def _stored(url: str) -> tuple[dict[str, int], list[str]]:
    """Rows by type as stored, and the request ids of the admissions holding a reuse."""
    eng = create_engine(url)
    try:
        with eng.connect() as conn:
            sql = text("SELECT type, count(*) FROM audit_events GROUP BY type")
            counts = {str(k): int(n) for k, n in conn.execute(sql).all()}
            rows = conn.execute(
                text("SELECT sequence_id, details FROM audit_events WHERE type = 'admission'")
            ).all()
    finally:
        eng.dispose()
    folded = []
    for seq_id, details in rows:
        d = json.loads(details) if isinstance(details, str) else details
        if OWN_REUSE_KEY in d:
            folded.append(str(seq_id))
    return counts, sorted(folded)


def _as_separate(value: Any, folded: set[str]) -> Any:
    """The folded layout's answer with each folded admission as the separate layout
    writes it: no block ids, no reused tokens (what the layouts are documented to
    differ in; the caller checks that nothing else does)."""
    if isinstance(value, list):
        return [_as_separate(v, folded) for v in value]
    if not isinstance(value, dict):
        return value
    if value.get("type") == "admission" and value.get("sequence_id") in folded:
        blocks = value.get("block_ids")
        empty: Any = "[]" if isinstance(blocks, str) else []  # csv: JSON text
        tokens = value.get("reused_tokens")
        assert blocks not in ([], "[]", None) and tokens not in (0, "0", None), value
        return {**value, "block_ids": empty, "reused_tokens": "0" if isinstance(tokens, str) else 0}
    return {k: _as_separate(v, folded) for k, v in value.items()}


@pytest.fixture(params=["sqlite", "postgresql"])
def two_urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two empty audit databases of one kind (SQLite files, or PostgreSQL databases)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'separate.db'}", f"sqlite:///{tmp_path / 'folded.db'}"
        return
    first: str = request.getfixturevalue("pg_url")
    second = f"{first}_b"
    name = second.rsplit("/", 1)[1]
    from tests.conftest import _pg_admin_connect

    with _pg_admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield first, second
    finally:
        with _pg_admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _replay(
    url: str, fold: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, int]:
    upgrade(url)
    clock = StepClock()
    opened = SglangGovernance.__dict__["open"].__func__
    monkeypatch.setattr(  # the governance's clock (the trail's times), on every replay
        SglangGovernance, "open", classmethod(lambda cls, **kw: opened(cls, **kw, clock=clock))
    )
    monkeypatch.setattr(SglangGovernance, "fold_own_reuse", fold)
    # decision ids and refusal ids are random: the same numbers in both replays, in order
    names = itertools.count(1)
    monkeypatch.setattr(engine, "new_decision_id", lambda n=names: str(uuid.UUID(int=next(n))))
    monkeypatch.setattr(refusal.uuid, "uuid4", lambda n=names: uuid.UUID(int=next(n)))
    environ = {
        "KVGOV_AUDIT_URL": url,
        "KVGOV_WORKER_ID": "sglang-0",
        "KVGOV_POLICY_DATA": json.dumps(POLICY),
    }
    cache, alloc, kv = _build(True, tmp_path / f"fold-{fold}", environ)
    return _workload(cache, alloc, kv, clock)


def test_both_layouts_answer_every_query_the_same(
    two_urls: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers, stored, folded_ids, hits = {}, {}, {}, {}
    for fold, url in zip((False, True), two_urls, strict=True):
        (tmp_path / f"fold-{fold}").mkdir()
        hits[fold] = _replay(url, fold, tmp_path, monkeypatch)
        monkeypatch.undo()
        assert verify(url).ok
        answers[fold] = {
            **_api(url, tmp_path),
            **commands(url, tmp_path, TENANTS, WINDOW, prefix="cli "),
        }
        stored[fold], folded_ids[fold] = _stored(url)
    separate, folded = answers[False], answers[True]
    # the workload reaches what the layouts differ on, and what they must not
    counts = separate["counts type"]
    assert counts["reuse"] >= 8 and counts["cross_tenant_reuse"] >= 1
    assert counts["policy_denied"] >= 2 and counts["erasure"] == 1
    assert counts["zeroization"] >= 2
    assert hits[True] == hits[False] and all(hits[False].values())  # counters unchanged
    # the folded trail holds one row fewer per folded reuse, and nothing else differs
    assert stored[False] == counts and folded_ids[False] == []
    folds = set(folded_ids[True])
    assert len(folds) == stored[False]["reuse"] - stored[True]["reuse"] >= 6
    assert {**stored[True], "reuse": stored[False]["reuse"]} == stored[False]
    # an answer that lists no folded admission is the same, as it is: every count, and
    # every reuse, erasure and denial query
    identical = {n for n in separate if not _lists_folded_admission(separate[n], folds)}
    for name in separate:
        if name.removeprefix("cli ").split()[0] in ("reuse", "erasure", "denials", "counts"):
            assert name in identical, name
        if name.startswith(
            ("cli count-by", "events reuse", "events cross_tenant_reuse", "iter reuse")
        ):
            assert name in identical, name
    for name in identical:
        assert folded[name] == separate[name], name
    # the others differ, and only in the folded admissions' block ids and reused tokens
    assert len(identical) < len(separate)
    for name in set(separate) - identical:
        assert folded[name] != separate[name], name
        assert _as_separate(folded[name], folds) == separate[name], name


def _lists_folded_admission(value: Any, folded: set[str]) -> bool:
    if isinstance(value, list):
        return any(_lists_folded_admission(v, folded) for v in value)
    if isinstance(value, dict):
        if value.get("type") == "admission" and value.get("sequence_id") in folded:
            return True
        return any(_lists_folded_admission(v, folded) for v in value.values())
    return False


# ---------------------------------------------------------------- the fold's guarantees


def _rows(cache: Any, url: str) -> list[tuple[Any, ...]]:
    """Every stored row's type, request id, block ids, reused tokens and details."""
    cache.kvgov.gov.audit.flush()
    eng = create_engine(url)
    try:
        with eng.connect() as conn:
            sql = "SELECT type, sequence_id, block_ids, reused_tokens, details FROM audit_events"
            rows = conn.execute(text(sql + " ORDER BY seq")).all()
    finally:
        eng.dispose()
    return [
        (kind, seq_id, _json(ids), reused, _json(details))
        for kind, seq_id, ids, reused, details in rows
    ]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _match(cache: Any, req: Any) -> Any:
    toks = array("q", req.origin_input_ids)
    key = RadixKey(toks, None, limit=len(toks) - 1)
    return cache.match_prefix(MatchPrefixParams(key=key, req=req))


@pytest.fixture()
def warm(tmp_path: Path) -> Iterator[tuple[Any, str, list[int]]]:
    """A governed cache holding acme's pages of one prompt; the pages a hit finds."""
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, alloc, kv = _build(True, tmp_path)
    try:
        first = _req(0, "acme", _prompt(0))
        _drive_checkpoint(cache, alloc, kv, [first])
        toks = array("q", first.origin_input_ids)
        m = cache.match_prefix(
            MatchPrefixParams(key=RadixKey(toks, first.extra_key, limit=len(toks) - 1))
        )
        slots = cache.path_device_indices(m.last_device_node)[: m.device_prefix_len : PAGE]
        yield cache, url, [s // PAGE for s in slots.tolist()]
    finally:
        cache.kvgov_close()


def test_a_folded_admission_is_written_before_the_match_returns(
    warm: tuple[Any, str, list[int]],
) -> None:
    cache, url, pages = warm
    req = _req(1, "acme", _prompt(0))
    assert _match(cache, req).device_prefix_len == 19 * PAGE == len(pages) * PAGE
    # one row, the admission, holding the reuse: the hit's pages and tokens
    assert _rows(cache, url)[1:] == [
        (
            "admission",
            "r1",
            pages,
            19 * PAGE,
            {
                **_rows(cache, url)[0][4],
                OWN_REUSE_KEY: {"blocks": 19, "reused_tokens": 19 * PAGE},
            },
        )
    ]
    counters = cache.kvgov.gov.ledger.counters["acme"]
    assert counters.requests == 2 and counters.hit_tokens == 19 * PAGE
    _match(cache, req)  # the scheduler matches a waiting request again: nothing new
    assert len(_rows(cache, url)) == 2 and counters.hit_tokens == 19 * PAGE
    with AuditQueries(url) as q:
        (reuse,) = q.reuse("acme")
    assert (reuse.sequence_id, reuse.reused_tokens, list(reuse.block_ids)) == (
        "r1",
        19 * PAGE,
        pages,
    )


def test_a_hit_with_an_unowned_page_is_not_folded_and_is_refused(
    warm: tuple[Any, str, list[int]],
) -> None:
    """The admission is written as without a hit, then the hit is judged apart: a page
    without an owner refuses it, and a refused hit records no reuse and counts no hit
    tokens (the owned pages before the unowned one were once audited as reused)."""
    cache, url, pages = warm
    cache.kvgov.gov.ledger.owners.table[pages[5]] = None
    counters = cache.kvgov.gov.ledger.counters["acme"]
    hit_tokens = counters.hit_tokens
    assert _match(cache, _req(1, "acme", _prompt(0))).device_prefix_len == 0
    rows = _rows(cache, url)
    (kind, seq_id, ids, reused, details) = rows[1]
    assert (kind, seq_id, ids, reused) == ("admission", "r1", [], 0)
    assert OWN_REUSE_KEY not in details
    assert [row[:2] for row in rows[2:]] == []
    assert counters.hit_tokens == hit_tokens


def test_the_admission_is_written_when_the_match_fails(
    warm: tuple[Any, str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    cache, url, _ = warm

    def broken(self: Any, params: Any) -> Any:
        raise RuntimeError("the tree failed")

    monkeypatch.setattr(UnifiedRadixCache, "match_prefix", broken)
    with pytest.raises(RuntimeError, match="the tree failed"):
        _match(cache, _req(1, "acme", _prompt(0)))
    (kind, seq_id, ids, reused, details) = _rows(cache, url)[-1]
    assert (kind, seq_id, ids, reused) == ("admission", "r1", [], 0)
    assert OWN_REUSE_KEY not in details


def test_an_admission_that_cannot_be_written_refuses_the_request(
    warm: tuple[Any, str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when it is written at admission: refused, audited, a private namespace."""
    from kvgov.exceptions import AuditUnavailable

    cache, url, _ = warm
    audit = cache.kvgov.gov.audit
    record = audit.record

    def failing(event: Any) -> str:
        if event.type == "admission":
            raise AuditUnavailable("the audit queue is full")
        return str(record(event))

    monkeypatch.setattr(audit, "record", failing)
    req = _req(1, "acme", _prompt(0))
    assert _match(cache, req).device_prefix_len == 0
    assert req.extra_key.startswith("kvgov1:private:") and req._kvgov_admitted.view is None
    monkeypatch.undo()
    (kind, seq_id, _ids, _reused, details) = _rows(cache, url)[-1]
    assert (kind, seq_id, details["path"]) == ("policy_denied", "r1", "kvgov.sglang/error")
    assert _match(cache, req).device_prefix_len == 0  # its namespace holds nothing
    assert cache.kvgov.gov.ledger.counters["acme"].hit_tokens == 0
