"""The chain head of one stream: sealing events into rows and signing checkpoints.

A :class:`Sealer` turns queued events into sealed rows (canonical bytes, chain hash;
layout in :mod:`kvgov.audit.chain`, always in the current ``CHAIN_FORMAT``; a stream whose
stored rows are of format 1 goes on in format 2, linked by ``prev_hash``) and decides
when a checkpoint is due: at seq 0 of a new stream (before its first event: "stream S
began at genesis", signed), at every ``checkpoint_every``-th event, when unsigned events
have waited ``checkpoint_seconds``, and at ``close``. It is not thread-safe: the writer
calls it under its ``cv``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Final

from kvgov.audit.chain import (
    CHAIN_FORMAT,
    FORMATS,
    GENESIS_HASH,
    BlockIdsJson,
    ChainHash,
    canonical_prefix,
)
from kvgov.audit.events import FIELDS, AuditEvent, CompactEvent
from kvgov.audit.signing import SigningKey, checkpoint_message
from kvgov.audit.spool import CheckpointRecord, EventRecord

__all__ = ["Item", "Sealer"]

_SCOPE_END: Final = FIELDS.index("sequence_id")
#: ``type`` .. ``template_version``: the same for most events of one tenant and model.
_SCOPE: Final = attrgetter("type", *FIELDS[:_SCOPE_END])
#: ``sequence_id`` .. ``policy_revision``: new for most events.
_REQUEST: Final = attrgetter(*FIELDS[_SCOPE_END:])
#: Scopes whose JSON the sealer keeps before it starts over.
_SCOPE_CACHE_SIZE: Final = 4096

#: A queued event: (seq, time_us, event); a writer process's are compact (the same fields).
Item = tuple[int, int, AuditEvent | CompactEvent]


class Sealer:
    """The chain head of one stream and its checkpoint cadence.

    Args:
        stream: the stream id.
        key: the checkpoint signing key.
        clock: seconds since the epoch, for checkpoint times.
        head_seq: the last sealed ``seq`` (0 for a new stream).
        head_hash: its chain hash (``GENESIS_HASH`` for a new stream).
        last_checkpoint: the last checkpointed ``seq`` (-1 when the stream has none).
        checkpoint_every: events between two checkpoints.
        checkpoint_seconds: seconds unsigned events may wait for a checkpoint.
    """

    def __init__(
        self,
        stream: str,
        key: SigningKey,
        clock: Callable[[], float],
        head_seq: int,
        head_hash: ChainHash,
        last_checkpoint: int,
        checkpoint_every: int,
        checkpoint_seconds: float,
    ) -> None:
        self.stream = stream
        #: The last sealed ``seq`` and its chain hash (written only by :meth:`seal`).
        self.head_seq = head_seq
        self.head_hash = head_hash
        self._key = key
        self._clock = clock
        self._every = checkpoint_every
        self._seconds = checkpoint_seconds
        self._last_cp = max(last_checkpoint, 0)
        self._last_cp_time = time.monotonic()
        self._genesis_due = head_seq == 0 and last_checkpoint < 0
        # caches: decimal text of block ids, JSON of scopes
        self._block_ids_json = BlockIdsJson()
        self._scope_json: dict[tuple[str | None, ...], str] = {}
        self._last_details: tuple[object, str] = (None, "{}")

    def checkpoint(self, seq: int, chain: ChainHash, out: list[CheckpointRecord]) -> None:
        """Sign ``(stream, seq, chain)`` and append the checkpoint to ``out``.

        Args:
            seq: the sequence number covered.
            chain: the chain hash at ``seq``.
            out: where the checkpoint goes.
        """
        sig = self._key.sign(checkpoint_message(self.stream, seq, chain))
        out.append(
            CheckpointRecord(
                self.stream, seq, chain, sig, self._key.key_id, round(self._clock() * 1_000_000)
            )
        )
        self._last_cp = seq
        self._last_cp_time = time.monotonic()

    def checkpoint_if_due(self, final: bool, out: list[CheckpointRecord]) -> None:
        """Sign the head if events wait unsigned and this is the end or they waited too long.

        Args:
            final: the log is closing and nothing is queued.
            out: where the checkpoint goes.
        """
        if self.head_seq > self._last_cp and (
            final or time.monotonic() - self._last_cp_time >= self._seconds
        ):
            self.checkpoint(self.head_seq, self.head_hash, out)

    def seal(self, items: list[Item], out: list[EventRecord], cps: list[CheckpointRecord]) -> None:
        """Compute canonical bytes and chain hashes of queued events, in ``seq`` order.

        Args:
            items: the events, in ``seq`` order, continuing the head.
            out: where the sealed rows go (``EVENT_INSERT_COLUMNS`` order).
            cps: where checkpoints due on the way go.
        """
        if not items:
            return
        if self._genesis_due:
            self._genesis_due = False
            self.checkpoint(0, GENESIS_HASH, cps)
        prev: bytes = self.head_hash
        prev_row = bytearray(prev)
        stream = self.stream
        every = self._every
        fmt = FORMATS[CHAIN_FORMAT]
        number, charset = fmt.number, fmt.charset
        encode, encode_details = fmt.head_json, fmt.details_json
        encode_ids = self._block_ids_json
        sha256 = hashlib.sha256
        scope_of, request_of = _SCOPE, _REQUEST
        scope_json = self._scope_json
        prefix = canonical_prefix(stream, CHAIN_FORMAT)
        # the details of the last event that had any, and their JSON: derived events
        # share their source's details (immutable, as the event), so the JSON is one
        last_details, last_det = self._last_details
        for seq, time_us, ev in items:
            scope = scope_of(ev)  # str or None only: equal tuples have equal JSON
            head = scope_json.get(scope)
            if head is None:
                if len(scope_json) >= _SCOPE_CACHE_SIZE:
                    scope_json.clear()
                head = scope_json[scope] = encode(scope)[1:-1]
            request = request_of(ev)
            bids = encode_ids(ev.block_ids)
            details = ev.details
            if not details:
                det = "{}"
            elif details is last_details:  # events derived from one (AuditEvent.derive)
                det = last_det
            else:
                det = last_det = encode_details(details)
                last_details = details
            text = f"{prefix}{seq},{time_us},{head},{encode(request)[1:-1]},{bids},{det}]"
            h = sha256(prev + text.encode(charset)).digest()
            # the row holds the hashes as bytearrays: the sqlite3 driver binds those
            # directly, bytes only after an adapter lookup (half a microsecond a row)
            h_row = bytearray(h)
            out.append((stream, seq, time_us, *scope, *request, bids, det, number, prev_row, h_row))
            prev, prev_row = h, h_row
            if seq % every == 0:
                self.checkpoint(seq, ChainHash(h), cps)
        self.head_seq = items[-1][0]
        self.head_hash = ChainHash(prev)
        self._last_details = (last_details, last_det)
