"""The local spool: where sealed events go while the audit database is unreachable.

A spool is an append-only JSON Lines file, one per stream, next to the database
(or where ``spool_path`` says). Events are written to it already sealed (with their
sequence number, previous hash and hash), so the chain is the same one the database
will hold; when the database is reachable again the writer replays the spool in
order, inside one transaction (skipping what the database already holds), and then
removes the file if nothing was appended to it meanwhile.

Line formats (one JSON object per line, ``\\n``-terminated; a last line without
``\\n`` is a write cut short by a crash and is ignored; an append that fails, e.g.
ENOSPC part-way, is cut back off the file; a read takes at most the file's size when
opened, so a path that is a device, such as ``/dev/full``, reads as empty)::

    {"kind": "event", "stream": ..., "seq": ..., "time_us": ..., "type": ...,
     ... every audit_events column ..., "block_ids": [...], "details": {...},
     "chain_format": 2, "prev_hash": "<hex>", "hash": "<hex>"}
    {"kind": "checkpoint", "stream": ..., "seq": ..., "chain_hash": "<hex>",
     "signature": "<hex>", "key_id": ..., "time_us": ...}
    {"kind": "key", "key_id": ..., "algorithm": "ed25519", "public_key": "<hex>",
     "origin": ..., "stream": ..., "time_us": ...}
    {"kind": "seal", "stream": ..., "prev": "<hex>", "digest": "<hex>", "key_id": ...,
     "signature": "<hex>"}

**Seals.** A spool written by a writer with a signing key ends every batch (one
:meth:`Spool.append`) with a ``seal`` line: an Ed25519 signature by the writer's key
over :func:`seal_message`, i.e. the stream, the signature of the batch's previous seal
in the file (``prev``, empty for the first batch) and the SHA-256 of the batch's
lines as written. So a line edited, reordered, inserted or removed, a batch removed
from the front or the middle, or batches reordered, is detected by whoever holds
the public key; what is not detected is the loss of whole batches at the end of the
file, or of the whole file. :meth:`Spool.read` with a ``key`` checks the seals and
returns what fails in :attr:`SpoolContents.rejected` (to quarantine) and
:attr:`SpoolContents.breaks` (batches missing): a writer whose key is configured
rejects every batch not sealed by that key; one with an ephemeral key (no key
configured, an unsigned trail) checks the seals of its own key and accepts the rest
unauthenticated, as it would accept an unsigned database.

An event line keeps its chain format: ``block_ids`` and ``details`` are read back into
the JSON text that format hashes (``kvgov.audit.chain.FORMATS``), and a line without
``chain_format`` (written before format 2 existed) is format 1, as the database's
server default says for such rows. A line whose numbers no format-2 writer could have
written does not parse (it is damaged, not altered silently).

Every write is flushed and ``fsync``-ed before the writer reports it durable. A write
cut short by a crash is terminated with ``\\n`` before the next append, and a line that
does not parse is skipped by :meth:`Spool.read` and returned in
:attr:`SpoolContents.damaged`, so one bad line never stops a replay.

The **quarantine** (:class:`Quarantine`, ``<name>.quarantine.jsonl`` next to the spool)
holds the records the database refused, in the same line formats with two more keys,
``"refused"`` (the database's reason) and ``"quarantined_us"``; when ``kvgov audit
quarantine replay`` later stores one, it appends a line
``{"kind": "resolved", "record": "event"|"checkpoint"|"key", "stream": ..., "seq": ...,
"key_id": ..., "resolved_us": ...}``. Both files are only ever appended to (under
``flock``, so the writer and the command can append at the same time); only a
replayed spool is removed, by its writer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import URL

from kvgov.audit.chain import FORMATS
from kvgov.audit.models import EVENT_INSERT_COLUMNS
from kvgov.audit.signing import SigningKey, public_key_from_raw, verify_signature

__all__ = [
    "CheckpointRecord",
    "EventRecord",
    "KeyRecord",
    "Quarantine",
    "QuarantinedRecord",
    "Spool",
    "SpoolContents",
    "default_spool_path",
    "quarantine_path",
    "seal_message",
]

#: A sealed event in ``EVENT_INSERT_COLUMNS`` order; block_ids and details as canonical
#: JSON text, hashes as bytes or bytearray (the writer's rows hold bytearrays).
EventRecord = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A signed checkpoint waiting to be stored.

    Attributes:
        stream: the stream id.
        seq: last sequence number covered.
        chain_hash: the chain hash at ``seq``.
        signature: Ed25519 signature over the checkpoint message.
        key_id: id of the signing key.
        time_us: when it was signed (microseconds since the epoch, UTC).
    """

    stream: str
    seq: int
    chain_hash: bytes
    signature: bytes
    key_id: str
    time_us: int


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A signing public key to record in ``audit_keys``.

    Attributes:
        key_id: the key id.
        public_key: 32 raw public key bytes.
        origin: ``"configured"`` or ``"ephemeral"``.
        stream: the stream recording it.
        time_us: when it was recorded.
        algorithm: always ``"ed25519"``.
    """

    key_id: str
    public_key: bytes
    origin: str
    stream: str
    time_us: int
    algorithm: str = "ed25519"


@dataclass(frozen=True, slots=True)
class SpoolContents:
    """What a spool file holds, in write order.

    Attributes:
        events: sealed events.
        checkpoints: checkpoints.
        keys: recorded keys.
        damaged: complete lines that do not parse (disk damage, a foreign edit), as text.
        rejected: records of batches whose seal fails (read with a key), with why:
            they are not replayed but quarantined.
        breaks: where sealed batches are missing before an authentic one (read with a
            key), one sentence each.
    """

    events: tuple[EventRecord, ...]
    checkpoints: tuple[CheckpointRecord, ...]
    keys: tuple[KeyRecord, ...]
    damaged: tuple[str, ...] = ()
    rejected: tuple[tuple[EventRecord | CheckpointRecord | KeyRecord, str], ...] = ()
    breaks: tuple[str, ...] = ()

    @property
    def rejected_seq(self) -> int:
        """The highest event ``seq`` among the rejected records (0 when none)."""
        return max((int(r[1]) for r, _ in self.rejected if isinstance(r, tuple)), default=0)

    @property
    def last_seq(self) -> int:
        """The highest event ``seq`` spooled (0 when none)."""
        return max((int(r[1]) for r in self.events), default=0)


_BLOCK_IDS = EVENT_INSERT_COLUMNS.index("block_ids")
_DETAILS = EVENT_INSERT_COLUMNS.index("details")
_FORMAT = EVENT_INSERT_COLUMNS.index("chain_format")
_PREV = EVENT_INSERT_COLUMNS.index("prev_hash")
_HASH = EVENT_INSERT_COLUMNS.index("hash")
#: Fields of checkpoint and key records that a spool line holds as hex text.
_HEX_FIELDS: dict[type[Any], tuple[str, ...]] = {
    CheckpointRecord: ("chain_hash", "signature"),
    KeyRecord: ("public_key",),
}
_R = TypeVar("_R", CheckpointRecord, KeyRecord)


def _event_line(row: EventRecord) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": "event"}
    for i, name in enumerate(EVENT_INSERT_COLUMNS):
        v = row[i]
        if i in (_BLOCK_IDS, _DETAILS):
            v = json.loads(v)
        elif i in (_PREV, _HASH):
            v = v.hex()
        d[name] = v
    return d


def _event_from(d: dict[str, Any]) -> EventRecord:
    number = d.setdefault("chain_format", 1)  # a line written before format 2
    if type(number) is not int or number not in FORMATS:
        raise ValueError(f"unknown chain format {number!r}")
    fmt = FORMATS[number]
    out: list[Any] = []
    for i, name in enumerate(EVENT_INSERT_COLUMNS):
        v = d[name]
        if i in (_BLOCK_IDS, _DETAILS):
            if number != 1:  # the numbers as format 2 reads them (1e20 came back an int)
                v = fmt.load(json.dumps(v))
            v = fmt.json(v)
        elif i in (_PREV, _HASH):
            v = bytes.fromhex(v)
        out.append(v)
    return tuple(out)


def _append_lines(path: Path, lines: Sequence[str]) -> None:
    """Append lines under an exclusive ``flock`` and fsync; terminate a torn last line first.

    All or nothing: when a write or the fsync fails (a full disk: ENOSPC after part of
    the lines went out), the file is cut back to its size before the call, so that a
    later append does not complete a partial batch that no seal covers (its records
    are still the caller's, who retries them).
    """
    if not lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a crash cut the last write short: end that line
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):  # not a regular file (/dev/full): nothing to undo
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)  # releases the lock


def _read_upto_size(path: Path) -> bytes:
    """The file's bytes, at most as many as its size when opened.

    Never more: a path that is not a regular file, such as a device whose reads never
    end (``/dev/full``, ``/dev/zero``) or a FIFO, holds nothing to read (size 0), and a
    file another process appends to is read as it was when opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO does not block the open
    try:
        size = os.fstat(fd).st_size
        chunks: list[bytes] = []
        while size > 0:
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                break  # truncated meanwhile
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_lines(path: Path) -> list[str]:
    """Complete lines of a JSON Lines file (the part after the last newline is a torn write)."""
    try:
        data = _read_upto_size(path)
    except FileNotFoundError:
        return []
    # universal newlines, as a text-mode read gives them
    text = data.decode("utf-8", errors="surrogateescape").replace("\r\n", "\n").replace("\r", "\n")
    return [line for line in text.split("\n")[:-1] if line]


def _parse(line: str) -> tuple[str, Any] | None:
    """One line as ``(kind, record)``, or None when it does not parse."""
    try:
        d = json.loads(line)
        kind = d.pop("kind")
        if kind == "event":
            return kind, _event_from(d)
        if kind == "checkpoint":
            return kind, _record_from(CheckpointRecord, d)
        if kind == "key":
            return kind, _record_from(KeyRecord, d)
        return kind, d
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _line(record: EventRecord | CheckpointRecord | KeyRecord, **extra: Any) -> str:
    if isinstance(record, CheckpointRecord):
        d = _record_line("checkpoint", record)
    elif isinstance(record, KeyRecord):
        d = _record_line("key", record)
    else:
        d = _event_line(record)
    d.update(extra)
    return json.dumps(d, sort_keys=True)


_SEAL_TAG = b"kvgov-spool-batch-1\n"


def seal_message(stream: str, prev: bytes, digest: bytes) -> bytes:
    """The bytes a spool batch's seal signs.

    Layout: ``b"kvgov-spool-batch-1\\n"`` || uint16 big-endian length of the stream id
    || stream id (UTF-8) || uint16 length of ``prev`` || ``prev`` || 32-byte digest.

    Args:
        stream: the stream id.
        prev: the signature of the previous seal in the file (empty for the first).
        digest: SHA-256 of the batch's lines, each ``\\n``-terminated, as written.

    Returns:
        The message.
    """
    sid = stream.encode("utf-8")
    return (
        _SEAL_TAG + len(sid).to_bytes(2, "big") + sid + len(prev).to_bytes(2, "big") + prev
        + digest
    )  # fmt: skip


def _digest(lines: Sequence[str]) -> bytes:
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode("utf-8")).digest()


