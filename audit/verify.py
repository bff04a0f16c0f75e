"""Verification: recompute every chain, check every checkpoint, report the first bad event.

What a run detects, per stream (details and limits in docs/audit.md):

* an edited field of any stored event (its recomputed hash differs);
* a deleted event (a gap in ``seq`` and a broken ``prev_hash`` link);
* an inserted event or two events swapped (broken links and hash mismatches,
  since ``seq`` and ``prev_hash`` are hashed);
* a rewritten chain (every hash recomputed by the attacker): the signed checkpoints
  no longer match;
* events cut off before the last checkpoint (a checkpoint names a ``seq`` beyond the
  last stored event);
* a forged, altered or unknown-key checkpoint signature.

What it cannot detect from the database alone: events removed (or forged events
appended) after the last checkpoint, together with every later checkpoint; compare
the latest checkpoint with a copy kept elsewhere (``kvgov audit checkpoints``) for that.

The hot path reads raw driver rows (no ORM objects) through a server-side cursor on
PostgreSQL, in ``(stream, seq)`` order along the unique index.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Connection, select
from sqlalchemy.engine import URL

from audit.chain import CANONICAL_VERSION, GENESIS_HASH, ChainHash, canonical_json, fast_json
from audit.models import EVENT_INSERT_COLUMNS, AuditCheckpoint, AuditKey
from audit.signing import checkpoint_message, key_id, public_key_from_raw, verify_signature
from audit.store import open_engine

__all__ = ["Problem", "StreamReport", "VerifyReport", "verify"]

#: Problems kept per stream after the first one (the first bad event is always kept).
MAX_PROBLEMS_PER_STREAM: Final = 100
#: Rows fetched per round trip.
FETCH_ROWS: Final = 10_000
#: Show a progress bar (when asked) only above this many events.
PROGRESS_MIN_EVENTS: Final = 100_000

_COLS = ", ".join(EVENT_INSERT_COLUMNS)


@dataclass(frozen=True, slots=True)
class Problem:
    """One integrity failure.

    Attributes:
        stream: the stream.
        seq: the event (or checkpoint) sequence number where it shows.
        kind: ``hash_mismatch``, ``broken_link``, ``seq_gap``, ``seq_order``,
            ``checkpoint_mismatch``, ``checkpoint_beyond_end``, ``bad_signature``,
            ``unknown_key`` or ``untrusted_key``.
        message: what was found and what it means.
    """

    stream: str
    seq: int
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class StreamReport:
    """Verification result of one stream.

    Attributes:
        stream: the stream id.
        events: events read.
        last_seq: the last sequence number stored (0 when none).
        head_hash: hex chain hash of the last event.
        checkpoints: checkpoints checked.
        last_checkpoint_seq: highest checkpointed seq (0 when none).
        untrusted_checkpoints: valid checkpoints signed by a key the caller did not
            pass as trusted (only keys self-recorded in ``audit_keys``).
        problems: integrity failures, first bad event first (at most
            ``MAX_PROBLEMS_PER_STREAM`` + 1).
    """

    stream: str
    events: int
    last_seq: int
    head_hash: str
    checkpoints: int
    last_checkpoint_seq: int
    untrusted_checkpoints: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        """No integrity failure in this stream."""
        return not self.problems

    @property
    def first_bad(self) -> Problem | None:
        """The first problem found in ``seq`` order, or None."""
        return self.problems[0] if self.problems else None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Verification result of a whole audit database.

    Attributes:
        streams: one report per stream, sorted by stream id.
        events: events read.
        checkpoints: checkpoints checked.
        seconds: wall time of the run.
        trusted_keys: ids of the public keys the caller passed as trusted.
    """

    streams: tuple[StreamReport, ...]
    events: int
    checkpoints: int
    seconds: float
    trusted_keys: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Every chain and every checkpoint verified."""
        return all(s.ok for s in self.streams)

    @property
    def untrusted_checkpoints(self) -> int:
        """Checkpoints whose signature is only backed by a self-recorded key."""
        return sum(s.untrusted_checkpoints for s in self.streams)

    @property
    def problems(self) -> tuple[Problem, ...]:
        """All problems, stream by stream."""
        return tuple(p for s in self.streams for p in s.problems)


def _pg_canonical(text: str) -> str:
    """Re-encode JSONB text canonically (JSONB adds spaces and reorders keys)."""
    if '"' not in text:  # numbers, arrays, {}: no keys, no strings; only spacing differs
        return text.replace(" ", "")
    return canonical_json(json.loads(text))


class _StreamCheck:
    """Running state while one stream's rows go by."""

    __slots__ = ("cps", "cps_checked", "events", "expect", "problems", "running", "stream")

    def __init__(self, stream: str, cps: dict[int, bytes]) -> None:
        self.stream = stream
        self.cps = cps
        self.expect = 1
        self.running: bytes = GENESIS_HASH
        self.events = 0
        self.cps_checked = 0
        self.problems: list[Problem] = []

    def add(self, seq: int, kind: str, message: str) -> None:
        if len(self.problems) <= MAX_PROBLEMS_PER_STREAM:
            self.problems.append(Problem(self.stream, seq, kind, message))


