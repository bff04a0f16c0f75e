"""What the binding keeps on a vLLM request, and the keyed block hasher that replaces vLLM's.

vLLM keeps a per-request block hasher (``Request._block_hasher``, see :mod:`.fence`) and extends
``request.block_hashes`` with it as tokens arrive; those hashes are the keys of
its prefix cache. The binding replaces it, at admission, with
:func:`governed_block_hasher`: kvgov's chain (:mod:`kvgov.govern.keys`) in the
request's publish namespace, under its scope digest, with vLLM's extra keys of
each block (LoRA, cache salt, multimodal items, prompt embeddings) appended::

    block_hashes[i] = CacheKey_i = HMAC-SHA256(secret, parent || ScopeDigest
                                               || tokens_i || ExtraKeys_i)
    parent = NamespaceRoot (block 0) or block_hashes[i - 1]

A request with a public prefix (``kvgov_public_prefix_tokens``, signed by the front end)
keys its first P full blocks under the public scope (its classification ``public``)
from the namespace that scope publishes in, and block P on from
``continuation_root(NamespaceRoot, block_hashes[P - 1])`` under its own scope, as
kvgov's own cache does (:mod:`kvgov.govern.plan`).

so equal prompts in different scopes never share a hash, and a block without
extra keys hashes exactly as in kvgov's own cache. With lookahead hashing (vLLM
0.33's EAGLE/MTP drafters: ``num_hash_lookahead_tokens`` L > 0) a block is keyed
once the L tokens after it exist, and its extra keys are vLLM's lookahead ones,
``(ExtraKeys over the block and those tokens, *those tokens)``: the drafter's KV
at the block's last position depends on them, so two continuations never share it.
vLLM's own hash (sha256 by default) does not run in addition: the general plugin gives the engine a
hasher that hashes nothing (:func:`deferred_block_hasher`).
"""

from __future__ import annotations

from typing import Any

from kvgov.exceptions import InternalError

from ..keys import CacheKey, ScopeDigest, continuation_root, encode_extra_keys, pack_tokens
from . import fence
from .request_state import RequestGovernance

__all__ = ["deferred_block_hasher", "governed_block_hasher", "has_extra_keys"]


def has_extra_keys(request: Any) -> bool:
    """Whether vLLM adds extra keys to some block of the request's hash."""
    return bool(
        request.mm_features
        or request.lora_request
        or request.cache_salt
        or request.prompt_embeds is not None
    )


def governed_block_hasher(request: Any) -> list[CacheKey]:
    """vLLM's hasher contract: the hashes of the request's full blocks not hashed yet.

    A request with a public prefix (:attr:`RequestGovernance.prefix_blocks` > 0) keys
    its first blocks under the public scope's digest from the prefix's root, and
    the rest from ``continuation_root(root, <the prefix's last key>)`` under its own
    scope's (the layout of :mod:`kvgov.govern.plan`).

    Args:
        request: a vLLM ``Request`` the binding admitted (its governance set).

    Returns:
        One :class:`~kvgov.govern.keys.CacheKey` per new full block; none once the
        request may cache nothing more.
    """
    state = fence.governance_of(request)
    if state is None or not state.cacheable:
        return []
    bs = state.block_size
    hashes = request.block_hashes
    done = len(hashes)
    count = (request.num_tokens - state.lookahead - done * bs) // bs
    if count <= 0:
        return []
    prefix = state.prefix_blocks
    if done >= prefix:  # past the public prefix (or none): one chain in the scope's digest
        if not hashes:
            parent = state.root
        elif done == prefix:
            parent = continuation_root(state.root, hashes[-1])
        else:
            parent = hashes[-1]
        return _derive(request, state, parent, done, count, state.view.digest)
    if state.prefix_view is None:  # a prefix always has its view (RequestGovernance)
        raise InternalError("a public prefix without its scope")
    first = min(count, prefix - done)
    parent = hashes[-1] if hashes else state.prefix_root
    keys = _derive(request, state, parent, done, first, state.prefix_view.digest)
    if count > first:
        parent = continuation_root(state.root, keys[-1])
        keys += _derive(request, state, parent, prefix, count - first, state.view.digest)
    return keys


def _derive(
    request: Any,
    state: RequestGovernance,
    parent: bytes,
    block: int,
    count: int,
    digest: ScopeDigest,
) -> list[CacheKey]:
    """The keys of ``count`` full blocks from block ``block``, chained from ``parent``."""
    bs = state.block_size
    start = block * bs
    tokens = request.all_token_ids
    packed = pack_tokens(tokens[start : start + count * bs])
    ahead = state.lookahead
    if not state.has_extra and not ahead:
        return state.deriver.derive_chain(parent, packed, digest, bs, count)
    extras = []
    mm_index = 0
    for i in range(count):
        first = start + i * bs
        end = first + bs
        if ahead:
            keys, mm_index = fence.lookahead_extra_keys(request, first, end, end + ahead, mm_index)
            extras.append(encode_extra_keys((keys, *tokens[end : end + ahead])))
        else:
            keys, mm_index = fence.block_extra_keys(request, first, end, mm_index)
            extras.append(encode_extra_keys(keys))
    return state.deriver.derive_chain_extras(parent, packed, digest, bs, extras)


def deferred_block_hasher(request: Any) -> list[CacheKey]:
    """The engine's hasher under the plugin: hashes nothing, so a request is hashed once.

    vLLM hashes a request when it builds it (in the engine's input thread); under
    the governed scheduler those hashes would be thrown away at admission, where
    the request is hashed in its namespace. Returns ``[]``.
    """
    return []
