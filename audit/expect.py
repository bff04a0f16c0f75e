"""Signed lists of expected streams: so that a forged or a deleted stream is found.

The audit database alone cannot tell a stream someone forged (events, checkpoints
and a key record they made up) from a real one, nor notice a stream deleted whole.
An auditor therefore keeps, outside the database, a list of the streams that exist,
signed with a key the database's users do not hold, and verifies against it:

    kvgov audit streams --key auditor.pem --output streams.json    # after a clean verify
    kvgov audit verify --public-key auditor.pem.pub --expect-streams streams.json

File format (UTF-8 JSON)::

    {"format": "kvgov-expected-streams-1",
     "created_us": <microseconds since 1970-01-01 UTC>,
     "key_id": "<16 hex: the signing key's id>",
     "streams": [{"stream": "<id>", "seq": <n>, "chain_hash": "<64 hex>"}, ...],
     "signature": "<128 hex>"}

``streams`` is sorted by ``stream``; each entry pins the stream's head when the
list was made (``seq`` 0 and ``chain_hash`` of 32 zero bytes pin only the name).
The Ed25519 signature covers ``b"kvgov-expected-streams-1\\n"`` followed by the
canonical JSON (:func:`kvgov.audit.chain.canonical_json`) of every field but
``signature``.

Verified against a list, a database fails when it holds a stream the list lacks
(``unexpected_stream``), lacks a listed stream (``missing_stream``), or a listed
stream's events no longer reach the pinned ``seq`` (``expected_beyond_end``) or
its chain hash there differs (``expected_mismatch``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Connection, select

from kvgov.audit.chain import GENESIS_HASH, canonical_json
from kvgov.audit.models import AuditEventRow
from kvgov.audit.signing import SigningKey, verify_signature
from kvgov.exceptions import ExpectedStreamsError

__all__ = [
    "EXPECTED_STREAMS_FORMAT",
    "ExpectedStream",
    "ExpectedStreams",
    "load_expected_streams",
    "sign_expected_streams",
]

#: The ``format`` of a list, and the first line of what its signature covers.
EXPECTED_STREAMS_FORMAT: Final = "kvgov-expected-streams-1"


@dataclass(frozen=True, slots=True)
class ExpectedStream:
    """One stream a list expects, with its head when the list was made.

    Attributes:
        stream: the stream id.
        seq: the stream's last ``seq`` then (0: pin the name only).
        chain_hash: the chain hash at ``seq``, hex.
    """

    stream: str
    seq: int
    chain_hash: str


@dataclass(frozen=True, slots=True)
class ExpectedStreams:
    """A list whose signature verified with a trusted key.

    Attributes:
        streams: the expected streams, sorted by id.
        created_us: when it was made (microseconds since the epoch, UTC).
        key_id: the id of the key that signed it.
        path: where it was read from.
    """

    streams: tuple[ExpectedStream, ...]
    created_us: int
    key_id: str
    path: str

    def by_stream(self) -> dict[str, ExpectedStream]:
        """The entries by stream id.

        Returns:
            A new dict.
        """
        return {s.stream: s for s in self.streams}


def _message(body: Mapping[str, Any]) -> bytes:
    return f"{EXPECTED_STREAMS_FORMAT}\n{canonical_json(body)}".encode()


def sign_expected_streams(
    streams: Iterable[ExpectedStream], key: SigningKey, created_us: int
) -> str:
    """Make a signed list (the file's text).

    Args:
        streams: the streams to expect.
        key: the signing key (an auditor's, not the writers').
        created_us: the time to record.

    Returns:
        The JSON text to write to a file.
    """
    body = {
        "format": EXPECTED_STREAMS_FORMAT,
        "created_us": created_us,
        "key_id": key.key_id,
        "streams": [
            {"stream": s.stream, "seq": s.seq, "chain_hash": s.chain_hash}
            for s in sorted(streams, key=lambda s: s.stream)
        ],
    }
    signed = {**body, "signature": key.sign(_message(body)).hex()}
    return json.dumps(signed, indent=2, sort_keys=True) + "\n"


def load_expected_streams(
    path: str | os.PathLike[str], trusted: Mapping[str, Ed25519PublicKey]
) -> ExpectedStreams:
    """Read a list and check its signature against the trusted keys.

    Args:
        path: the file.
        trusted: trusted public keys by key id (``verify --public-key``).

    Returns:
        The list.

    Raises:
        ExpectedStreamsError: the file cannot be read or parsed (``tampered`` False),
            or its signer is not trusted or its signature does not verify (``tampered``
            True).
    """
    where = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        body = {k: data[k] for k in ("format", "created_us", "key_id", "streams")}
        signature = bytes.fromhex(data["signature"])
        streams = tuple(
            ExpectedStream(str(s["stream"]), int(s["seq"]), str(s["chain_hash"]))
            for s in body["streams"]
        )
    except OSError as exc:
        raise ExpectedStreamsError(where, f"cannot read it ({exc.strerror or exc})") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ExpectedStreamsError(
            where, f"not a list made by `kvgov audit streams` ({exc!r})"
        ) from exc
    if body["format"] != EXPECTED_STREAMS_FORMAT:
        raise ExpectedStreamsError(where, f"unknown format {body['format']!r}")
    key = trusted.get(str(body["key_id"]))
    if key is None:
        raise ExpectedStreamsError(
            where,
            f"signed by key {body['key_id']}, which is not among the --public-key keys; "
            "pass the public key of whoever signed the list",
            tampered=True,
        )
    if not verify_signature(key, signature, _message(body)):
        raise ExpectedStreamsError(
            where, "its signature does not verify: the list was altered", tampered=True
        )
    return ExpectedStreams(streams, int(body["created_us"]), str(body["key_id"]), where)


def expected_problems(
    conn: Connection, expected: ExpectedStreams, last_seqs: Mapping[str, int]
) -> dict[str, list[tuple[int, str, str]]]:
    """Compare the database's streams with a verified list.

    Args:
        conn: a connection to the audit database.
        expected: the list.
        last_seqs: every stream the database holds (events or checkpoints) and its last
            ``seq``.

    Returns:
        Problems as ``(seq, kind, message)`` by stream (streams without any omitted).
    """
    out: dict[str, list[tuple[int, str, str]]] = {}
    listed = expected.by_stream()
    made = f"the signed list of {expected.created_us // 1_000_000} (unix s)"
    for stream in sorted(set(last_seqs) - set(listed)):
        out[stream] = [
            (0, "unexpected_stream", f"stream is not in {made}: forged, or started after it")
        ]
    for name, entry in sorted(listed.items()):
        if name not in last_seqs:
            out[name] = [(0, "missing_stream", f"stream is in {made} but not here: deleted")]
            continue
        if entry.seq == 0:
            continue
        last = last_seqs[name]
        if last < entry.seq:
            out[name] = [
                (
                    entry.seq,
                    "expected_beyond_end",
                    f"{made} says the stream reached seq {entry.seq}; events end at {last}: "
                    f"events {last + 1}..{entry.seq} were removed",
                )
            ]
            continue
        stored = conn.execute(
            select(AuditEventRow.hash).where(
                AuditEventRow.stream == name, AuditEventRow.seq == entry.seq
            )
        ).scalar()
        if stored is None or bytes(stored).hex() != entry.chain_hash:
            out[name] = [
                (
                    entry.seq,
                    "expected_mismatch",
                    f"the chain hash at seq {entry.seq} differs from {made}: history rewritten",
                )
            ]
    return out


#: The chain hash of a list entry that pins a stream's name only.
NAME_ONLY_HASH: Final = GENESIS_HASH.hex()
