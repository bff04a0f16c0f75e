"""vLLM's internals behind one fence: every private name of vLLM that kvgov touches.

vLLM has a public extension surface for some things (KV connectors, general
plugins, ``--scheduler-cls``), but governing its prefix cache needs more: the
hash on a block, the hasher on a request, the pool's free queue, the scheduler's
private free path, the zeroing list of a step. This module is the only place in
kvgov that reads, writes, calls, overrides or patches those names; the rest of
the binding goes through the accessors here, and ``tests/govern/vllm/test_fence.py``
fails on a private name of a vLLM object used anywhere else. kvgov's own
attributes kept on vLLM objects (a request's governance) are reached here too,
so the rule has no exception: no ``._name`` on a vLLM object outside the fence.

:data:`TOUCHED` lists every name, with where it lives in vLLM, why kvgov needs
it and what differs by version; docs/vllm.md's table "What kvgov touches in
vLLM, and why" is checked against it. An upgrade of vLLM starts here.

What differs between the vLLM minors the binding supports (0.32 and 0.33),
and what the binding does about it:

* ``EngineCoreOutput.error`` (a ``RequestError``) exists only in 0.33: there a
  refused request reaches an OpenAI client as HTTP 400 with kvgov's reason
  (``validation_error``). 0.32 has no such field and would answer HTTP 500
  without a reason, so the general plugin installs a shim in the API process
  that answers HTTP 403 with the reason (:func:`needs_frontend_shim`).
* ``num_hash_lookahead_tokens`` (EAGLE/MTP lookahead hashing) exists only in
  0.33 (:func:`hash_lookahead_tokens`, 0 on 0.32); kvgov's keyed hasher covers the
  lookahead tokens as vLLM's does, with 0.33's ``generate_lookahead_block_hash_extra_keys``
  (:func:`lookahead_extra_keys`).
* ``get_request_block_hasher`` takes a third argument in 0.33; kvgov never
  calls it (the engine's hasher is swapped for :func:`~.requests.deferred_block_hasher`,
  which takes the request only, as both minors call it).
* ``BlockPool.free_blocks`` / ``touch`` handle the null block in a different
  order; the governed pool's post-pass skips it either way.

Every private name in :data:`TOUCHED` is the same in both minors. Any other
minor is refused at start (:func:`check_version`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import vllm
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys
from vllm.v1.engine import EngineCoreOutput, FinishReason

from kvgov.allocator.zeroize import zero_rows
from kvgov.exceptions import UnsupportedEngine

from ..touch import Touch

if TYPE_CHECKING:
    from .request_state import RequestGovernance

__all__ = [
    "HAS_OUTPUT_ERROR",
    "SUPPORTED_MINORS",
    "TOUCHED",
    "VLLM_VERSION",
    "SchedulerOverrides",
    "add_engine_call",
    "block_extra_keys",
    "block_hash",
    "block_hasher",
    "check_version",
    "cpu_zeroer_installed",
    "engine_hooked",
    "error_output",
    "evict_cached_block",
    "finish_output_request",
    "first_free",
    "force_kv_cache_zeroing",
    "free_request",
    "governance_of",
    "hash_lookahead_tokens",
    "hashed_ahead",
    "hashed_block_ids",
    "hashed_blocks",
    "head_run",
    "install_cpu_zeroer",
    "install_state_zeroer",
    "kv_cache_zeroing_forced",
    "leading_unhashed",
    "lookahead_extra_keys",
    "needs_frontend_shim",
    "reclass",
    "set_block_hasher",
    "set_engine_hasher",
    "set_governance",
    "split_freed",
    "state_tensors",
    "state_zeroer_installed",
    "stop_recording_new_block_ids",
    "wrap_preprocess_add_request",
    "wrap_process_outputs",
    "zero_states",
]

_T = TypeVar("_T")

#: The installed vLLM's version string.
VLLM_VERSION: str = vllm.__version__
#: The (major, minor) versions the binding is tested on.
SUPPORTED_MINORS = ((0, 32), (0, 33))
#: Whether a finished output can carry a ``RequestError`` (0.33).
HAS_OUTPUT_ERROR: bool = "error" in EngineCoreOutput.__struct_fields__

#: vLLM's extra keys of one block (LoRA, multimodal items, cache salt, prompt
#: embeddings): ``(request, start, end, start_mm_idx) -> (keys or None, next_mm_idx)``;
#: the same function and shapes in both minors.
block_extra_keys = generate_block_hash_extra_keys


def _minor(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def capped_lookup(manager: Any, request: Any, cap: int) -> Any:
    """vLLM's own prefix lookup of ``request`` capped at ``cap`` tokens, as vLLM's
    ``KVCacheManager.get_computed_blocks`` returns it (a governed manager's override is
    bypassed: its caller judges the result). 0.33's method takes the cap
    (``max_cache_hit_length``); 0.32's does not, so there the coordinator's capped
    lookup is the result, with no sparse-retention junction pinned (0)."""
    if _minor(VLLM_VERSION) >= (0, 33):
        return KVCacheManager.get_computed_blocks(manager, request, cap)
    blocks, tokens, _uncached = manager.coordinator.find_longest_cache_hit(
        request.block_hashes, cap
    )
    return manager.create_kv_cache_blocks(blocks), tokens, 0


def check_version(version: str = VLLM_VERSION) -> None:
    """Refuse a vLLM minor the binding was not tested on.

    Raises:
        UnsupportedEngine: the version is not 0.32.x or 0.33.x.
    """
    if _minor(version) not in SUPPORTED_MINORS:
        raise UnsupportedEngine(
            f"vLLM {version}",
            "install a tested version: pip install 'kvgov[vllm]' (vLLM 0.32.x or 0.33.x)",
        )


def needs_frontend_shim() -> bool:
    """Whether refusals need the API-process shim to reach clients with a reason (0.32)."""
    return not HAS_OUTPUT_ERROR


def hash_lookahead_tokens(vllm_config: Any) -> int:
    """Tokens after each block its hash covers (0.33's EAGLE/MTP lookahead; 0 on 0.32)."""
    return int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)


