"""AES-GCM sealing: the documented layout (known answer), AAD binding, nonce discipline."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kvgov.exceptions import DataKeyDestroyed, InternalError, ObjectTampered
from kvgov.offload.crypto import DataKey, associated_data, open_sealed, seal
from kvgov.offload.objects import SealedBlock, decode, encode

VECTOR = json.loads((Path(__file__).parents[1] / "vectors" / "offload_seal.json").read_text())
ARGS: dict[str, Any] = {
    "tier": "host",
    "block_key": b"K" * 32,
    "scope_digest": b"S" * 32,
    "deadline_us": 2_000_000,
    "written_us": 1_000_000,
}


def _b(name: str) -> bytes:
    return bytes.fromhex(VECTOR[name])


def _key(**kw: Any) -> DataKey:
    return DataKey(b"i" * 16, "acme", b"k" * 32, **kw)


def _lp(raw: bytes, width: int = 1) -> bytes:
    return len(raw).to_bytes(width, "big") + raw


def test_known_answer_aad_subkey_and_ciphertext() -> None:
    """The vector's AAD, HKDF subkey and ciphertext follow the documented layout exactly."""
    v, exp = VECTOR, VECTOR["expected"]
    aad = (b"kvgov.offload.v1\x00" + bytes([1]) + _lp(v["tier"].encode()) + _lp(_b("block_key"))
           + _lp(_b("scope_digest")) + _lp(v["tenant"].encode(), 2) + _b("key_id") + _b("salt")
           + struct.pack(">qq", v["deadline_us"], v["written_us"]))  # fmt: skip
    assert aad.hex() == exp["aad"]
    assert associated_data(
        tier=v["tier"], block_key=_b("block_key"), scope_digest=_b("scope_digest"),
        tenant=v["tenant"], key_id=_b("key_id"), salt=_b("salt"),
        deadline_us=v["deadline_us"], written_us=v["written_us"],
    ) == aad  # fmt: skip
    subkey = HKDF(hashes.SHA256(), 32, _b("salt"), b"kvgov.offload.v1 aes-256-gcm").derive(
        _b("data_key")
    )
    assert subkey.hex() == exp["subkey"]
    nonce = v["nonce_counter"].to_bytes(12, "big")
    assert AESGCM(subkey).encrypt(nonce, _b("payload"), aad).hex() == exp["ciphertext"]


def test_known_answer_object_opens_with_the_data_key() -> None:
    """The vector's encoded object decodes and opens to its payload under its data key."""
    v = VECTOR
    obj = decode(bytes.fromhex(v["expected"]["encoded"]), tier=v["tier"], block_key=_b("block_key"))
    key = DataKey(_b("key_id"), v["tenant"], _b("data_key"))
    plain = open_sealed(key, obj, tier=v["tier"], block_key=_b("block_key"),
                        scope_digest=_b("scope_digest"))  # fmt: skip
    assert plain == _b("payload")


def test_seal_then_open_round_trips() -> None:
    """What seal makes, open_sealed opens, for the same tier, key and scope."""
    key = _key()
    obj = seal(key, payload=b"kv" * 100, **ARGS)
    assert obj.tenant == "acme" and obj.key_id == b"i" * 16 and obj.payload_bytes == 200
    plain = open_sealed(key, obj, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32)
    assert plain == b"kv" * 100


@pytest.mark.parametrize(
    "change",
    [
        {"tier": "disk"},
        {"block_key": b"X" * 32},
        {"scope_digest": b"X" * 32},
    ],
    ids=["tier", "block_key", "scope"],
)
def test_the_aad_binds_where_the_object_is_opened(change: dict[str, Any]) -> None:
    """Opening as another tier, block key or scope fails authentication."""
    key = _key()
    obj = seal(key, payload=b"p" * 64, **ARGS)
    where = {"tier": "host", "block_key": b"K" * 32, "scope_digest": b"S" * 32} | change
    with pytest.raises(ObjectTampered):
        open_sealed(key, obj, **where)


