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
* an edited ``prev_hash`` column (it must equal the previous event's hash);
* a forged, altered or unknown-key checkpoint signature;
* with ``require_checkpoints``: a stream no signed checkpoint covers, or whose events
  after its last signed checkpoint exceed ``max_unsigned_events`` or span more than
  ``max_unsigned_seconds`` (checkpoints deleted, history rewritten, events appended);
* with ``expected`` (a signed list, :mod:`kvgov.audit.expect`): a stream forged whole,
  deleted whole, or cut or rewritten before the head the list pins.

What it cannot detect from the database alone: events removed (or forged events
appended) after the last checkpoint, together with every later checkpoint, within
the unsigned tail the caller allows; see docs/audit.md for exactly what each mode proves.

Each row is recomputed in its own chain format (its ``chain_format`` column; see
:mod:`kvgov.audit.chain`), so a trail written before format 2, and a stream that goes on
in format 2 after it, verify; the format's tag is hashed, so a flipped column shows as
an edited event, and an unknown format as ``unknown_format``.

The hot path reads raw driver rows (no ORM objects) through a server-side cursor on
PostgreSQL, in ``(stream, seq)`` order along the unique index.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Connection, func, select
from sqlalchemy.engine import URL

from kvgov.audit.chain import FORMATS, GENESIS_HASH, ChainHash, canonical_prefix
from kvgov.audit.expect import ExpectedStreams, expected_problems
from kvgov.audit.models import EVENT_INSERT_COLUMNS, AuditCheckpoint, AuditEventRow, AuditKey
from kvgov.audit.signing import checkpoint_message, key_id, public_key_from_raw, verify_signature
from kvgov.audit.store import open_engine
from kvgov.defaults import VERIFY_MAX_UNSIGNED_EVENTS, VERIFY_MAX_UNSIGNED_SECONDS
from kvgov.exceptions import SigningKeyError

__all__ = ["Problem", "StreamReport", "VerifyReport", "verify"]

#: Problems kept per stream after the first one (the first bad event is always kept).
MAX_PROBLEMS_PER_STREAM: Final = 100
#: Rows fetched per round trip.
FETCH_ROWS: Final = 10_000
#: Show a progress bar (when asked) only above this many events.
PROGRESS_MIN_EVENTS: Final = 100_000

#: The hashed scalar columns after ``stream`` (the scan's filter): ``seq`` .. ``policy_revision``.
_HEAD_COLS: Final = EVENT_INSERT_COLUMNS[1:19]
#: What SQLite returns per event: the head as JSON, rendered by SQLite's ``json_array``
#: (no Python object per column): format 2's text; see :func:`_ascii_head` for format 1.
_SQLITE_SCAN: Final = (
    f"SELECT seq, json_array({', '.join(_HEAD_COLS)}), block_ids, details, prev_hash, hash, "
    "chain_format FROM audit_events WHERE stream = ? ORDER BY seq"
)
#: Any other database: the columns, the head encoded by its format's ``head_json``.
_SCAN_COLS: Final = (*_HEAD_COLS, "block_ids", "details", "prev_hash", "hash", "chain_format")
#: Characters the canonical form escapes and SQLite's JSON keeps as they are.
_NOT_CANONICAL: Final = re.compile(r"[^\x00-\x7e]")


@dataclass(frozen=True, slots=True)
class Problem:
    """One integrity failure.

    Attributes:
        stream: the stream.
        seq: the event (or checkpoint) sequence number where it shows.
        kind: ``hash_mismatch``, ``unknown_format``, ``wrong_type``, ``broken_link``, ``seq_gap``,
            ``seq_order``, ``checkpoint_mismatch``, ``checkpoint_beyond_end``, ``bad_signature``,
            ``unknown_key``, ``untrusted_key``; with ``require_checkpoints``
            ``no_checkpoint`` or ``unsigned_tail``; with ``expected``
            ``unexpected_stream``, ``missing_stream``, ``expected_beyond_end`` or
            ``expected_mismatch``.
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


def _pg_canonical(text: str, chain_format: Any) -> str:
    """Re-encode JSONB text in a row's format (JSONB adds spaces and reorders keys).

    What cannot be re-encoded (a number format 2 never writes, an unknown format) gives
    text no writer hashed, so the event shows as edited.
    """
    if '"' not in text:  # numbers, arrays, {}: no keys, no strings; only spacing differs
        return text.replace(" ", "")
    fmt = FORMATS.get(chain_format)
    try:
        return fmt.json(fmt.load(text)) if fmt is not None else text
    except ValueError:
        return f"[not format {chain_format}]"


class _StreamCheck:
    """Running state while one stream's rows go by."""

    __slots__ = (
        "bad_cps",
        "cps",
        "events",
        "expect",
        "last_time",
        "problems",
        "running",
        "stream",
        "times",
    )

    def __init__(self, stream: str, cps: dict[int, bytes]) -> None:
        self.stream = stream
        self.cps = cps
        self.expect = 1
        self.running: bytes = GENESIS_HASH
        self.events = 0
        self.problems: list[Problem] = []
        self.bad_cps: set[int] = set()  # checkpoints whose chain hash does not match
        self.times: dict[int, int] = {}  # time_us of checkpointed events (and of seq 1)
        self.last_time = 0  # time_us of the last event

    def add(self, seq: int, kind: str, message: str) -> None:
        if len(self.problems) <= MAX_PROBLEMS_PER_STREAM:
            self.problems.append(Problem(self.stream, seq, kind, message))


def _streams(conn: Connection) -> Iterator[str]:
    """Every stream id, in order: one index lookup per stream, not a scan of every row."""
    last = conn.execute(select(func.min(AuditEventRow.stream))).scalar()
    while last is not None:
        yield last
        last = conn.execute(
            select(func.min(AuditEventRow.stream)).where(AuditEventRow.stream > last)
        ).scalar()


#: One event as the hot loop reads it: seq, head JSON (``[seq, ..., policy_revision]``),
#: block_ids JSON, details JSON, stored prev_hash, stored hash, chain_format.
_ScanRow = tuple[int, str, str, str, bytes, bytes, Any]


def _batches(conn: Connection, stream: str, *, sqlite_json: bool) -> Iterator[list[_ScanRow]]:
    """One stream's rows in ``seq`` order, in batches (raw driver rows, no ORM objects).

    Args:
        conn: the connection.
        stream: the stream.
        sqlite_json: on SQLite, let ``json_array`` render the head (False: encode the
            columns in Python, for a database whose values ``json_array`` refuses).
    """
    raw: Any = conn.connection.driver_connection
    if sqlite_json and isinstance(raw, sqlite3.Connection):
        cur = raw.cursor()
        try:
            cur.execute(_SQLITE_SCAN, (stream,))
            while batch := cur.fetchmany(FETCH_ROWS):
                yield batch
        finally:
            cur.close()
        return
    n = len(_HEAD_COLS)
    for rows in _column_batches(conn, stream):
        if conn.dialect.name == "postgresql":  # JSONB text adds spaces and reorders keys
            yield [_pg_row(r, n) for r in rows]
        else:
            yield [(r[0], _head_json(r[:n], r[n + 4]), *r[n : n + 5]) for r in rows]


def _pg_row(r: tuple[Any, ...], n: int) -> _ScanRow:
    number = r[n + 4]
    bids, det = _pg_canonical(r[n], number), _pg_canonical(r[n + 1], number)
    return (r[0], _head_json(r[:n], number), bids, det, r[n + 2], r[n + 3], number)


def _head_json(values: tuple[Any, ...], chain_format: Any) -> str:
    """The head's JSON in the row's format (format 1's for an unknown one: it fails anyway)."""
    try:
        return FORMATS.get(chain_format, FORMATS[1]).head_json(values)
    except TypeError:  # a value JSON cannot hold (a BLOB written into a text column)
        return "[not JSON]"  # never a canonical head, so the event shows as edited


def _column_batches(conn: Connection, stream: str) -> Iterator[list[tuple[Any, ...]]]:
    raw: Any = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        cols = ", ".join(f"{c}::text" if c in ("block_ids", "details") else c for c in _SCAN_COLS)
        sql = f"SELECT {cols} FROM audit_events WHERE stream = %s ORDER BY seq"
        with raw.cursor(name="kvgov_verify") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(sql, (stream,))
            while batch := cur.fetchmany(FETCH_ROWS):
                yield batch
        return
    cur = raw.cursor()
    try:
        cur.execute(
            f"SELECT {', '.join(_SCAN_COLS)} FROM audit_events WHERE stream = ? ORDER BY seq",
            (stream,),
        )
        while batch := cur.fetchmany(FETCH_ROWS):
            yield batch
    finally:
        cur.close()


def _ascii_head(head: str) -> str:
    r"""Escape what SQLite's JSON leaves raw: every character above ``~`` as ``\uXXXX``.

    SQLite's ``json_array`` escapes quotes, backslashes and control characters exactly
    as both formats do (``\b \t \n \f \r``, else ``\u00xx``), and writes integers, NULL
    and text the same way; it keeps non-ASCII characters (and DEL) raw, as format 2
    (RFC 8785) does and format 1 does not: format 1 escapes them (UTF-16 surrogate pairs
    above U+FFFF, like Python's ``json``), which this does.
    """
    return _NOT_CANONICAL.sub(lambda m: json.dumps(m.group())[1:-1], head)


def verify(
    url: str | URL,
    public_keys: Iterable[Ed25519PublicKey] | None = None,
    progress: bool = False,
    *,
    require_checkpoints: bool = False,
    max_unsigned_events: int = VERIFY_MAX_UNSIGNED_EVENTS,
    max_unsigned_seconds: float = VERIFY_MAX_UNSIGNED_SECONDS,
    expected: ExpectedStreams | None = None,
) -> VerifyReport:
    """Recompute every chain and check every checkpoint of an audit database.

    Args:
        url: the audit database URL.
        public_keys: trusted checkpoint keys. When given, a checkpoint signed by any
            other key is a problem. When None, signatures are checked against the keys
            writers recorded in ``audit_keys`` and counted as untrusted.
        progress: show a rich progress bar on large logs.
        require_checkpoints: every stream must be covered by a signed checkpoint (by a
            trusted key when ``public_keys`` is given) and hold at most
            ``max_unsigned_events`` events, spanning at most ``max_unsigned_seconds``
            of event time, after its last one.
        max_unsigned_events: see ``require_checkpoints``.
        max_unsigned_seconds: see ``require_checkpoints``.
        expected: a signed list of the streams that must exist (already verified, by
            :func:`kvgov.audit.expect.load_expected_streams`).

    Returns:
        The report; ``report.ok`` is False on any integrity failure.

    Raises:
        AuditSchemaError: the database is not at the head revision.
    """
    started = time.perf_counter()
    trusted = {key_id(k): k for k in public_keys} if public_keys is not None else None
    engine = open_engine(url, read_only=True)
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
            cp_rows, cp_wrong = _typed_checkpoints(cp_rows)
            total = 0
            if progress:
                total = int(conn.exec_driver_sql("SELECT count(*) FROM audit_events").scalar_one())
            streams = _check_chains(conn, cp_rows, total if total >= PROGRESS_MIN_EVENTS else 0)
            for name, seq, message in cp_wrong:
                streams.setdefault(name, _StreamCheck(name, {})).add(seq, "wrong_type", message)
            if expected is not None:
                lasts = {name: st.expect - 1 for name, st in streams.items()}
                for name, found in expected_problems(conn, expected, lasts).items():
                    st = streams.setdefault(name, _StreamCheck(name, {}))
                    for seq, kind, message in found:
                        st.add(seq, kind, message)
    finally:
        engine.dispose()

    sig_problems, untrusted = _signature_problems(cp_rows, trusted, recorded)
    reports = []
    for name in sorted(streams):
        st = streams[name]
        problems = st.problems + sig_problems.get(name, [])
        if require_checkpoints:
            signed = set(st.cps) - st.bad_cps - {p.seq for p in sig_problems.get(name, [])}
            problems += _tail_problems(st, signed, max_unsigned_events, max_unsigned_seconds)
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


def _signature_problems(
    cp_rows: Sequence[Any],
    trusted: dict[str, Ed25519PublicKey] | None,
    recorded: dict[str, bytes],
) -> tuple[dict[str, list[Problem]], dict[str, int]]:
    """Check every checkpoint's signature (few rows; done after the scan)."""
    problems: dict[str, list[Problem]] = {}
    untrusted: dict[str, int] = {}
    for stream, seq, chain, sig, kid in cp_rows:
        msg = checkpoint_message(stream, int(seq), ChainHash(bytes(chain)))
        out = problems.setdefault(stream, [])
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
            try:
                if type(raw) is not bytes:
                    raise SigningKeyError(f"{_sql_type(raw)}, not a BLOB")
                pub = public_key_from_raw(raw)
            except SigningKeyError as exc:
                out.append(
                    Problem(stream, seq, "wrong_type", f"recorded key {kid} is {exc}: the "
                            "audit_keys row was edited")
                )  # fmt: skip
                continue
            untrusted[stream] = untrusted.get(stream, 0) + 1
        if not verify_signature(pub, bytes(sig), msg):
            out.append(
                Problem(stream, seq, "bad_signature", f"checkpoint signature by {kid} is invalid")
            )
    return problems, untrusted


def _tail_problems(
    st: _StreamCheck, signed: set[int], max_events: int, max_seconds: float
) -> list[Problem]:
    """``require_checkpoints``: the stream must end within bounds of a signed checkpoint."""
    last = st.expect - 1
    covering = [s for s in signed if s <= last]
    if not covering:
        return [
            Problem(
                st.stream,
                last,
                "no_checkpoint",
                "no valid signed checkpoint covers this stream: it was forged, or its "
                "checkpoints were deleted",
            )
        ]
    cp = max(covering)
    events = last - cp
    since = st.times.get(cp if cp else 1, st.last_time)
    seconds = (st.last_time - since) / 1_000_000
    if events > max_events or seconds > max_seconds:
        return [
            Problem(
                st.stream,
                last,
                "unsigned_tail",
                f"{events} event(s) spanning {seconds:.0f} s follow the last signed checkpoint "
                f"(seq {cp}); at most {max_events} and {max_seconds:g} s are allowed: events "
                "were appended, or later checkpoints deleted",
            )
        ]
    return []


def _check_chains(
    conn: Connection, cp_rows: Sequence[Any], progress_total: int
) -> dict[str, _StreamCheck]:
    cps_by_stream: dict[str, dict[int, bytes]] = {}
    for stream, seq, chain, _sig, _kid in cp_rows:
        cps_by_stream.setdefault(stream, {})[int(seq)] = bytes(chain)
    streams: dict[str, _StreamCheck] = {}
    bar = None
    task = None
    if progress_total:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("verifying audit chains", total=progress_total)
    try:
        for stream in _streams(conn):
            if type(stream) is not str:  # a BLOB (SQLite stores one in any column)
                name = _stream_name(stream)
                streams[name] = _wrong_stream(conn, stream, name)
                continue
            try:
                st = _check_stream(conn, stream, cps_by_stream, bar, task, sqlite_json=True)
            except sqlite3.OperationalError:  # json_array refused a value (a BLOB)
                st = _check_stream(conn, stream, cps_by_stream, bar, task, sqlite_json=False)
            streams[stream] = st
    finally:
        if bar is not None:
            bar.stop()
    for stream, cps in cps_by_stream.items():
        if stream not in streams:
            streams[stream] = _StreamCheck(stream, cps)
        st = streams[stream]
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


def _stream_name(stream: object) -> str:
    """A stream id as reports show it (``repr`` of a value that is not text)."""
    return stream if isinstance(stream, str) else repr(stream)


def _wrong_stream(conn: Connection, stream: object, name: str) -> _StreamCheck:
    """The events whose ``stream`` column is not text: each one is edited; none is hashed."""
    st = _StreamCheck(name, {})
    st.events = int(
        conn.execute(
            select(func.count()).select_from(AuditEventRow).where(AuditEventRow.stream == stream)
        ).scalar_one()
    )
    st.add(0, "wrong_type", f"{st.events} event(s) whose {_wrong_types(('stream', stream))}")
    return st


def _typed_checkpoints(
    rows: Sequence[Any],
) -> tuple[list[Any], list[tuple[str, int, str]]]:
    """Split checkpoint rows into well-typed ones and ``(stream, seq, message)`` of the rest."""
    good, wrong = [], []
    for row in rows:
        stream, seq, chain, sig, kid = row
        cols = (("stream", stream), ("seq", seq), ("chain_hash", chain), ("signature", sig))
        if _well_typed(*cols, ("key_id", kid)):
            good.append(row)
        else:
            at = seq if type(seq) is int else 0
            wrong.append(
                (_stream_name(stream), at, f"checkpoint {_wrong_types(*cols, ('key_id', kid))}")
            )
    return good, wrong


def _check_stream(
    conn: Connection,
    stream: str,
    cps_by_stream: dict[str, dict[int, bytes]],
    bar: Any,
    task: Any,
    *,
    sqlite_json: bool,
) -> _StreamCheck:
    st = _StreamCheck(stream, cps_by_stream.get(stream, {}))
    for batch in _batches(conn, stream, sqlite_json=sqlite_json):
        _check_batch(st, batch)
        if bar is not None:
            bar.advance(task, len(batch))
    return st


def _check_batch(st: _StreamCheck, batch: list[_ScanRow]) -> None:
    """Recompute the hashes of one batch of a stream's rows (the verifier's hot loop).

    Layout in :mod:`kvgov.audit.chain`: the stream's prefix in the row's format, the
    head JSON without its brackets, then ``,block_ids,details]``, as UTF-8 (format 1's
    text is ASCII).
    """
    sha256 = hashlib.sha256
    prefixes = {number: canonical_prefix(st.stream, number) for number in FORMATS}
    cps = st.cps
    running, expect = st.running, st.expect
    for seq, head, bids, det, prev, stored, number in batch:
        if type(seq) is not int or type(stored) is not bytes or type(prev) is not bytes:
            st.running, st.expect = running, expect
            at = seq if type(seq) is int else expect
            st.add(
                at, "wrong_type", _wrong_types(("seq", seq), ("prev_hash", prev), ("hash", stored))
            )
            if at == seq:  # go on from the last good hash: what is stored here is no hash
                expect = at + 1
            continue
        prefix = prefixes.get(number)
        if prefix is not None:
            if number == 1 and (not head.isascii() or "\x7f" in head):
                head = _ascii_head(head)
            text = f"{prefix}{head[1:-1]},{bids},{det}]"
            h = sha256(running + text.encode("utf-8", "surrogatepass")).digest()
        else:
            h = b""
        if h != stored:
            st.running, st.expect = running, expect
            if prefix is None:
                st.add(
                    seq,
                    "unknown_format",
                    f"chain_format {number!r} is no format this kvgov knows "
                    f"({', '.join(map(str, FORMATS))}): the row was edited",
                )
            else:
                _diagnose(st, seq, bytes(prev))
        elif seq != expect:  # consistent hash but wrong position: cannot happen
            st.add(seq, "seq_order", f"expected seq {expect}, found {seq}")
        elif prev != running:  # the hash holds, so only the prev_hash column was edited
            st.add(seq, "broken_link", "stored prev_hash is not the previous event's hash")
        if seq in cps or seq == 1:
            st.times[seq] = _time_us(head)
            if seq in cps and cps[seq] != h:
                st.bad_cps.add(seq)
                st.add(seq, "checkpoint_mismatch", "signed checkpoint does not match the chain")
        running = stored  # equal to h unless this event is bad: go on from what is stored
        expect = seq + 1
    st.running, st.expect = bytes(running), expect
    st.events += len(batch)
    if batch:
        st.last_time = _time_us(batch[-1][1])


#: The type each column the verifier reads must have, by the Python type its driver returns.
_EXPECTED_TYPES: Final = {
    "seq": int,
    "prev_hash": bytes,
    "hash": bytes,
    "stream": str,
    "chain_hash": bytes,
    "signature": bytes,
    "key_id": str,
    "public_key": bytes,
}
_SQL_TYPES: Final[dict[type | None, str]] = {
    bytes: "a BLOB",
    str: "text",
    int: "an integer",
    float: "a real",
    None: "NULL",
}


def _sql_type(value: object) -> str:
    """How SQL names the type of a driver value (``a BLOB``, ``text``, ``NULL``, ...)."""
    return _SQL_TYPES.get(None if value is None else type(value), type(value).__name__)


def _wrong_types(*columns: tuple[str, object]) -> str:
    """What is wrong with the columns (name, value) that do not hold their types."""
    wrong = [
        f"{name} holds {_sql_type(v)} ({v!r:.40}), not {_sql_type(_EXPECTED_TYPES[name]())}"
        for name, v in columns
        if type(v) is not _EXPECTED_TYPES[name]
    ]
    return f"column {'; '.join(wrong)}: the row was edited"


def _well_typed(*columns: tuple[str, object]) -> bool:
    return all(type(v) is _EXPECTED_TYPES[name] for name, v in columns)


def _time_us(head: str) -> int:
    """``time_us`` of a head JSON ``[seq,time_us,...]`` (0 if it is not a number)."""
    try:
        return int(head[1:].split(",", 2)[1])
    except (IndexError, ValueError):
        return 0


def _diagnose(st: _StreamCheck, seq: int, prev: bytes) -> None:
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
