"""The encoded object layout: round trip, exact lengths, and refusal of anything else."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from kvgov.exceptions import InternalError, ObjectCorrupt
from kvgov.offload.objects import HEADER_BYTES, SealedBlock, decode, encode

OBJ = SealedBlock(
    block_key=b"K" * 32,
    scope_digest=b"S" * 32,
    tenant="acmé",
    deadline_us=1_700_000_600_000_000,
    written_us=1_700_000_000_000_000,
    key_id=b"i" * 16,
    salt=b"s" * 16,
    nonce=b"n" * 12,
    ciphertext=b"c" * 40,
)


def test_round_trip_keeps_every_field() -> None:
    """decode(encode(obj)) equals obj, and nbytes is the encoded length."""
    data = encode(OBJ)
    back = decode(data, tier="t", block_key=OBJ.block_key)
    assert dataclasses.replace(back, ciphertext=bytes(back.ciphertext)) == OBJ
    assert OBJ.nbytes == len(data) == HEADER_BYTES + 32 + 32 + len("acmé".encode()) + 40
    assert OBJ.payload_bytes == 40 - 16


def test_header_layout_is_as_documented() -> None:
    """The fixed header is magic, version, three lengths, two times, key id, salt, nonce, length."""
    data = encode(OBJ)
    fields = struct.unpack_from(">4sBBBHqq16s16s12sQ", data)
    assert fields == (b"KVGO", 1, 32, 32, 5, OBJ.deadline_us, OBJ.written_us,
                      b"i" * 16, b"s" * 16, b"n" * 12, 40)  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d[:-1], "header announces"),
        (lambda d: d + b"x", "header announces"),
        (lambda d: d[:10], "shorter than the header"),
        (lambda d: b"XXXX" + d[4:], "bad magic"),
        (lambda d: d[:4] + b"\x02" + d[5:], "format version 2"),
    ],
    ids=["truncated", "padded", "header-cut", "magic", "version"],
)
def test_malformed_encodings_are_corrupt(mutate: object, match: str) -> None:
    """Truncated, padded, foreign or future-format bytes raise ObjectCorrupt."""
    with pytest.raises(ObjectCorrupt, match=match) as info:
        decode(mutate(encode(OBJ)), tier="disk", block_key=OBJ.block_key)  # type: ignore[operator]
    assert info.value.reason == "corrupt" and info.value.tier == "disk"


def test_a_ciphertext_shorter_than_a_tag_is_corrupt() -> None:
    """An object whose ciphertext cannot even hold the GCM tag does not parse."""
    data = encode(dataclasses.replace(OBJ, ciphertext=b"c" * 8))
    with pytest.raises(ObjectCorrupt):
        decode(data, tier="disk", block_key=OBJ.block_key)


def test_encode_refuses_fields_that_do_not_fit() -> None:
    """A block key over 255 bytes cannot be encoded (the sealer never makes one: a bug)."""
    with pytest.raises(InternalError):
        encode(dataclasses.replace(OBJ, block_key=b"k" * 256))