def lookahead_extra_keys(
    request: Any, start: int, end: int, hash_end: int, start_mm_idx: int
) -> tuple[Any, int]:
    """vLLM's extra keys of a block whose hash covers the tokens up to ``hash_end`` (0.33).

    Returns:
        ``(keys or None, next_mm_idx)``, as ``generate_lookahead_block_hash_extra_keys``.
    """
    from vllm.v1.core.kv_cache_utils import generate_lookahead_block_hash_extra_keys

    keys, mm_idx = generate_lookahead_block_hash_extra_keys(
        request, start, end, hash_end, start_mm_idx
    )
    return keys, int(mm_idx)


def error_output(request: Any, message: str) -> EngineCoreOutput:
    """The output that finishes a refused request with a reason its client can read.

    Args:
        request: the vLLM ``Request``.
        message: the reason, starting with ``kvgov:``.

    Returns:
        An ``EngineCoreOutput`` with ``FinishReason.ERROR`` and ``stop_reason``
        set to the message; on 0.33 also ``error=RequestError("validation_error",
        message)`` (HTTP 400 with the message).
    """
    kwargs: dict[str, Any] = {
        "request_id": request.request_id,
        "new_token_ids": [],
        "finish_reason": FinishReason.ERROR,
        "stop_reason": message,
        "events": request.take_events(),
        "trace_headers": request.trace_headers,
    }
    if HAS_OUTPUT_ERROR:
        from vllm.outputs import RequestError

        kwargs["error"] = RequestError(code="validation_error", message=message)
    return EngineCoreOutput(**kwargs)


# ---------------------------------------------------------------------- the registry


_SAME = "same in 0.32 and 0.33"

