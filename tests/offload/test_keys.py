"""The KEK, wrapped data keys, and the ring that creates, caches and destroys them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvgov.exceptions import DataKeyDestroyed, KEKError, ObjectMisbound
from kvgov.offload import DataKeyRing, LocalKEK
from kvgov.offload.keys import wrap_context
from tests.support.clock import FakeClock
from tests.support.offload import MemoryKeyStore

from .conftest import KEK

HEX = "ab" * 32


def test_kek_from_env_hex() -> None:
    """KVGOV_KEK holds 64 hex characters; the kek id is stable and reveals nothing."""
    kek = LocalKEK.from_env({"KVGOV_KEK": HEX})
    assert kek.kek_id == LocalKEK(bytes.fromhex(HEX)).kek_id
    assert kek.kek_id.startswith("local:") and HEX not in kek.kek_id and HEX not in repr(kek)


def test_kek_from_env_file(tmp_path: Path) -> None:
    """KVGOV_KEK_FILE names a 0600 file of 32 raw bytes or 64 hex characters."""
    raw, text = tmp_path / "raw", tmp_path / "hex"
    raw.write_bytes(bytes.fromhex(HEX))
    text.write_text(HEX + "\n")
    for p in (raw, text):
        p.chmod(0o600)
        assert LocalKEK.from_env({"KVGOV_KEK_FILE": str(p)}).kek_id == LocalKEK.from_hex(HEX).kek_id


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_kek_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    """A KEK file others may read is refused with the chmod to run."""
    p = tmp_path / "kek"
    p.write_text(HEX)
    p.chmod(0o644)
    with pytest.raises(KEKError, match="chmod 600"):
        LocalKEK.from_file(p)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({}, "none configured"),
        ({"KVGOV_KEK": "abc"}, "64 hex characters"),
        ({"KVGOV_KEK": "ab" * 16}, "exactly 32 bytes"),
        ({"KVGOV_KEK_FILE": "/nonexistent/kek"}, "cannot read"),
    ],
    ids=["missing", "not-hex", "short", "no-file"],
)
def test_bad_kek_configuration_says_how_to_fix_it(env: dict[str, str], match: str) -> None:
    """Missing or malformed KEKs raise KEKError naming what to set."""
    with pytest.raises(KEKError, match=match):
        LocalKEK.from_env(env)


def test_wrap_is_bound_to_tenant_and_key_id() -> None:
    """A wrapped key opens only under its own context, and only with its own KEK."""
    wrapped = KEK.wrap(b"d" * 32, wrap_context("acme", b"i" * 16))
    assert KEK.unwrap(wrapped, wrap_context("acme", b"i" * 16)) == b"d" * 32
    with pytest.raises(KEKError):
        KEK.unwrap(wrapped, wrap_context("beta", b"i" * 16))
    with pytest.raises(KEKError):
        LocalKEK(b"x" * 32).unwrap(wrapped, wrap_context("acme", b"i" * 16))


def test_ring_creates_one_key_per_tenant_and_reuses_it(
    key_store: MemoryKeyStore, clock: FakeClock
) -> None:
    """The first sealing key of a tenant is created and recorded wrapped; later calls reuse it."""
    ring = DataKeyRing(key_store, KEK, clock=clock)
    a = ring.sealing_key("acme")
    assert ring.sealing_key("acme") is a and ring.sealing_key("beta").key_id != a.key_id
    row = key_store.get(a.key_id.hex())
    assert row.tenant == "acme" and row.kek_id == KEK.kek_id and row.wrapped is not None
    assert bytes(a._material) not in row.wrapped


def test_two_rings_converge_on_one_key(key_store: MemoryKeyStore, clock: FakeClock) -> None:
    """Two workers' rings seal a tenant's blocks under the same key id."""
    a = DataKeyRing(key_store, KEK, clock=clock).sealing_key("acme")
    b = DataKeyRing(key_store, KEK, clock=clock).sealing_key("acme")
    assert a.key_id == b.key_id and a is not b


def test_opening_key_checks_the_tenant(key_store: MemoryKeyStore, clock: FakeClock) -> None:
    """An object naming another tenant's key is misbound, from cache or from the store."""
    ring = DataKeyRing(key_store, KEK, clock=clock)
    kid = ring.sealing_key("acme").key_id
    with pytest.raises(ObjectMisbound):
        ring.opening_key("beta", kid, tier="t", block_key=b"k")
    fresh = DataKeyRing(key_store, KEK, clock=clock)
    with pytest.raises(ObjectMisbound):
        fresh.opening_key("beta", kid, tier="t", block_key=b"k")
    assert fresh.opening_key("acme", kid, tier="t", block_key=b"k").tenant == "acme"


def test_unknown_key_id_is_refused(key_store: MemoryKeyStore, clock: FakeClock) -> None:
    """A key id the store never recorded is refused like a destroyed one."""
    ring = DataKeyRing(key_store, KEK, clock=clock)
    with pytest.raises(DataKeyDestroyed, match="never recorded"):
        ring.opening_key("acme", b"z" * 16, tier="t", block_key=b"k")


def test_destroy_wipes_and_forgets(key_store: MemoryKeyStore, clock: FakeClock) -> None:
    """destroy() erases the wrapped key, wipes the cached one; the next sealing key is new."""
    ring = DataKeyRing(key_store, KEK, clock=clock)
    key = ring.sealing_key("acme")
    assert ring.destroy("acme") == (key.key_id.hex(),)
    assert key.wiped and key_store.get(key.key_id.hex()).wrapped is None
    with pytest.raises(DataKeyDestroyed, match="crypto-shredded"):
        ring.opening_key("acme", key.key_id, tier="t", block_key=b"k")
    assert ring.sealing_key("acme").key_id != key.key_id
    assert ring.destroy("nobody") == ()


def test_another_workers_destroy_takes_effect_after_the_recheck(
    key_store: MemoryKeyStore, clock: FakeClock
) -> None:
    """A ring trusts a cached key for recheck_seconds, then sees the destruction."""
    a = DataKeyRing(key_store, KEK, clock=clock, recheck_seconds=5)
    b = DataKeyRing(key_store, KEK, clock=clock, recheck_seconds=5)
    kid = a.sealing_key("acme").key_id
    b.opening_key("acme", kid, tier="t", block_key=b"k")
    a.destroy("acme")
    clock.advance(4.9)
    b.opening_key("acme", kid, tier="t", block_key=b"k")  # within the documented window
    clock.advance(0.2)
    with pytest.raises(DataKeyDestroyed):
        b.opening_key("acme", kid, tier="t", block_key=b"k")
    assert b.sealing_key("acme").key_id != kid


def test_a_key_wrapped_by_another_kek_is_refused(
    key_store: MemoryKeyStore, clock: FakeClock
) -> None:
    """A worker with a different KEK cannot use the fleet's keys and is told why."""
    DataKeyRing(key_store, KEK, clock=clock).sealing_key("acme")
    with pytest.raises(KEKError, match="same KEK"):
        DataKeyRing(key_store, LocalKEK(b"x" * 32), clock=clock).sealing_key("acme")
