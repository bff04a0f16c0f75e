"""Cache-key derivation: known answers, collision resistance of the encoding, secrets."""

from __future__ import annotations

import hmac
import json
from pathlib import Path

import pytest

from kvgov.exceptions import InvalidArgument, InvalidTokens, KeySecretError
from kvgov.govern.keys import (
    KeyDeriver,
    encode_extra_keys,
    load_key_secret,
    namespace_root,
    pack_tokens,
    scope_digest,
)

from .conftest import KEYCHAIN_IMPLS, make_scope

VECTORS = json.loads(
    (Path(__file__).parents[1] / "vectors" / "cache_keys.json").read_text(encoding="utf-8")
)


@pytest.mark.parametrize("impl", KEYCHAIN_IMPLS)
@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["name"])
def test_known_answer_vectors(case: dict, impl: str) -> None:  # type: ignore[type-arg]
    """Scope digest, namespace root and chained keys match vectors computed independently,
    in the compiled key chain and in Python."""
    scope = make_scope(**case["scope"])
    digest = scope_digest(scope)
    assert digest.hex() == case["scope_digest_hex"]
    root = namespace_root(case["namespace"]["kind"], case["namespace"]["name"])
    assert root.hex() == case["namespace_root_hex"]
    deriver = KeyDeriver(bytes.fromhex(case["secret_hex"]), implementation=impl)  # type: ignore[arg-type]
    assert deriver.implementation == impl
    packed = pack_tokens(case["tokens"])
    keys = deriver.derive_chain(root, packed, digest, case["block_size"], len(case["keys_hex"]))
    assert [k.hex() for k in keys] == case["keys_hex"]


def test_derive_key_is_hmac_sha256_of_parent_digest_and_tokens() -> None:
    """The single-block form equals the stdlib HMAC over the documented concatenation."""
    secret = bytes(range(40, 80))
    deriver = KeyDeriver(secret)
    parent = b"p" * 32
    digest = scope_digest(make_scope())
    tokens = pack_tokens([1, 2, 3, 4])
    expected = hmac.digest(secret, parent + digest + tokens, "sha256")
    assert deriver.derive_key(parent, tokens, digest) == expected


def test_length_prefixes_keep_separator_games_apart() -> None:
    """("a|b", "c") and ("a", "b|c") in adjacent fields give different digests."""
    one = make_scope(model="a|b", model_revision="c")
    two = make_scope(model="a", model_revision="b|c")
    assert scope_digest(one) != scope_digest(two)
    three = make_scope(model="a", model_revision="|b|c")
    assert scope_digest(three) not in {scope_digest(one), scope_digest(two)}


def test_no_adapter_differs_from_any_adapter() -> None:
    """None is encoded apart from every string."""
    base = make_scope()
    with_adapter = make_scope(adapter="none", adapter_revision="none")
    assert scope_digest(base) != scope_digest(with_adapter)


def test_tenant_is_in_the_namespace_not_the_digest() -> None:
    """Two tenants share a scope digest but never a namespace root."""
    assert scope_digest(make_scope(tenant="a")) == scope_digest(make_scope(tenant="b"))
    assert namespace_root("tenant", "a") != namespace_root("tenant", "b")
    assert namespace_root("tenant", "a") != namespace_root("group", "a")


def test_unicode_lookalike_tenants_have_distinct_namespaces() -> None:
    """Latin 'acme' and Cyrillic 'аcme' are different bytes, so different namespaces."""
    assert namespace_root("tenant", "acme") != namespace_root("tenant", "\u0430cme")


def test_keys_chain_over_the_whole_prefix() -> None:
    """Changing a token in block 0 changes the key of block 1."""
    deriver = KeyDeriver(b"s" * 32)
    digest = scope_digest(make_scope())
    root = namespace_root("tenant", "acme")
    a = deriver.derive_chain(root, pack_tokens([1, 2, 3, 4, 5, 6, 7, 8]), digest, 4, 2)
    b = deriver.derive_chain(root, pack_tokens([9, 2, 3, 4, 5, 6, 7, 8]), digest, 4, 2)
    assert a[1] != b[1]


def test_different_secrets_give_different_keys() -> None:
    """Keys are unreachable without the secret."""
    digest = scope_digest(make_scope())
    root = namespace_root("tenant", "acme")
    packed = pack_tokens([1, 2, 3, 4])
    assert KeyDeriver(b"a" * 32).derive_chain(root, packed, digest, 4, 1) != KeyDeriver(
        b"b" * 32
    ).derive_chain(root, packed, digest, 4, 1)


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], ["3"], "1234", None, [None]])
def test_bad_token_ids_are_refused(bad: object) -> None:
    """Negative, too large, non-int, or non-sequence token ids raise InvalidTokens."""
    with pytest.raises(InvalidTokens):
        pack_tokens(bad)  # type: ignore[arg-type]


def test_tokens_pack_little_endian_u32() -> None:
    """The token byte layout is little-endian u32."""
    assert pack_tokens([1, 2**32 - 1]) == b"\x01\x00\x00\x00\xff\xff\xff\xff"


def test_short_secret_is_refused() -> None:
    """A secret under 32 bytes raises KeySecretError and says how to make one."""
    with pytest.raises(KeySecretError, match="32 bytes"):
        KeyDeriver(b"short")