#: Every vLLM internal this module touches; docs/vllm.md's table is checked against it.
TOUCHED: tuple[Touch, ...] = (
    Touch(
        "KVCacheBlock._block_hash",
        "private attribute (read)",
        "vllm.v1.core.kv_cache_utils",
        "whether a block is cached (findable by key) and under which hash: block states, "
        "eviction reports, lazy evictions; read directly, vLLM's block_hash property costs "
        "a call per block on the hottest paths",
        _SAME,
    ),
    Touch(
        "FreeKVCacheBlockQueue.fake_free_list_head",
        "internal attribute (read)",
        "vllm.v1.core.kv_cache_utils",
        "the blocks get_new_blocks hands out next: the cached ones among them are evicted "
        "there, lazily, and must be reported and ordered zeroed before vLLM drops their hash",
        _SAME,
    ),
    Touch(
        "KVCacheBlock.next_free_block",
        "internal attribute (read)",
        "vllm.v1.core.kv_cache_utils",
        "walks the free queue from its head (above)",
        _SAME,
    ),
    Touch(
        "FreeKVCacheBlockQueue",
        "re-class",
        "vllm.v1.core.kv_cache_utils",
        "the pool's free queue becomes a GovernedFreeQueue in place once a policy sets a "
        "priority other than the default or a quota: cached blocks then wait in one vLLM "
        "queue per (tenant quota group, priority), and allocation takes them in the policy's "
        "order; with the default policy vLLM's queue is left as it is",
        _SAME,
    ),
    Touch(
        "BlockPool._maybe_evict_cached_block",
        "private method (call)",
        "vllm.v1.core.block_pool",
        "drops one block's hash (purge, invalidation, retention, a KV connector's "
        "evict_blocks, which the governed pool overrides to report first)",
        _SAME,
    ),
    Touch(
        "BlockPool",
        "re-class",
        "vllm.v1.core.block_pool",
        "the pool vLLM built becomes a GovernedBlockPool in place: the coordinator, the "
        "managers and every block keep pointing at the same object",
        _SAME,
    ),
    Touch(
        "KVCacheManager",
        "re-class",
        "vllm.v1.core.kv_cache_manager",
        "the scheduler's manager becomes a GovernedKVCacheManager in place (lookups "
        "judged, commits recorded)",
        _SAME,
    ),
    Touch(
        "SingleTypeKVCacheManager._record_new_block_ids",
        "private attribute (write)",
        "vllm.v1.core.single_type_kv_cache_manager",
        "turned off: the forced zeroing flag makes vLLM record every new block for zeroing; "
        "the governed scheduler orders its own (every block that left an owner), and keeps "
        "vLLM's record only where vLLM's cache needs it (mixed precision)",
        _SAME,
    ),
    Touch(
        "Scheduler._get_new_block_ids_to_zero",
        "override",
        "vllm.v1.core.sched.scheduler",
        "the ids a step's workers zero before its forward pass: kvgov's orders (every block "
        "that left an owner, but those an async KV load fills this step), plus vLLM's where "
        "its cache needs zeroing (mixed precision)",
        _SAME,
    ),
    Touch(
        "Scheduler._free_request",
        "private method (call)",
        "vllm.v1.core.sched.scheduler",
        "finishes a refused request as vLLM finishes any other (its state and blocks freed)",
        _SAME,
    ),
    Touch(
        "Request._block_hasher",
        "private attribute (read, write)",
        "vllm.v1.request",
        "kvgov's keyed hasher replaces vLLM's at admission: a request's block hashes are "
        "kvgov's scoped keys",
        _SAME,
    ),
    Touch(
        "Request._kvgov",
        "kvgov attribute (read, write)",
        "vllm.v1.request",
        "the request's governance (scope, admission, plan), kept on vLLM's request so "
        "every hook finds it",
        "kvgov's own name: none",
    ),
    Touch(
        "EngineCore.request_block_hasher",
        "internal attribute (read, write)",
        "vllm.v1.engine.core",
        "a governed engine hashes nothing when it builds a request: the scheduler hashes "
        "each request once, in its namespace",
        _SAME,
    ),
    Touch(
        "KVCacheConfig.needs_kv_cache_zeroing",
        "patch",
        "vllm.v1.kv_cache_interface",
        "forced true in every process: a worker builds its KV zeroer only when it is",
        _SAME,
    ),
    Touch(
        "CPUModelRunner._zero_block_ids",
        "patch",
        "vllm.v1.worker.cpu_model_runner",
        "replaced on the CPU build: vLLM's clears full-attention layers' tensors only, kvgov's "
        "every attention layer's (a window-only model's freed blocks read zero) and every "
        "Mamba layer's state tensors (conv and ssm)",
        _SAME,
    ),
    Touch(
        "KVBlockZeroer",
        "patch",
        "vllm.v1.worker.utils",
        "wrapped in the GPU runners (both): vLLM's zeroer clears attention layers only (it "
        "skips Mamba layers), kvgov's also clears the given blocks of every Mamba layer's "
        "state tensors (conv and ssm), so a state block that left its owner reads zero",
        _SAME,
    ),
    Touch(
        "EngineCore.preprocess_add_request",
        "patch",
        "vllm.v1.engine.core",
        "wrapped: swaps the engine's hasher (above) when the scheduler is governed",
        _SAME,
    ),
    Touch(
        "EngineCore.kvgov_call",
        "patch",
        "vllm.v1.engine.core",
        "added: the engine utility that runs erasure and maintenance between steps",
        _SAME,
    ),
    Touch(
        "OutputProcessor.process_outputs",
        "patch",
        "vllm.v1.engine.output_processor",
        "wrapped in the API process: a refusal reaches its client as HTTP 403 with the reason",
        "0.32 only (0.33 carries the reason in EngineCoreOutput.error)",
    ),
    Touch(
        "OutputProcessor._finish_request",
        "private method (call)",
        "vllm.v1.engine.output_processor",
        "the 0.32 shim finishes the refused request's state after answering its client",
        "called on 0.32 only",
    ),
)