@pytest.mark.parametrize(
    "change",
    [
        {"deadline_us": 3_000_000},
        {"written_us": 1_500_000},
        {"salt": b"z" * 16},
        {"nonce": b"z" * 12},
        {"key_id": b"z" * 16},
        {"format_version": 2},
    ],
    ids=lambda c: next(iter(c)),
)
def test_the_aad_binds_the_header(change: dict[str, Any]) -> None:
    """A changed deadline, write time, salt, nonce, key id or version fails authentication."""
    key = _key()
    obj = dataclasses.replace(seal(key, payload=b"p" * 64, **ARGS), **change)
    with pytest.raises(ObjectTampered):
        open_sealed(key, obj, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32)


def test_another_tenants_key_does_not_open_an_object() -> None:
    """The tenant is in the AAD and the key differs: another tenant's key fails."""
    obj = seal(_key(), payload=b"p" * 64, **ARGS)
    other = DataKey(b"i" * 16, "beta", b"k" * 32)
    with pytest.raises(ObjectTampered):
        open_sealed(other, obj, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32)


def _tampered(obj: SealedBlock) -> SealedBlock:
    """``obj`` with the low bit of its first ciphertext byte flipped: always a change
    (writing a constant byte is none when the byte already holds it, 1 run in 256)."""
    data = bytearray(obj.ciphertext)
    data[0] ^= 0x01
    return dataclasses.replace(obj, ciphertext=bytes(data))


def _open_into_fails_and_zeroes(key: DataKey, obj: SealedBlock) -> None:
    """Opening ``obj`` (a 64-byte payload) into a buffer fails and leaves the buffer zero."""
    buf = bytearray(b"\xff" * 64)
    with pytest.raises(ObjectTampered):
        open_sealed(key, obj, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32,
                    into=memoryview(buf))  # fmt: skip
    assert buf == bytes(len(buf))


def test_a_failed_open_into_a_buffer_zeroes_it() -> None:
    """Unauthenticated plaintext never stays in the caller's buffer."""
    key = _key()
    _open_into_fails_and_zeroes(key, _tampered(seal(key, payload=b"p" * 64, **ARGS)))


def test_tampering_changes_a_ciphertext_whose_first_byte_is_zero() -> None:
    """The tampering of the test above is a change whatever the byte was: on an object
    whose first ciphertext byte is 0 (sealed until one is: each seal takes the next nonce,
    so its own keystream)."""
    key = _key()
    obj = seal(key, payload=b"p" * 64, **ARGS)
    for _ in range(20_000):  # a zero first byte comes 1 in 256: missing it 20,000 times, ~1e-34
        if obj.ciphertext[0] == 0:
            break
        obj = seal(key, payload=b"p" * 64, **ARGS)
    assert obj.ciphertext[0] == 0, "no object with a zero first byte was sealed"
    bad = _tampered(obj)
    assert bad.ciphertext != obj.ciphertext
    _open_into_fails_and_zeroes(key, bad)


def test_nonces_count_up_within_a_session() -> None:
    """One session: one salt, nonces 0, 1, 2 as 96-bit big-endian counters."""
    key = _key()
    objs = [seal(key, payload=b"p", **ARGS) for _ in range(3)]
    assert len({o.salt for o in objs}) == 1
    assert [int.from_bytes(o.nonce, "big") for o in objs] == [0, 1, 2]


def test_a_session_ends_at_its_message_bound() -> None:
    """After max_messages objects a new salt (a new subkey) starts, its counter at 0."""
    key = _key(max_messages=2)
    objs = [seal(key, payload=b"p", **ARGS) for _ in range(5)]
    assert [int.from_bytes(o.nonce, "big") for o in objs] == [0, 1, 0, 1, 0]
    assert len({o.salt for o in objs}) == 3
    for o in objs:  # every session's objects still open
        open_sealed(key, o, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32)