def _rows(conn: Connection) -> Iterator[tuple[Any, ...]]:
    raw: Any = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        cols = _COLS.replace("block_ids", "block_ids::text").replace("details", "details::text")
        with raw.cursor(name="kvgov_verify") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(f"SELECT {cols} FROM audit_events ORDER BY stream, seq")
            while batch := cur.fetchmany(FETCH_ROWS):
                yield from batch
        return
    cur = raw.cursor()
    try:
        cur.execute(f"SELECT {_COLS} FROM audit_events ORDER BY stream, seq")
        while batch := cur.fetchmany(FETCH_ROWS):
            yield from batch
    finally:
        cur.close()


def verify(
    url: str | URL,
    public_keys: Iterable[Ed25519PublicKey] | None = None,
    progress: bool = False,
) -> VerifyReport:
    """Recompute every chain and check every checkpoint of an audit database.

    Args:
        url: the audit database URL.
        public_keys: trusted checkpoint keys. When given, a checkpoint signed by any
            other key is a problem. When None, signatures are checked against the keys
            writers recorded in ``audit_keys`` and counted as untrusted.
        progress: show a rich progress bar on large logs.

    Returns:
        The report; ``report.ok`` is False on any integrity failure.

    Raises:
        AuditSchemaError: the database is not at the head revision.
    """
    started = time.perf_counter()
    trusted = {key_id(k): k for k in public_keys} if public_keys is not None else None
    engine = open_engine(url, auto_upgrade=False)
    try:
        with engine.connect() as conn:
            recorded = {
                r.key_id: r.public_key
                for r in conn.execute(select(AuditKey.key_id, AuditKey.public_key))
            }
            cp_rows = conn.execute(
                select(
                    AuditCheckpoint.stream,
                    AuditCheckpoint.seq,
                    AuditCheckpoint.chain_hash,
                    AuditCheckpoint.signature,
                    AuditCheckpoint.key_id,
                ).order_by(AuditCheckpoint.stream, AuditCheckpoint.seq)
            ).all()
            total = 0
            if progress:
                total = int(conn.exec_driver_sql("SELECT count(*) FROM audit_events").scalar_one())
            streams = _check_chains(conn, cp_rows, total if total >= PROGRESS_MIN_EVENTS else 0)
    finally:
        engine.dispose()

    # signatures (few rows; done after the scan)
    sig_problems: dict[str, list[Problem]] = {}
    untrusted: dict[str, int] = {}
    for stream, seq, chain, sig, kid in cp_rows:
        msg = checkpoint_message(stream, int(seq), ChainHash(bytes(chain)))
        out = sig_problems.setdefault(stream, [])
        if trusted is not None:
            pub = trusted.get(kid)
            if pub is None:
                kind = "untrusted_key" if kid in recorded else "unknown_key"
                out.append(
                    Problem(stream, seq, kind, f"checkpoint signed by key {kid}, not a trusted key")
                )
                continue
        else:
            raw = recorded.get(kid)
            if raw is None:
                out.append(
                    Problem(stream, seq, "unknown_key", f"checkpoint key {kid} is not recorded")
                )
                continue
            pub = public_key_from_raw(bytes(raw))
            untrusted[stream] = untrusted.get(stream, 0) + 1
        if not verify_signature(pub, bytes(sig), msg):
            out.append(
                Problem(stream, seq, "bad_signature", f"checkpoint signature by {kid} is invalid")
            )

    reports = []
    for name in sorted(streams):
        st = streams[name]
        problems = st.problems + sig_problems.get(name, [])
        problems.sort(key=lambda p: p.seq)
        reports.append(
            StreamReport(
                stream=name,
                events=st.events,
                last_seq=st.expect - 1,
                head_hash=st.running.hex(),
                checkpoints=len(st.cps),
                last_checkpoint_seq=max(st.cps, default=0),
                untrusted_checkpoints=untrusted.get(name, 0),
                problems=tuple(problems),
            )
        )
    return VerifyReport(
        streams=tuple(reports),
        events=sum(r.events for r in reports),
        checkpoints=len(cp_rows),
        seconds=time.perf_counter() - started,
        trusted_keys=tuple(sorted(trusted)) if trusted is not None else (),
    )