# ---------------------------------------------------------------------- blocks and the pool


def block_hash(block: Any) -> Any:
    """``KVCacheBlock._block_hash``: the block's prefix-cache hash, None when not cached."""
    return block._block_hash


# Batch forms of the accessors above, for the pool's per-block post-passes: one call
# a list instead of one a block (a Python call costs about as much as the test it
# wraps, and these run over every block vLLM hands out, caches or frees).


def hashed_ahead(queue: Any, n: int, extra: Any) -> list[Any]:
    """Of the first ``n`` blocks of vLLM's free queue (the ones it hands out next), the hashed.

    Walks ``FreeKVCacheBlockQueue.fake_free_list_head`` and ``next_free_block``. A
    block holds a hash when its ``_block_hash`` is set or its id is in ``extra``
    (``BlockPool.cached_block_hashes_by_block``, falsy when empty): vLLM evicts it
    lazily as it hands it out. The caller checks ``n <= queue.num_free_blocks``.
    """
    hashed = []
    blk = queue.fake_free_list_head.next_free_block
    if extra:
        for _ in range(n):
            if blk._block_hash is not None or blk.block_id in extra:
                hashed.append(blk)
            blk = blk.next_free_block
    else:
        for _ in range(n):
            if blk._block_hash is not None:
                hashed.append(blk)
            blk = blk.next_free_block
    return hashed


def first_free(queue: Any) -> Any:
    """The block at the head of a ``FreeKVCacheBlockQueue`` (the next it hands out), or None.

    Reads ``fake_free_list_head.next_free_block``; the fake tail (no next block) is None.
    """
    blk = queue.fake_free_list_head.next_free_block
    return blk if blk is not None and blk.next_free_block is not None else None