def test_a_forked_child_starts_its_own_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed process id never continues the parent's counter under the parent's salt."""
    key = _key()
    parent = seal(key, payload=b"p", **ARGS)
    monkeypatch.setattr("os.getpid", lambda: -1)
    child = seal(key, payload=b"p", **ARGS)
    assert child.salt != parent.salt and child.nonce == bytes(12)


def test_two_processes_holding_one_key_use_different_subkeys() -> None:
    """Two DataKeys with the same material (two workers) seal under different salts."""
    a, b = _key(), _key()
    oa, ob = seal(a, payload=b"p", **ARGS), seal(b, payload=b"p", **ARGS)
    assert oa.nonce == ob.nonce and oa.salt != ob.salt
    assert open_sealed(b, oa, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32) == b"p"


def test_a_wiped_key_refuses_to_seal_and_open() -> None:
    """After wipe() the key bytes are zero and every use raises DataKeyDestroyed."""
    key = _key()
    obj = seal(key, payload=b"p", **ARGS)
    key.wipe()
    assert key.wiped and "material=<hidden>" in repr(key)
    with pytest.raises(DataKeyDestroyed):
        seal(key, payload=b"p", **ARGS)
    with pytest.raises(DataKeyDestroyed):
        open_sealed(key, obj, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32)


def test_sealed_objects_survive_encoding() -> None:
    """A sealed object opens after encode/decode (what the disk and Redis tiers do)."""
    key = _key()
    obj = seal(key, payload=b"kv" * 10, **ARGS)
    back = decode(encode(obj), tier="host", block_key=b"K" * 32)
    assert isinstance(back, SealedBlock)
    assert open_sealed(key, back, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32) == (
        b"kv" * 10
    )


def test_a_sealed_object_is_encoded_in_its_own_buffer_byte_for_byte() -> None:
    """The sealer encrypts straight into the encoded object: encode() returns that buffer,
    byte-identical to the layout joined field by field, and an object replaced from it
    (another ciphertext, another header) never carries the stale buffer."""
    obj = seal(_key(), payload=b"kv" * 300, **ARGS)
    fast = encode(obj)
    assert isinstance(fast, memoryview) and fast.readonly
    joined = encode(dataclasses.replace(obj))  # no buffer: joined from the fields
    assert isinstance(joined, bytes) and bytes(fast) == joined
    back = decode(fast, tier=ARGS["tier"], block_key=ARGS["block_key"])
    opened = open_sealed(_key(), back, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32)
    assert back == obj and opened == b"kv" * 300
    other = dataclasses.replace(obj, deadline_us=obj.deadline_us + 1)
    assert other.encoded is None and bytes(encode(other)) != bytes(fast)


def test_a_sealed_object_can_be_built_at_the_start_of_a_callers_buffer() -> None:
    """seal(buffer=...) writes the object at the start of a larger buffer (the store's
    reused one): encode() is a view of exactly the object there, it opens, and the bytes
    after it are left alone; a buffer too short for the object is refused."""
    buffer = bytearray(b"\xee" * 1000)
    obj = seal(_key(), payload=b"kv" * 300, buffer=buffer, **ARGS)
    fast = encode(obj)
    assert isinstance(fast, memoryview) and fast.obj is buffer and fast.nbytes == obj.nbytes
    assert bytes(fast) == bytes(encode(dataclasses.replace(obj)))  # the documented layout
    assert buffer[obj.nbytes :] == b"\xee" * (1000 - obj.nbytes)
    back = decode(fast, tier="host", block_key=b"K" * 32)
    assert open_sealed(_key(), back, tier="host", block_key=b"K" * 32, scope_digest=b"S" * 32) == (
        b"kv" * 300
    )
    with pytest.raises(InternalError, match="cannot hold"):
        seal(_key(), payload=b"kv" * 300, buffer=bytearray(obj.nbytes - 1), **ARGS)
