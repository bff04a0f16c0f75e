"""The local spool: where sealed events go while the audit database is unreachable.

A spool is an append-only JSON Lines file, one per stream, next to the database
(or where ``spool_path`` says). Events are written to it already sealed (with their
sequence number, previous hash and hash), so the chain is the same one the database
will hold; when the database is reachable again the writer replays the spool in
order, inside one transaction, and then removes the file.

Line formats (one JSON object per line, ``\\n``-terminated; a last line without
``\\n`` is a write cut short by a crash and is ignored)::

    {"kind": "event", "stream": ..., "seq": ..., "time_us": ..., "type": ...,
     ... every audit_events column ..., "block_ids": [...], "details": {...},
     "prev_hash": "<hex>", "hash": "<hex>"}
    {"kind": "checkpoint", "stream": ..., "seq": ..., "chain_hash": "<hex>",
     "signature": "<hex>", "key_id": ..., "time_us": ...}
    {"kind": "key", "key_id": ..., "algorithm": "ed25519", "public_key": "<hex>",
     "origin": ..., "stream": ..., "time_us": ...}

Every write is flushed and ``fsync``-ed before the writer reports it durable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kvgov.audit.chain import canonical_json
from kvgov.audit.models import EVENT_INSERT_COLUMNS

__all__ = ["CheckpointRecord", "EventRecord", "KeyRecord", "Spool", "SpoolContents"]

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
    """

    events: tuple[EventRecord, ...]
    checkpoints: tuple[CheckpointRecord, ...]
    keys: tuple[KeyRecord, ...]


_BLOCK_IDS = EVENT_INSERT_COLUMNS.index("block_ids")
_DETAILS = EVENT_INSERT_COLUMNS.index("details")
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
    out: list[Any] = []
    for i, name in enumerate(EVENT_INSERT_COLUMNS):
        v = d[name]
        if i in (_BLOCK_IDS, _DETAILS):
            v = canonical_json(v)
        elif i in (_PREV, _HASH):
            v = bytes.fromhex(v)
        out.append(v)
    return tuple(out)


class Spool:
    """One stream's append-only spool file.

    Args:
        path: the JSON Lines file (created on first write, with its directory).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        """Whether the spool holds anything to replay.

        Returns:
            True when the file exists and is not empty.
        """
        try:
            return self.path.stat().st_size > 0
        except OSError:  # missing, or a path that cannot exist: nothing to replay
            return False

    def append(
        self,
        events: Sequence[EventRecord],
        checkpoints: Sequence[CheckpointRecord] = (),
        keys: Sequence[KeyRecord] = (),
    ) -> None:
        """Append records and fsync them.

        Args:
            events: sealed events, in chain order.
            checkpoints: checkpoints covering them.
            keys: keys to record.

        Raises:
            OSError: the file cannot be written (the caller reports ``AuditUnavailable``).
        """
        lines = [json.dumps(_record_line("key", k), sort_keys=True) for k in keys]
        lines += [json.dumps(_event_line(r), sort_keys=True) for r in events]
        lines += [json.dumps(_record_line("checkpoint", c), sort_keys=True) for c in checkpoints]
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = ("\n".join(lines) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> SpoolContents:
        """Read everything spooled, ignoring a last line cut short by a crash.

        Returns:
            The records, in write order.
        """
        events: list[EventRecord] = []
        cps: list[CheckpointRecord] = []
        keys: list[KeyRecord] = []
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return SpoolContents((), (), ())
        for line in text.split("\n")[:-1]:  # the part after the last "\n" is incomplete
            if not line:
                continue
            d = json.loads(line)
            kind = d.pop("kind")
            if kind == "event":
                events.append(_event_from(d))
            elif kind == "checkpoint":
                cps.append(_record_from(CheckpointRecord, d))
            elif kind == "key":
                keys.append(_record_from(KeyRecord, d))
        return SpoolContents(tuple(events), tuple(cps), tuple(keys))

    def remove(self) -> None:
        """Delete the spool after its records reached the database."""
        self.path.unlink(missing_ok=True)


def _record_line(kind: str, record: CheckpointRecord | KeyRecord) -> dict[str, Any]:
    d = dataclasses.asdict(record)
    for name in _HEX_FIELDS[type(record)]:
        d[name] = d[name].hex()
    return {"kind": kind, **d}


def _record_from(cls: type[_R], d: dict[str, Any]) -> _R:
    for name in _HEX_FIELDS[cls]:
        d[name] = bytes.fromhex(d[name])
    return cls(**d)
