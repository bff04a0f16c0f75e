"""vLLM's KV cache manager with the two governed points of a request's admission.

* ``get_computed_blocks`` (the prefix lookup): a hit on another tenant's blocks
  (possible only in a share group's namespace) is judged by the sharing policy
  and cut at the first refusal, before vLLM commits it;
* ``allocate_slots`` (the commit: hit blocks referenced, new blocks handed out):
  the binding records the new blocks' owner (the blocks a KV connector's load
  fills included) and audits the admission and the reuse vLLM actually committed.

Both cover every KV cache group (:mod:`.groups`): a hit is judged over the blocks of
all groups and cut for all of them at once; the new blocks of every group get the
request's owner.

Adopted in place, like the pool: the scheduler's ``kv_cache_manager`` is
re-classed, nothing else changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.core.kv_cache_manager import KVCacheManager

from . import fence
from .groups import owned_blocks

if TYPE_CHECKING:
    from .binding import VllmGovernance

__all__ = ["GovernedKVCacheManager"]


class GovernedKVCacheManager(KVCacheManager):
    """vLLM's ``KVCacheManager`` that reports lookups and commits to the binding."""

    #: The binding; None on a manager no governed scheduler adopted.
    kvgov: VllmGovernance | None = None

    @classmethod
    def adopt(cls, manager: KVCacheManager, binding: VllmGovernance) -> GovernedKVCacheManager:
        """Re-class the manager vLLM built and attach the binding."""
        governed = fence.reclass(manager, cls)
        governed.kvgov = binding
        # The forced needs_kv_cache_zeroing makes vLLM record every new block's id for
        # zeroing (a generator over the blocks per allocation); the governed scheduler
        # orders its own zeroing (every block that left an owner), so the record is not
        # kept, unless vLLM's cache needs its new blocks zeroed itself (mixed precision):
        # then the step carries both.
        if not fence.vllm_needs_kv_cache_zeroing(getattr(manager, "kv_cache_config", None)):
            fence.stop_recording_new_block_ids(governed)
        return governed

    def get_computed_blocks(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return self._kvgov_judged(request, super().get_computed_blocks(request, *args, **kwargs))

    def _kvgov_judged(self, request: Any, result: Any) -> Any:
        """vLLM's lookup result, cut where the sharing policy refuses a block."""
        binding = self.kvgov
        if binding is None or not result[1]:
            return result
        hit_groups = result[0].blocks
        keep = binding.judge_hit(request, hit_groups, result[1])
        if keep >= result[1]:
            return result
        if len(hit_groups) == 1:
            cut = self.create_kv_cache_blocks((list(hit_groups[0][: keep // binding.block_size]),))
            return (cut, keep, *result[2:])
        # Several groups: a sliding-window group's hit is the window before its end, so
        # a shorter hit needs other blocks; look again, capped where the policy cut
        # (every group then ends there; what it finds is judged again, and the hit only
        # shrinks, so this ends).
        return self._kvgov_judged(request, fence.capped_lookup(self, request, keep))

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        local = request.num_computed_tokens + num_new_computed_tokens
        binding = self.kvgov
        capped = binding is not None and binding.allocating(request)  # its tenant's cap
        try:
            result = super().allocate_slots(
                request,
                num_new_tokens,
                num_new_computed_tokens,
                new_computed_blocks,
                *args,
                **kwargs,
            )
        finally:
            if capped:
                binding.allocated_done()  # type: ignore[union-attr]
        if binding is not None and result is not None:
            hit: list[Any] = []
            if num_new_computed_tokens and new_computed_blocks is not None:
                hit = owned_blocks(
                    new_computed_blocks.blocks, num_new_computed_tokens // binding.block_size
                )
            new = owned_blocks(result.blocks) if result.blocks else []
            external = args[1] if len(args) > 1 else kwargs.get("num_external_computed_tokens", 0)
            if external:  # blocks a connector's load fills: allocated, not in the result
                bs = binding.block_size
                loaded = self.get_blocks(request.request_id).blocks
                first, end = local // bs, (local + external) // bs
                new = [*(b for g in loaded for b in g[first:end] if not b.is_null), *new]
                skip = args[7] if len(args) > 7 else kwargs.get("skip_zeroing_group_ids", ())
                if skip:  # an async load fills them: no zeroing may race it this step
                    last = -(-(local + external) // bs)  # the load's partial block too
                    binding.loaded(
                        b.block_id
                        for i in skip
                        if i < len(loaded)
                        for b in loaded[i][first:last]
                        if not b.is_null
                    )
            state = fence.governance_of(request)
            if state is not None and (new or hit or not state.admitted):
                public: list[int] = []
                # the public prefix's blocks (one group), while some may be new: past the
                # prefix's tokens every block of it was handed out by an earlier call
                if new and local < state.prefix_blocks * binding.block_size:
                    held = self.get_blocks(request.request_id).blocks[0]
                    public = [b.block_id for b in held[: state.prefix_blocks]]
                binding.allocated(
                    request, new, hit, hit_tokens=num_new_computed_tokens, public_ids=public
                )
        return result