def test_secret_sources_in_order() -> None:
    """Argument first, then KVGOV_KEY_SECRET, then ephemeral, else refuse."""
    assert load_key_secret(b"x" * 32, ephemeral=False, environ={}) == b"x" * 32
    assert load_key_secret(None, ephemeral=False, environ={"KVGOV_KEY_SECRET": "e" * 40}) == (
        b"e" * 40
    )
    one = load_key_secret(None, ephemeral=True, environ={})
    two = load_key_secret(None, ephemeral=True, environ={})
    assert len(one) == 32 and one != two
    with pytest.raises(KeySecretError, match="KVGOV_KEY_SECRET"):
        load_key_secret(None, ephemeral=False, environ={})


def test_deriver_repr_hides_the_secret() -> None:
    """The secret never shows in a repr (logs, tracebacks)."""
    assert "kkkk" not in repr(KeyDeriver(b"k" * 32))


EXTRA_VECTORS = json.loads(
    (Path(__file__).parents[1] / "vectors" / "cache_keys_extra.json").read_text(encoding="utf-8")
)


def _from_json(value: object) -> object:
    """The vectors' JSON form back to Python: a list is a tuple, {bytes_hex} is bytes."""
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes_hex"])
    return value


@pytest.mark.parametrize("impl", KEYCHAIN_IMPLS)
@pytest.mark.parametrize("case", EXTRA_VECTORS["cases"], ids=lambda c: c["name"])
def test_extra_key_vectors(case: dict, impl: str) -> None:  # type: ignore[type-arg]
    """Extra keys encode and key blocks as the independently computed vectors say, in the
    compiled key chain and in Python."""
    scope = make_scope(**EXTRA_VECTORS["scope"])
    root = namespace_root(**EXTRA_VECTORS["namespace"])
    deriver = KeyDeriver(bytes.fromhex(EXTRA_VECTORS["secret_hex"]), implementation=impl)  # type: ignore[arg-type]
    extras = [encode_extra_keys(_from_json(e)) for e in case["extras"]]
    assert [e.hex() for e in extras] == case["extra_hex"]
    keys = deriver.derive_chain_extras(
        root,
        pack_tokens(EXTRA_VECTORS["tokens"]),
        scope_digest(scope),
        EXTRA_VECTORS["block_size"],
        extras,
    )
    assert [k.hex() for k in keys] == case["keys_hex"]


def test_blocks_without_extra_keys_key_as_the_native_cache_does() -> None:
    """No extra keys on any block: the same keys as derive_chain and cache_keys.json."""
    native = VECTORS["cases"][0]
    extra = EXTRA_VECTORS["cases"][0]
    assert all(e is None for e in extra["extras"])
    assert extra["keys_hex"] == native["keys_hex"]
    deriver = KeyDeriver(b"s" * 32)
    digest = scope_digest(make_scope())
    root = namespace_root("tenant", "acme")
    packed = pack_tokens(list(range(48)))
    assert deriver.derive_chain_extras(root, packed, digest, 16, [b"", b"", b""]) == (
        deriver.derive_chain(root, packed, digest, 16, 3)
    )


@pytest.mark.parametrize(
    ("one", "two"),
    [
        ((("mm", "img-a", 0),), (("mm", "img-b", 0),)),  # two images, same placeholders
        ((("mm", "img-a", 0),), (("mm", "img-a", 1),)),  # one image, two offsets
        ((("lora", "l", "/p1"),), (("lora", "l", "/p2"),)),  # a LoRA name re-pointed
        (
            (("cache_salt", "a|b"), ("cache_salt", "c")),
            (("cache_salt", "a"), ("cache_salt", "b|c")),
        ),
        (("1",), (1,)),  # a str and an int
        ((b"x",), ("x",)),  # bytes and a str
        (((1, 2), 3), (1, (2, 3))),  # nesting
        ((None,), ((),)),  # None and an empty tuple
        ((True,), (1,)),  # a bool and an int
    ],
)
def test_extra_key_encoding_is_injective(one: tuple[object, ...], two: tuple[object, ...]) -> None:
    """Extra keys a serving engine tells apart never encode alike."""
    assert encode_extra_keys(one) != encode_extra_keys(two)


def test_no_extra_keys_encode_to_nothing() -> None:
    """None and an empty tuple add nothing to the HMAC input."""
    assert encode_extra_keys(None) == encode_extra_keys(()) == b""


@pytest.mark.parametrize("bad", [(1.5,), (object(),), ({"a": 1},)])
def test_extra_keys_without_a_canonical_encoding_are_refused(bad: tuple[object, ...]) -> None:
    """A float, an object or a dict cannot be keyed safely: InvalidArgument."""
    with pytest.raises(InvalidArgument):
        encode_extra_keys(bad)


@pytest.mark.parametrize("bad", [("salt\ud800",), (("lora", "\udfff"),), (10**5000,)])
def test_extra_keys_a_client_can_break_are_refused(bad: tuple[object, ...]) -> None:
    """A lone surrogate (a client's cache salt, an adapter name) has no UTF-8 form and an
    int beyond Python's int-to-text limit no digits: InvalidArgument, not UnicodeEncodeError
    or ValueError, so the binding refuses the request instead of raising into vLLM."""
    with pytest.raises(InvalidArgument):
        encode_extra_keys(bad)
