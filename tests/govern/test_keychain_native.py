"""The compiled key chain (govern/_keychain.c) against its specification, the pure path.

``KeyDeriver`` uses ``kvgov.govern._keychain`` where it is installed; every key it
derives there must be the pure path's key byte for byte, for every secret length (a
secret over 64 bytes is hashed first), block size, offset and extra key, and a bad
argument must be refused the same way by both.
"""

from __future__ import annotations

import copy
import hmac
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgov.exceptions import InvalidArgument
from kvgov.govern import GovernedKVCache, keys
from kvgov.govern.keys import KeyDeriver, ScopeDigest, pack_tokens
from tests.support.native import native_keychain_skip, native_keychain_unbuildable

from .conftest import KEYCHAIN_IMPLS

_WHY = native_keychain_skip()
needs_native = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


def test_the_compiled_chain_is_installed_where_it_can_be_built() -> None:
    """setup.py builds it wherever a C compiler and OpenSSL's headers are present."""
    if not keys.NATIVE_KEYCHAIN:
        assert native_keychain_unbuildable() is not None, (
            "this machine can build kvgov.govern._keychain but the install did not: "
            "reinstall kvgov (make install) and read what the build printed"
        )
    assert KeyDeriver(b"s" * 32).implementation == ("native" if keys.NATIVE_KEYCHAIN else "python")


@needs_native
@settings(max_examples=150, deadline=None)
@given(
    secret=st.binary(min_size=32, max_size=160),
    parent=st.binary(min_size=0, max_size=40),
    digest=st.binary(min_size=32, max_size=32),
    block_size=st.integers(min_value=1, max_value=32),
    blocks=st.integers(min_value=0, max_value=12),
    first=st.integers(min_value=0, max_value=4),
    data=st.data(),
)
def test_native_and_python_chains_are_the_same_keys(
    secret: bytes,
    parent: bytes,
    digest: bytes,
    block_size: int,
    blocks: int,
    first: int,
    data: st.DataObject,
) -> None:
    """Same keys byte for byte, with and without extra keys, from any first block."""
    count = max(0, blocks - first)  # 0 from past the end too: an empty chain
    tokens = data.draw(
        st.lists(
            st.integers(min_value=0, max_value=2**32 - 1),
            min_size=blocks * block_size,
            max_size=blocks * block_size + block_size - 1,  # a partial tail is not keyed
        )
    )
    extras = data.draw(st.lists(st.binary(max_size=70), min_size=count, max_size=count))
    packed = pack_tokens(tokens)
    native = KeyDeriver(secret, implementation="native")
    python = KeyDeriver(secret, implementation="python")
    args = (parent, packed, ScopeDigest(digest), block_size)
    chain = native.derive_chain(*args, count, first=first)
    assert chain == python.derive_chain(*args, count, first=first)
    assert all(type(k) is bytes and len(k) == 32 for k in chain)
    assert native.derive_chain_extras(*args, extras, first=first) == python.derive_chain_extras(
        *args, extras, first=first
    )
    if count:  # block `first` is HMAC(secret, parent || digest || its tokens)
        step = 4 * block_size
        block = packed[first * step : (first + 1) * step]
        assert chain[0] == hmac.digest(secret, parent + digest + block, "sha256")


@pytest.mark.parametrize("impl", KEYCHAIN_IMPLS)
@pytest.mark.parametrize(
    ("count", "first"),
    [(4, 0), (2, 2), (1, 3), (-1, 0), (1, -1)],
    ids=["one-too-many", "from-2", "first-past-the-end", "negative-count", "negative-first"],
)
def test_a_chain_past_the_tokens_is_refused(impl: str, count: int, first: int) -> None:
    """3 full blocks: no chain reaches past them (a short slice would key a partial block)."""
    deriver = KeyDeriver(b"s" * 32, implementation=impl)  # type: ignore[arg-type]
    packed = pack_tokens(list(range(3 * 4 + 2)))
    digest = ScopeDigest(b"d" * 32)
    with pytest.raises(InvalidArgument):
        deriver.derive_chain(b"p" * 32, packed, digest, 4, count, first=first)
    if count >= 0:  # the extras' count is their length
        with pytest.raises(InvalidArgument):
            deriver.derive_chain_extras(b"p" * 32, packed, digest, 4, [b""] * count, first=first)


@pytest.mark.parametrize("impl", KEYCHAIN_IMPLS)
def test_extra_keys_that_are_not_bytes_are_refused(impl: str) -> None:
    """An extra-key entry must be encode_extra_keys' bytes, in either implementation."""
    deriver = KeyDeriver(b"s" * 32, implementation=impl)  # type: ignore[arg-type]
    packed = pack_tokens(list(range(8)))
    with pytest.raises(InvalidArgument):
        deriver.derive_chain_extras(b"p", packed, ScopeDigest(b"d" * 32), 4, [b"", "x"])  # type: ignore[list-item]


def test_an_unknown_implementation_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        KeyDeriver(b"s" * 32, implementation="fast")  # type: ignore[arg-type]


def test_native_where_it_is_not_installed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """implementation="native" never falls back to Python without a word; "auto" does."""
    monkeypatch.setattr(keys, "_native_chain", None)
    with pytest.raises(InvalidArgument, match="not installed"):
        KeyDeriver(b"s" * 32, implementation="native")
    assert KeyDeriver(b"s" * 32).implementation == "python"


@needs_native
def test_the_compiled_chain_does_not_give_its_secret_away() -> None:
    """No repr, pickle or copy of the object that holds the pad states."""
    chain = KeyDeriver(b"secret-" * 8, implementation="native")._native
    assert "secret-" not in repr(chain)
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError):
            attempt(chain)
    public = {name for name in dir(chain) if not name.startswith("_")}
    assert public == {"derive_chain", "derive_chain_extras"}


def test_the_setting_reads_kvgov_keychain() -> None:
    """Unset or blank is auto; a typo is refused, never read as auto."""
    assert keys.keychain_setting({}) == "auto"
    assert keys.keychain_setting({"KVGOV_KEYCHAIN": " "}) == "auto"
    for value in ("auto", "native", "python"):
        assert keys.keychain_setting({"KVGOV_KEYCHAIN": value}) == value
    with pytest.raises(InvalidArgument, match="KVGOV_KEYCHAIN"):
        keys.keychain_setting({"KVGOV_KEYCHAIN": "c"})


@pytest.mark.parametrize("impl", KEYCHAIN_IMPLS)
def test_a_governed_cache_uses_the_chain_the_setting_names_through_a_rotation(
    make_cache: Callable[..., GovernedKVCache], monkeypatch: pytest.MonkeyPatch, impl: str
) -> None:
    """KVGOV_KEYCHAIN reaches the cache's deriver, and a secret rotation keeps it."""
    monkeypatch.setenv("KVGOV_KEYCHAIN", impl)
    cache = make_cache()
    gov = cache.governor
    assert gov.deriver.implementation == impl
    gov.rotate_secret(b"n" * 32, live=[])
    assert gov.deriver.implementation == impl


def test_a_bad_setting_stops_the_cache_before_it_opens_anything(
    make_cache: Callable[..., GovernedKVCache],
    monkeypatch: pytest.MonkeyPatch,
    audit_url: str,
) -> None:
    monkeypatch.setenv("KVGOV_KEYCHAIN", "fastest")
    with pytest.raises(InvalidArgument, match="KVGOV_KEYCHAIN"):
        make_cache()
    assert not Path(audit_url.removeprefix("sqlite:///")).exists()