def _check_chains(
    conn: Connection, cp_rows: Sequence[Any], progress_total: int
) -> dict[str, _StreamCheck]:
    cps_by_stream: dict[str, dict[int, bytes]] = {}
    for stream, seq, chain, _sig, _kid in cp_rows:
        cps_by_stream.setdefault(stream, {})[int(seq)] = bytes(chain)
    streams: dict[str, _StreamCheck] = {}
    pg = conn.dialect.name == "postgresql"
    encode = fast_json
    sha256 = hashlib.sha256
    version = (CANONICAL_VERSION,)
    st: _StreamCheck | None = None
    bar = None
    task = None
    if progress_total:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("verifying audit chains", total=progress_total)
    try:
        for row in _rows(conn):
            stream = row[0]
            if st is None or stream != st.stream:
                st = streams[stream] = _StreamCheck(stream, cps_by_stream.get(stream, {}))
            seq = row[1]
            bids, det, prev, stored = row[19], row[20], row[21], row[22]
            if pg:
                bids, det = _pg_canonical(bids), _pg_canonical(det)
            text = encode(version + row[:19])
            h = sha256(st.running + f"{text[:-1]},{bids},{det}]".encode()).digest()
            if h != stored:
                _diagnose(st, seq, bytes(prev), bytes(stored))
            elif seq != st.expect:  # consistent hash but wrong position: cannot happen
                st.add(seq, "seq_order", f"expected seq {st.expect}, found {seq}")
            cp = st.cps.get(seq)
            if cp is not None and cp != h:
                st.add(seq, "checkpoint_mismatch", "signed checkpoint does not match the chain")
            st.running = stored if h != stored else h
            st.expect = seq + 1
            st.events += 1
            if bar is not None and task is not None and st.events % FETCH_ROWS == 0:
                bar.advance(task, FETCH_ROWS)
    finally:
        if bar is not None:
            bar.stop()
    for stream, cps in cps_by_stream.items():
        st = streams.get(stream)
        if st is None:
            st = streams[stream] = _StreamCheck(stream, cps)
        last = st.expect - 1
        beyond = [s for s in cps if s > last]
        if beyond:
            st.add(
                min(beyond),
                "checkpoint_beyond_end",
                f"a checkpoint covers seq {max(beyond)} but events end at {last}: "
                f"events {last + 1}..{max(beyond)} were removed",
            )
    return streams


def _diagnose(st: _StreamCheck, seq: int, prev: bytes, stored: bytes) -> None:
    if seq > st.expect:
        st.add(
            seq,
            "seq_gap",
            f"events {st.expect}..{seq - 1} are missing (deleted) before seq {seq}",
        )
    elif seq < st.expect:
        st.add(seq, "seq_order", f"seq {seq} appears after seq {st.expect - 1}")
    elif prev != st.running:
        st.add(seq, "broken_link", "prev_hash does not match the previous event's hash")
    else:
        st.add(seq, "hash_mismatch", "event content does not match its hash (edited)")
