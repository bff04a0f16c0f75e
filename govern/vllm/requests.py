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

so equal prompts in different scopes never share a hash, and a block without
extra keys hashes exactly as in kvgov's own cache. vLLM's own hash (sha256 by
default) does not run in addition: the general plugin gives the engine a
hasher that hashes nothing (:func:`deferred_block_hasher`).
"""

from __future__ import annotations

from typing import Any

from kvgov.policy import AdmissionDecision

from ..keys import CacheKey, KeyDeriver, encode_extra_keys, pack_tokens
from ..plan import KeyPlan
from ..scope import CacheScope
from ..views import ScopeView
from . import fence

__all__ = ["RequestGovernance", "deferred_block_hasher", "governed_block_hasher"]


class RequestGovernance:
    """The governance of one vLLM request (kept on it: :func:`.fence.governance_of`).

    Fields are set at admission (``add_request``); the binding changes
    ``admitted`` and ``granted``, erasure clears ``cacheable``. It is what
    :class:`~kvgov.govern.governor.RunningSequence` asks of a running sequence.
    """

    __slots__ = (
        "adm",
        "admitted",
        "block_size",
        "cacheable",
        "deriver",
        "granted",
        "has_extra",
        "num_tokens",
        "plan",
        "root",
        "seq_id",
        "shared",
        "view",
    )

    def __init__(
        self,
        *,
        seq_id: str,
        num_tokens: int,
        view: ScopeView,
        adm: AdmissionDecision,
        plan: KeyPlan,
        deriver: KeyDeriver,
        block_size: int,
        has_extra: bool,
    ) -> None:
        self.seq_id = seq_id  # vLLM's request id
        self.num_tokens = num_tokens  # prompt tokens at admission
        self.view = view  # the scope it was admitted under
        self.adm = adm  # the admission decision
        self.plan = plan  # namespaces and retention only (no keys: the hasher derives them)
        self.deriver = deriver  # the secret's deriver at admission (a rotation stops caching)
        self.block_size = block_size  # tokens per hashed block
        self.has_extra = has_extra  # LoRA, salt, multimodal or embeddings: extra keys per block
        self.root = plan.root  # the publish namespace: the only one a request reads (one chain)
        self.shared = plan.root != view.own_root  # publishes in a share group: hits are judged
        self.cacheable = plan.cacheable  # admission said cache; purge/invalidate/rotate clear it
        self.admitted = False  # its admission event is written (at its first allocation)
        self.granted: dict[Any, Any] = {}  # the sharing decisions of its last judged lookup

    @property
    def scope(self) -> CacheScope:
        """The scope it was admitted under."""
        return self.view.scope


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
    start = len(hashes) * bs
    count = (request.num_tokens - start) // bs
    if count <= 0:
        return []
    parent = hashes[-1] if hashes else state.root
    packed = pack_tokens(request.all_token_ids[start : start + count * bs])
    digest = state.view.digest
    if not state.has_extra:
        return state.deriver.derive_chain(parent, packed, digest, bs, count)
    extras = []
    mm_index = 0
    for i in range(count):
        first = start + i * bs
        keys, mm_index = fence.block_extra_keys(request, first, first + bs, mm_index)
        extras.append(encode_extra_keys(keys))
    return state.deriver.derive_chain_extras(parent, packed, digest, bs, extras)


def deferred_block_hasher(request: Any) -> list[CacheKey]:
    """The engine's hasher under the plugin: hashes nothing, so a request is hashed once.

    vLLM hashes a request when it builds it (in the engine's input thread); under
    the governed scheduler those hashes would be thrown away at admission, where
    the request is hashed in its namespace. Returns ``[]``.
    """
    return []