def head_run(queue: Any, limit: int, stamp: list[int], bound: int, ties: bool) -> int:
    """How many blocks from the head of a ``FreeKVCacheBlockQueue`` come before ``bound``.

    Counts, up to ``limit``, the leading blocks whose ``stamp`` (by block id) is
    below ``bound``, or equal to it when ``ties``: the run a merge of several
    queues by stamp takes from this one before the next queue's head (whose stamp
    is ``bound``). The caller checks ``limit <= queue.num_free_blocks``.
    """
    blk = queue.fake_free_list_head.next_free_block
    k = 0
    while k < limit:
        s = stamp[blk.block_id]
        if s > bound or (s == bound and not ties):
            break
        k += 1
        blk = blk.next_free_block
    return k


def leading_unhashed(queue: Any, n: int) -> int:
    """How many of the first ``n`` blocks of vLLM's free queue hold no prefix-cache hash.

    Counts from the head (``fake_free_list_head``) and stops at the first hashed block:
    vLLM puts the blocks freed without a hash at the front (they are reused first). The
    caller checks ``n`` against the blocks the queue holds.
    """
    blk = queue.fake_free_list_head.next_free_block
    k = 0
    while k < n and blk._block_hash is None:
        k += 1
        blk = blk.next_free_block
    return k


def hashed_blocks(blocks: Any) -> list[Any]:
    """The blocks that hold a prefix-cache hash (``_block_hash``), the null block left out."""
    return [b for b in blocks if b._block_hash is not None and not b.is_null]


def hashed_block_ids(blocks: Any) -> list[int]:
    """The ids of the blocks that hold a prefix-cache hash, the null block left out."""
    return [b.block_id for b in blocks if b._block_hash is not None and not b.is_null]


def split_freed(blocks: Any, pool: Any) -> tuple[list[int], list[int]]:
    """Of blocks ``pool`` just freed, the ids now unreferenced: (cached, unhashed).

    Left out: those still referenced, the null block and another pool's (whose
    own pool reports them); cached ones keep their hash, unhashed ones have none.
    """
    cached: list[int] = []
    freed: list[int] = []
    for b in blocks:
        if b.ref_cnt or b.is_null or (b.pool is not pool and b.pool is not None):
            continue
        (freed if b._block_hash is None else cached).append(b.block_id)
    return cached, freed


def evict_cached_block(pool: Any, block: Any) -> bool:
    """``BlockPool._maybe_evict_cached_block``: drop the block's hash; True if it had one."""
    return bool(pool._maybe_evict_cached_block(block))


def reclass(obj: Any, cls: type[_T]) -> _T:
    """Turn an object vLLM built into an instance of ``cls`` (a subclass of its class), in place.

    Every reference vLLM holds to it stays valid; nothing but the class changes.
    """
    if not isinstance(obj, cls):
        obj.__class__ = cls
    adopted: _T = obj
    return adopted


def stop_recording_new_block_ids(manager: Any) -> None:
    """Turn off ``SingleTypeKVCacheManager._record_new_block_ids`` in each of the manager's groups.

    The forced ``needs_kv_cache_zeroing`` makes vLLM record every new block's id
    for zeroing; the governed scheduler orders its own zeroing and drops that record.
    """
    for mgr in manager.coordinator.single_type_managers:
        if getattr(mgr, "_record_new_block_ids", False):
            mgr._record_new_block_ids = False


# ---------------------------------------------------------------------- the scheduler


class SchedulerOverrides:
    """vLLM's private scheduler hooks kvgov overrides, each handed to a public ``kvgov_`` method.

    Mixed in before vLLM's ``Scheduler``; the governed scheduler overrides the
    ``kvgov_`` methods, whose defaults are vLLM's behaviour.
    """

    def _get_new_block_ids_to_zero(self) -> list[int] | None:
        return self.kvgov_block_ids_to_zero()

    def kvgov_block_ids_to_zero(self) -> list[int] | None:
        """The ids this step's workers zero (``Scheduler._get_new_block_ids_to_zero``); vLLM's."""
        ids: list[int] | None = super()._get_new_block_ids_to_zero()  # type: ignore[misc]
        return ids