def _last_seal(lines: Sequence[str]) -> bytes:
    """The signature of the last seal line among ``lines`` (empty when none)."""
    for line in reversed(lines):
        parsed = _parse(line)
        if parsed is not None and parsed[0] == "seal":
            try:
                return bytes.fromhex(parsed[1]["signature"])
            except (KeyError, TypeError, ValueError):
                return b""
    return b""


class _Reader:
    """Sorts a spool's lines into accepted, rejected and damaged records."""

    def __init__(self, key: SigningKey | None, stream: str) -> None:
        self.key, self.stream = key, stream
        self.required = key is not None and key.origin == "configured"
        self.events: list[EventRecord] = []
        self.cps: list[CheckpointRecord] = []
        self.keys: list[KeyRecord] = []
        self.damaged: list[str] = []
        self.rejected: list[tuple[EventRecord | CheckpointRecord | KeyRecord, str]] = []
        self.breaks: list[str] = []
        self.last_sig = b""  # the previous seal line's signature, as written

    def take(self, lines: Sequence[str], why: str | None) -> None:
        """Accept ``lines`` (``why`` None) or reject them for ``why``."""
        for line in lines:
            parsed = _parse(line)
            if parsed is None or parsed[0] not in ("event", "checkpoint", "key"):
                self.damaged.append(line)
            elif why is not None:
                self.rejected.append((parsed[1], why))
            elif parsed[0] == "event":
                self.events.append(parsed[1])
            elif parsed[0] == "checkpoint":
                self.cps.append(parsed[1])
            else:
                self.keys.append(parsed[1])

    def unsealed(self, lines: Sequence[str]) -> None:
        """Lines no seal covers: a write cut short by a crash, an insertion, an old spool."""
        if lines:
            self.take(lines, "spool lines not covered by a seal" if self.required else None)

    def check(self, seal: dict[str, Any], batch: Sequence[str]) -> str | None:
        """Why a sealed batch is not authentic for this writer, or None."""
        key = self.key
        assert key is not None
        try:
            stream, key_id = str(seal["stream"]), str(seal["key_id"])
            prev, sig = bytes.fromhex(seal["prev"]), bytes.fromhex(seal["signature"])
            digest = bytes.fromhex(seal["digest"])
        except (KeyError, TypeError, ValueError):
            return "spool seal does not parse"
        if stream != self.stream:
            return f"spool batch sealed for stream {stream!r}, not {self.stream!r}"
        if key_id != key.key_id:
            if not self.required:
                return None  # unauthenticated: another process's ephemeral key
            return f"spool batch sealed by key {key_id}, not by this writer's key {key.key_id}"
        if digest != _digest(batch):
            return "spool batch does not match its seal (lines edited, added or removed)"
        pub = public_key_from_raw(key.public_raw)
        if not verify_signature(pub, sig, seal_message(stream, prev, digest)):
            return "spool seal signature does not verify"
        if prev != self.last_sig:
            first = next((_parse(line) for line in batch), None)
            where = f"seq {first[1][1]}" if first is not None and first[0] == "event" else "it"
            self.breaks.append(f"sealed spool batches are missing or reordered before {where}")
        return None

    def seal(self, seal: dict[str, Any], pending: list[str]) -> None:
        """A seal line closes a batch: the ``lines`` lines just before it."""
        n = seal.get("lines")
        if type(n) is not int or not 0 < n <= len(pending):
            self.unsealed(pending)
        else:
            self.unsealed(pending[:-n])
            self.take(pending[-n:], self.check(seal, pending[-n:]))
        sig = seal.get("signature")
        self.last_sig = bytes.fromhex(sig) if isinstance(sig, str) and _is_hex(sig) else b""


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


