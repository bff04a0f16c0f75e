"""The governed tree namespace (pure logic: runs in make test, no SGLang)."""

from __future__ import annotations

import pytest

from kvgov.exceptions import InvalidArgument
from kvgov.govern import CacheScope
from kvgov.govern.keys import namespace_root, scope_digest
from kvgov.govern.sglang import is_tree_namespace, tree_namespace


def _scope(tenant: str = "acme", adapter: str | None = None) -> CacheScope:
    return CacheScope(
        tenant=tenant,
        classification="internal",
        model="m",
        model_revision="r",
        tokenizer="t",
        tokenizer_revision="r",
        template_version="v1",
        adapter=adapter,
        adapter_revision=adapter,
    )


def _ns(scope: CacheScope, extra_key: str | None = None, salt: str | None = None) -> str:
    root = bytes(namespace_root("tenant", scope.tenant))
    return tree_namespace(root, bytes(scope_digest(scope)), extra_key, salt)


def test_a_namespace_is_stable_and_well_formed() -> None:
    ns = _ns(_scope())
    assert ns == _ns(_scope()) and is_tree_namespace(ns)


def test_the_lora_join_collision_of_sglang_is_impossible() -> None:
    # SGLang keys an adapter request by extra_key + lora_id, joined with no separator: a base
    # request whose extra_key is "x" + "lora1" reads the adapter's tree. Here the adapter is in
    # the scope digest, so the same joined string lands in different namespaces.
    base = _ns(_scope(), extra_key="xlora1")
    adapter = _ns(_scope(adapter="lora1"), extra_key="x" + "lora1")
    assert base != adapter


def test_client_fields_are_length_prefixed_not_joined() -> None:
    assert _ns(_scope(), "ab", "c") != _ns(_scope(), "a", "bc")
    assert _ns(_scope(), None, None) != _ns(_scope(), "", "x")


def test_client_fields_never_reach_another_tenant() -> None:
    a, b = _scope("acme"), _scope("globex")
    assert {_ns(a, k, s) for k in (None, "k") for s in (None, "s")}.isdisjoint(
        {_ns(b, k, s) for k in (None, "k") for s in (None, "s")}
    )


def test_bad_input_is_refused() -> None:
    digest = bytes(scope_digest(_scope()))
    with pytest.raises(InvalidArgument):
        tree_namespace(b"short", digest, None, None)
    with pytest.raises(InvalidArgument):
        tree_namespace(bytes(32), digest, 5, None)
    with pytest.raises(InvalidArgument):
        tree_namespace(bytes(32), digest, "\ud800", None)


def test_a_retired_namespace_never_comes_back() -> None:
    # an erasure moves a namespace root to its next generation: a held page of the old
    # namespace is never matched by a request admitted after it
    scope = _scope()
    root, digest = bytes(namespace_root("tenant", scope.tenant)), bytes(scope_digest(scope))
    names = [tree_namespace(root, digest, "k", None, generation=g) for g in range(3)]
    assert names[0] == _ns(scope, "k") and len(set(names)) == 3
    assert all(map(is_tree_namespace, names))
    for bad in (-1, True, "1"):
        with pytest.raises(InvalidArgument):
            tree_namespace(root, digest, None, None, generation=bad)  # type: ignore[arg-type]