def free_request(scheduler: Any, request: Any) -> Any:
    """``Scheduler._free_request``: free a finished request's state and blocks, as vLLM does."""
    return scheduler._free_request(request)


# ---------------------------------------------------------------------- requests


def block_hasher(request: Any) -> Callable[[Any], list[Any]] | None:
    """``Request._block_hasher``: the request's block hasher (None: prefix caching is off)."""
    hasher: Callable[[Any], list[Any]] | None = request._block_hasher
    return hasher


def set_block_hasher(request: Any, hasher: Callable[[Any], list[Any]]) -> None:
    """Replace ``Request._block_hasher`` (kvgov's keyed hasher, at admission)."""
    request._block_hasher = hasher


def governance_of(request: Any) -> RequestGovernance | None:
    """kvgov's governance kept on a vLLM request (``request._kvgov``); None if not admitted."""
    state: RequestGovernance | None = getattr(request, "_kvgov", None)
    return state


def set_governance(request: Any, state: RequestGovernance) -> None:
    """Keep the request's governance on vLLM's request (``request._kvgov``)."""
    request._kvgov = state


def set_engine_hasher(engine: Any, hasher: Callable[[Any], list[Any]]) -> bool:
    """Set ``EngineCore.request_block_hasher`` unless it is None (prefix caching off).

    Returns:
        Whether the engine had a hasher (and now has ``hasher``).
    """
    if engine.request_block_hasher is None:
        return False
    engine.request_block_hasher = hasher
    return True


# ---------------------------------------------------------------------- patches

#: The mark on every function kvgov patched into vLLM (so a second install is a no-op).
_MARK = "_kvgov"


def _marked(fn: object) -> bool:
    return bool(getattr(fn, _MARK, False))


def _mark(fn: _T) -> _T:
    setattr(fn, _MARK, True)
    return fn