class Spool:
    """One stream's append-only spool file.

    Args:
        path: the JSON Lines file (created on first write, with its directory).
        key: the writer's signing key: each batch appended ends with a seal signed by
            it, and :meth:`read` checks the seals (see the module docstring). None (a
            reader such as ``kvgov audit status``) writes no seals and checks none.
        stream: the stream the seals name (needed with ``key``).
    """

    def __init__(self, path: Path, key: SigningKey | None = None, stream: str = "") -> None:
        self.path = path
        self._key = key
        self._stream = stream
        self._prev: bytes | None = None  # the last seal's signature, once known

    def exists(self) -> bool:
        """Whether the spool holds anything to replay.

        Returns:
            True when the file exists and is not empty.
        """
        try:
            return self.path.stat().st_size > 0
        except OSError:  # missing, or a path that cannot exist: nothing to replay
            return False

    def size(self) -> int:
        """The file's size in bytes (0 when missing): tells whether it grew since a read.

        Returns:
            The size.
        """
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def append(
        self,
        events: Sequence[EventRecord],
        checkpoints: Sequence[CheckpointRecord] = (),
        keys: Sequence[KeyRecord] = (),
    ) -> None:
        """Append records (and, with a key, their seal) and fsync them.

        Args:
            events: sealed events, in chain order.
            checkpoints: checkpoints covering them.
            keys: keys to record.

        Raises:
            OSError: the file cannot be written (the caller reports ``AuditUnavailable``).
        """
        records: list[EventRecord | CheckpointRecord | KeyRecord] = [*keys, *events, *checkpoints]
        lines = [_line(r) for r in records]
        sig = b""
        if self._key is not None and lines:
            if self._prev is None:  # a file left by another writer: chain on from its end
                self._prev = _last_seal(_read_lines(self.path))
            digest = _digest(lines)
            sig = self._key.sign(seal_message(self._stream, self._prev, digest))
            seal = {"kind": "seal", "stream": self._stream, "prev": self._prev.hex(),
                    "digest": digest.hex(), "lines": len(lines), "key_id": self._key.key_id,
                    "signature": sig.hex()}  # fmt: skip
            lines.append(json.dumps(seal, sort_keys=True))
        _append_lines(self.path, lines)
        if sig:
            self._prev = sig

    def read(self) -> SpoolContents:
        """Read everything spooled, skipping a torn last line and keeping damaged ones apart.

        With a key, batches whose seal fails are returned in ``rejected`` and missing
        batches in ``breaks`` (see the module docstring).

        Returns:
            The records, in write order.
        """
        reader = _Reader(self._key, self._stream)
        pending: list[str] = []
        for line in _read_lines(self.path):
            parsed = _parse(line)
            if parsed is not None and parsed[0] == "seal":
                if self._key is not None:
                    reader.seal(parsed[1], pending)
                else:
                    reader.take(pending, None)
                pending = []
            else:
                pending.append(line)
        if self._key is not None:
            reader.unsealed(pending)
        else:
            reader.take(pending, None)
        return SpoolContents(
            tuple(reader.events), tuple(reader.cps), tuple(reader.keys), tuple(reader.damaged),
            tuple(reader.rejected), tuple(reader.breaks),
        )  # fmt: skip

    def remove(self) -> None:
        """Delete the spool after its records reached the database."""
        self.path.unlink(missing_ok=True)
        self._prev = b""


