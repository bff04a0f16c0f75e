"""What kvgov keeps on one vLLM request: :class:`RequestGovernance`.

The binding sets it at admission (``add_request``) and keeps it on vLLM's request
through the fence (:func:`kvgov.govern.vllm.fence.set_governance`); the block
hashers (:mod:`kvgov.govern.vllm.requests`), the scheduler and the binding read it.
It imports nothing of the binding, so the fence can name its type.
"""

from __future__ import annotations

from typing import Any

from kvgov.policy import AdmissionDecision

from ..keys import KeyDeriver
from ..plan import KeyPlan
from ..scope import CacheScope
from ..views import ScopeView

__all__ = ["RequestGovernance"]


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
        "lookahead",
        "num_tokens",
        "plan",
        "prefix_blocks",
        "prefix_root",
        "prefix_ttl",
        "prefix_view",
        "requested_priority",
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
        lookahead: int = 0,
        requested_priority: int | None = None,
        prefix: tuple[ScopeView, KeyPlan, int] | None = None,
    ) -> None:
        self.seq_id = seq_id  # vLLM's request id
        self.num_tokens = num_tokens  # prompt tokens at admission
        self.view = view  # the scope it was admitted under
        self.adm = adm  # the admission decision
        self.plan = plan  # namespaces and retention only (no keys: the hasher derives them)
        self.deriver = deriver  # the secret's deriver at admission (a rotation stops caching)
        self.block_size = block_size  # tokens per hashed block
        self.has_extra = has_extra  # LoRA, salt, multimodal or embeddings: extra keys per block
        self.lookahead = lookahead  # tokens after each block its key covers (EAGLE/MTP), or 0
        self.root = plan.root  # the publish namespace: the only one a request reads (one chain)
        # a public prefix (``prefix``: its scope's view and plan, and its blocks): its first
        # blocks are keyed under the view (classification public) from that plan's root, the
        # rest from continuation_root(root, the prefix's last key); no prefix: 0 blocks
        pview, pplan, pblocks = prefix if prefix is not None else (None, None, 0)
        self.prefix_view: ScopeView | None = pview
        self.prefix_root = pplan.root if pplan is not None else plan.root
        self.prefix_ttl = pplan.ttl if pplan is not None else None
        self.prefix_blocks = pblocks
        # publishes (the whole or its prefix) in a share group: hits are judged
        self.shared = plan.root != view.own_root or self.prefix_root != view.own_root
        self.cacheable = plan.cacheable  # admission said cache; purge/invalidate/rotate clear it
        self.admitted = False  # its admission event is written (at its first allocation)
        self.granted: dict[Any, Any] = {}  # the sharing decisions of its last judged lookup
        self.requested_priority = requested_priority  # its kvgov_priority hint, or None

    @property
    def scope(self) -> CacheScope:
        """The scope it was admitted under."""
        return self.view.scope