def force_kv_cache_zeroing() -> None:
    """Patch ``KVCacheConfig.needs_kv_cache_zeroing`` to be always true. Idempotent."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    if kv_cache_zeroing_forced():
        return

    def needs_kv_cache_zeroing(self: Any) -> bool:
        """Forced on by kvgov: blocks that leave an owner are zeroed in the workers."""
        return True

    KVCacheConfig.needs_kv_cache_zeroing = property(_mark(needs_kv_cache_zeroing))


def state_tensors(groups: Iterable[Any], context: Mapping[str, Any]) -> list[Any]:
    """Every Mamba layer's state tensors (conv and ssm state), each once, blocks on dim 0.

    ``groups`` are a worker's KV cache groups (``KVCacheGroupSpec``) or attention groups
    (``AttentionGroup``): anything with ``kv_cache_spec`` and ``layer_names``; ``context``
    is the compilation config's ``static_forward_context``. A Mamba layer's ``kv_cache``
    is the tuple of its states, each a view ``[num_blocks, *shape]`` of the block's page
    (``MambaBase.bind_kv_cache``); a tensor several layers view is listed once.
    """
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    out: list[Any] = []
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    for group in groups:
        if not isinstance(group.kv_cache_spec, MambaSpec):
            continue
        for name in group.layer_names:
            states = getattr(context.get(name), "kv_cache", None)
            if isinstance(states, torch.Tensor):
                states = (states,)
            for state in states if isinstance(states, tuple | list) else ():
                if not isinstance(state, torch.Tensor) or state.dim() == 0:
                    continue
                key = (state.data_ptr(), tuple(state.shape), tuple(state.stride()))
                if key not in seen:
                    seen.add(key)
                    out.append(state)
    return out


def zero_states(states: Sequence[Any], block_ids: Sequence[int], index: Any = None) -> None:
    """Zero the given blocks (dim 0) of each state tensor: one indexed fill per tensor.

    On CPU by :func:`~kvgov.allocator.zeroize.zero_rows` (on the calling thread, not
    torch's OpenMP workers); elsewhere ``index_fill_`` with ``index``, the ids as a
    ``torch.long`` tensor on the states' device (built here when None).
    """
    if not states or not block_ids:
        return
    if index is None and states[0].device.type != "cpu":
        import torch

        index = torch.tensor(list(block_ids), dtype=torch.long, device=states[0].device)
    for state in states:
        if state.device.type == "cpu":
            zero_rows(state, block_ids)  # on this thread, not torch's OpenMP workers
        else:
            state.index_fill_(0, index, 0)


def install_cpu_zeroer() -> bool:
    """On the CPU build, make the workers' zeroer clear every attention and Mamba layer.

    vLLM's ``CPUModelRunner._zero_block_ids`` clears the tensors of full-attention layers
    only (one ``zero_()`` per block and layer), where the GPU runner's ``KVBlockZeroer``
    clears every attention layer: a block of a sliding-window, chunked local or cross
    attention group would keep its KV wherever no full-attention layer views the same
    bytes (a model whose layers all have a window), and a Mamba state block its conv and
    ssm state. kvgov's replacement clears every attention layer's tensor (each tensor
    once, however many layers view it; vLLM's runner-only layers, which hold no KV blocks,
    left out) and every Mamba layer's state tensors (:func:`state_tensors`), with one
    indexed fill per tensor and step. Returns whether this process has it (False off the
    CPU build).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import torch
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if _marked(CPUModelRunner._zero_block_ids):
        return True

    def _zero_block_ids(self: Any, block_ids: list[int]) -> None:
        """kvgov: zero the given blocks in every attention layer's KV tensor and every
        Mamba layer's state tensors."""
        if not block_ids:
            return
        skip = getattr(self, "runner_only_attn_layers", ()) or ()
        context = self.compilation_config.static_forward_context
        groups = self.kv_cache_config.kv_cache_groups
        seen: set[int] = set()
        for group in groups:
            if not isinstance(group.kv_cache_spec, AttentionSpec):
                continue
            for name in group.layer_names:
                kv = getattr(context.get(name), "kv_cache", None)
                if name in skip or not isinstance(kv, torch.Tensor) or kv.data_ptr() in seen:
                    continue
                seen.add(kv.data_ptr())
                zero_rows(kv, block_ids)  # on this thread, not torch's OpenMP workers
        zero_states(state_tensors(groups, context), block_ids)

    _zero_block_ids.__wrapped__ = CPUModelRunner._zero_block_ids  # type: ignore[attr-defined]  # vLLM's, for tests
    CPUModelRunner._zero_block_ids = _mark(_zero_block_ids)
    return True


def install_state_zeroer() -> bool:
    """Make the GPU runners' ``KVBlockZeroer`` clear Mamba state tensors too. Idempotent.

    vLLM's ``KVBlockZeroer`` (``vllm.v1.worker.utils``, built by both GPU model runners
    when ``needs_kv_cache_zeroing``, which vLLM sets for every Mamba model and kvgov
    forces for every model) clears the given blocks of attention layers only: "Mamba
    layers are skipped". kvgov wraps it: its constructor also lists every Mamba layer's
    state tensors from the same attention groups (:func:`state_tensors`), and each
    ``zero_block_ids`` call, after vLLM's kernel, fills the given blocks of each state
    tensor with zeros (one indexed fill per tensor and step, on the runner's stream,
    before the step's copies and forward pass). Returns whether this process has it.
    """
    import inspect

    import torch
    from vllm.utils.torch_utils import async_tensor_h2d
    from vllm.v1.worker.utils import KVBlockZeroer

    if _marked(KVBlockZeroer.zero_block_ids):
        return True
    init = KVBlockZeroer.__init__
    zero = KVBlockZeroer.zero_block_ids
    signature = inspect.signature(init)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        """kvgov: vLLM's zeroer, plus the Mamba layers' state tensors it skips."""
        bound = signature.bind(self, *args, **kwargs)
        groups = list(bound.arguments["attn_groups_iter"])
        bound.arguments["attn_groups_iter"] = groups
        init(*bound.args, **bound.kwargs)
        self.kvgov_states = state_tensors(groups, bound.arguments["static_forward_context"])

    def zero_block_ids(self: Any, block_ids: list[int]) -> None:
        """kvgov: vLLM's attention zeroing, then every Mamba state tensor's given blocks."""
        zero(self, block_ids)
        states = getattr(self, "kvgov_states", None)
        if states and block_ids:
            index = async_tensor_h2d(block_ids, device=states[0].device, dtype=torch.int64)
            zero_states(states, block_ids, index)

    __init__.__wrapped__ = init  # type: ignore[attr-defined]  # vLLM's, for tests
    zero_block_ids.__wrapped__ = zero  # type: ignore[attr-defined]
    KVBlockZeroer.__init__ = _mark(__init__)
    KVBlockZeroer.zero_block_ids = _mark(zero_block_ids)
    return True


def state_zeroer_installed() -> bool:
    """Whether :func:`install_state_zeroer` ran in this process."""
    from vllm.v1.worker.utils import KVBlockZeroer

    return _marked(KVBlockZeroer.zero_block_ids)


def cpu_zeroer_installed() -> bool:
    """Whether :func:`install_cpu_zeroer` ran in this process (always False off the CPU)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    return _marked(CPUModelRunner._zero_block_ids)


def vllm_needs_kv_cache_zeroing(kv_cache_config: Any) -> bool:
    """``KVCacheConfig.needs_kv_cache_zeroing`` as vLLM computes it (kvgov forces the property).

    vLLM zeroes new blocks for Mamba models (a state is read before it is fully written)
    and mixed-precision caches; the governed scheduler then carries vLLM's list beside its
    own orders.
    """
    return bool(
        getattr(kv_cache_config, "has_mamba_layers", False)
        or getattr(kv_cache_config, "has_mixed_precision_kv_cache", False)
    )


def kv_cache_zeroing_forced() -> bool:
    """Whether :func:`force_kv_cache_zeroing` ran in this process."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    prop = KVCacheConfig.__dict__.get("needs_kv_cache_zeroing")
    return _marked(getattr(prop, "fget", None))


def wrap_preprocess_add_request(
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Patch ``EngineCore.preprocess_add_request`` with ``wrap(vLLM's)``. Idempotent."""
    from vllm.v1.engine.core import EngineCore

    if engine_hooked():
        return
    EngineCore.preprocess_add_request = _mark(wrap(EngineCore.preprocess_add_request))


def engine_hooked() -> bool:
    """Whether :func:`wrap_preprocess_add_request` ran in this process."""
    from vllm.v1.engine.core import EngineCore

    return _marked(EngineCore.preprocess_add_request)


def add_engine_call(fn: Callable[..., Any]) -> None:
    """Add ``EngineCore.kvgov_call``: the engine utility a client reaches with ``call_utility``."""
    from vllm.v1.engine.core import EngineCore

    EngineCore.kvgov_call = fn


def wrap_process_outputs(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Patch ``OutputProcessor.process_outputs`` with ``wrap(vLLM's)``. Idempotent."""
    from vllm.v1.engine.output_processor import OutputProcessor

    if _marked(OutputProcessor.process_outputs):
        return
    OutputProcessor.process_outputs = _mark(wrap(OutputProcessor.process_outputs))


def finish_output_request(processor: Any, state: Any) -> None:
    """``OutputProcessor._finish_request``: drop a finished request's state in the API process."""
    processor._finish_request(state)