def default_spool_path(url: URL, stream: str) -> Path:
    """Where a stream spools when no ``spool_path`` is given.

    Args:
        url: the audit database URL.
        stream: the stream id (characters other than letters, digits, ``.``, ``_`` and
            ``-`` become ``_`` in the file name).

    Returns:
        ``<db file>.<stream>.spool.jsonl`` next to a SQLite file, else
        ``./kvgov-audit.<stream>.spool.jsonl`` in the working directory.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", stream)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        db = Path(str(url.database))
        return db.with_name(f"{db.name}.{safe}.spool.jsonl")
    return Path.cwd() / f"kvgov-audit.{safe}.spool.jsonl"


def quarantine_path(spool_path: Path) -> Path:
    """Where the quarantine of a spool lives: ``x.spool.jsonl`` -> ``x.quarantine.jsonl``.

    Args:
        spool_path: the spool file.

    Returns:
        The quarantine file next to it.
    """
    name = spool_path.name
    if name.endswith(".spool.jsonl"):
        return spool_path.with_name(name[: -len(".spool.jsonl")] + ".quarantine.jsonl")
    return spool_path.with_name(name + ".quarantine.jsonl")


@dataclass(frozen=True, slots=True)
class QuarantinedRecord:
    """A record the database refused, as the quarantine keeps it.

    Attributes:
        kind: ``"event"``, ``"checkpoint"``, ``"key"``, or ``"damaged"`` (a spool line
            that did not parse; ``record`` is then its text).
        record: the sealed record (or the damaged line's text).
        stream: the stream.
        seq: the event or checkpoint ``seq`` (0 for keys and damaged lines).
        refused: why the database refused it.
        quarantined_us: when it was quarantined (microseconds since the epoch, UTC).
        event_type: the event's type, for events.
    """

    kind: str
    record: Any
    stream: str
    seq: int
    refused: str
    quarantined_us: int
    event_type: str | None = field(default=None)

    @property
    def ident(self) -> tuple[str, str, int, str]:
        """What a ``resolved`` line names: kind, stream, seq, key id."""
        key = self.record.key_id if isinstance(self.record, KeyRecord) else ""
        return (self.kind, self.stream, self.seq, key)


_TYPE = EVENT_INSERT_COLUMNS.index("type")


class Quarantine:
    """The append-only file of records the database refused (never dropped).

    Args:
        path: the JSON Lines file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(
        self,
        refused: Iterable[tuple[EventRecord | CheckpointRecord | KeyRecord, str]],
        now_us: int,
        damaged: Iterable[tuple[str, str, str]] = (),
    ) -> None:
        """Append refused records (and damaged spool lines) and fsync.

        Args:
            refused: ``(record, reason)`` pairs.
            now_us: the time to stamp them with.
            damaged: ``(stream, line, reason)`` for spool lines that did not parse.

        Raises:
            OSError: the file cannot be written.
        """
        lines = [_line(r, refused=why, quarantined_us=now_us) for r, why in refused]
        lines += [
            json.dumps(
                {"kind": "damaged", "stream": stream, "line": text, "refused": why,
                 "quarantined_us": now_us},
                sort_keys=True,
            )
            for stream, text, why in damaged
        ]  # fmt: skip
        _append_lines(self.path, lines)

    def resolve(self, items: Iterable[QuarantinedRecord], now_us: int) -> None:
        """Record that quarantined records are now stored.

        Args:
            items: the records stored.
            now_us: when.

        Raises:
            OSError: the file cannot be written.
        """
        lines = []
        for q in items:
            kind, stream, seq, key = q.ident
            lines.append(
                json.dumps(
                    {"kind": "resolved", "record": kind, "stream": stream, "seq": seq,
                     "key_id": key, "resolved_us": now_us},
                    sort_keys=True,
                )
            )  # fmt: skip
        _append_lines(self.path, lines)

    def outstanding(self) -> list[QuarantinedRecord]:
        """The quarantined records not yet resolved, in the order they were refused.

        Returns:
            The records.
        """
        items: list[QuarantinedRecord] = []
        resolved: set[tuple[str, str, int, str]] = set()
        for line in _read_lines(self.path):
            try:
                d = json.loads(line)
            except ValueError:
                continue  # a torn or damaged line of the quarantine itself
            kind = d.get("kind")
            if kind == "resolved":
                resolved.add((d["record"], d["stream"], int(d["seq"]), d.get("key_id", "")))
                continue
            refused, when = d.pop("refused", ""), int(d.pop("quarantined_us", 0))
            if kind == "damaged":
                items.append(QuarantinedRecord(kind, d["line"], d["stream"], 0, refused, when))
                continue
            parsed = _parse(json.dumps(d))
            if parsed is None:
                continue
            rec = parsed[1]
            if isinstance(rec, (CheckpointRecord, KeyRecord)):
                seq = rec.seq if isinstance(rec, CheckpointRecord) else 0
                items.append(QuarantinedRecord(kind, rec, rec.stream, seq, refused, when))
            else:
                items.append(
                    QuarantinedRecord(
                        kind, rec, rec[0], int(rec[1]), refused, when, event_type=rec[_TYPE]
                    )
                )
        return [q for q in items if q.ident not in resolved]


def _record_line(kind: str, record: CheckpointRecord | KeyRecord) -> dict[str, Any]:
    d = dataclasses.asdict(record)
    for name in _HEX_FIELDS[type(record)]:
        d[name] = d[name].hex()
    return {"kind": kind, **d}


def _record_from(cls: type[_R], d: dict[str, Any]) -> _R:
    for name in _HEX_FIELDS[cls]:
        d[name] = bytes.fromhex(d[name])
    return cls(**d)
