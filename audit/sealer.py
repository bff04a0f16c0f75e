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
import importlib
import time
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, Final

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

__all__ = ["NATIVE_LINK", "Item", "Sealer"]

_native_link: Any
_native_ids: Any
try:  # one chain link compiled (audit/_seal.c), built by setup.py where it can be
    _seal = importlib.import_module("kvgov.audit._seal")
    _native_link, _native_ids = _seal.link, _seal.ids_json
except ImportError:  # no C compiler or no OpenSSL headers at install: the pure path
    _native_link = _native_ids = None

#: Whether the compiled chain link is installed; a :class:`Sealer` uses it where it is
#: (for chain format 2, the one writers write), the pure path otherwise.
NATIVE_LINK: bool = _native_link is not None

_SCOPE_END: Final = FIELDS.index("sequence_id")
#: ``type`` .. ``template_version``: the same for most events of one tenant and model.
_SCOPE: Final = attrgetter("type", *FIELDS[:_SCOPE_END])
#: ``sequence_id`` .. ``policy_revision``: new for most events.
_REQUEST: Final = attrgetter(*FIELDS[_SCOPE_END:])
#: Scopes whose JSON the sealer keeps before it starts over.
_SCOPE_CACHE_SIZE: Final = 4096
#: Details objects whose JSON the sealer keeps before it starts over.
_DETAILS_CACHE_SIZE: Final = 256

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
        native: hash each event's text and write its block ids with the compiled link
            (``kvgov.audit._seal``, the same bytes; an event holding a value it does not
            write is done the pure way); None: where it is installed.

    Raises:
        RuntimeError: ``native`` is True and the compiled link is not installed.
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
        native: bool | None = None,
    ) -> None:
        if native and _native_link is None:
            raise RuntimeError("the compiled audit chain link (kvgov.audit._seal) is not installed")
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
        self._details_json: dict[int, tuple[object, str]] = {}
        use = NATIVE_LINK if native is None else native
        self._link: Callable[..., bytes] | None = (
            _native_link if use and CHAIN_FORMAT == 2 else None
        )
        self._ids: Callable[[Sequence[int]], str] | None = _native_ids if use else None

    @property
    def native(self) -> bool:
        """Whether this sealer hashes with the compiled link."""
        return self._link is not None

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
        prefix_bytes = prefix.encode(charset)
        link = self._link
        # the compiled ids' JSON where installed; an id only the pure path writes (never
        # an event's) raises TypeError there and is written the pure way
        first_ids = self._ids or encode_ids
        # details objects seen lately and their JSON: events derived from one
        # (AuditEvent.derive) and events a binding built from one kept mapping share
        # their details (immutable, as the event), so the JSON is encoded once; kept with
        # the object, so that its id names it while it is kept
        details_json = self._details_json
        for seq, time_us, ev in items:
            scope = scope_of(ev)  # str or None only: equal tuples have equal JSON
            head = scope_json.get(scope)
            if head is None:
                if len(scope_json) >= _SCOPE_CACHE_SIZE:
                    scope_json.clear()
                head = scope_json[scope] = encode(scope)[1:-1]
            request = request_of(ev)
            try:
                bids = first_ids(ev.block_ids)
            except TypeError:
                bids = encode_ids(ev.block_ids)
            details = ev.details
            if not details:
                det = "{}"
            else:
                hit = details_json.get(id(details))
                if hit is not None and hit[0] is details:
                    det = hit[1]
                else:
                    det = encode_details(details)
                    if len(details_json) >= _DETAILS_CACHE_SIZE:
                        details_json.clear()
                    details_json[id(details)] = (details, det)
            try:
                h = (
                    None
                    if link is None
                    else link(prev, prefix_bytes, seq, time_us, head, request, bids, det)
                )
            except TypeError:  # a value only the pure path writes (never an event's)
                h = None
            if h is None:
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
