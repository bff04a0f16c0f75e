"""The KV cache groups the binding governs, and a request's blocks across them.

vLLM keeps one block pool for every KV cache group of a model (full attention,
sliding window, chunked local attention, encoder-decoder cross attention, Mamba /
linear-attention state), and a block id belongs to one group's request at a time, so
kvgov's owner table, retention and zeroing orders (all keyed by block id) cover every
group as they are. What differs per group is the shape of a lookup's hit and of an
allocation: one list of blocks per group, where a sliding-window (or chunked local)
group pads the blocks outside its window with vLLM's null block, and a Mamba group
("align" mode) pads every block but the state at the hit's end. This module reads
those shapes; :func:`check_groups` refuses the groups whose KV kvgov cannot govern
(see docs/vllm.md, "KV layouts: governed and refused").

With prefix caching off (vLLM's ``KVCacheCoordinatorNoPrefixCache``) and no KV
connector nothing is hashed, looked up or cached: every block is a request's from its
allocation to its release, and the groups may have different block sizes (a Mamba group
in ``mamba_cache_mode="none"`` has one state block per request spanning the model's
length); kvgov governs them as they are (owner while held, zeroing ordered at release).

A Mamba group's blocks hold per-request recurrent state (conv and ssm state), not
per-token KV; vLLM frees the state blocks a running request no longer needs each step
and, with prefix caching ("align" mode), caches the state at block boundaries under
the request's block hash (kvgov's scoped key). Every one of those blocks goes through
the pool's governed paths like an attention block. vLLM's workers skip Mamba layers
when they zero blocks; kvgov's plugin makes them clear the state tensors too
(:func:`kvgov.govern.vllm.fence.install_state_zeroer` on the GPU runners,
:func:`kvgov.govern.vllm.fence.install_cpu_zeroer` on the CPU one), and a Mamba group
is refused where that is missing.

On the CPU build vLLM's zeroer clears the KV tensors of full-attention layers only
(``CPUModelRunner._zero_block_ids``), where the GPU runner's clears every attention
layer; kvgov's plugin replaces it with one that clears every attention layer and every
Mamba layer's state. Where that replacement is missing, a block of a sliding-window,
chunked local or cross attention group reads zero after its zeroing only where a
full-attention group's layers view the same bytes (vLLM lays every group's layers over
one allocation from its first byte), which :func:`check_cpu_zeroing` checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.platforms import current_platform
from vllm.v1.core.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
)
from vllm.v1.core.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)
from vllm.v1.kv_cache_interface import AttentionSpec, FullAttentionSpec, MambaSpec

from kvgov.exceptions import UnsupportedEngine

from . import fence

__all__ = [
    "GOVERNED_MANAGERS",
    "check_cpu_zeroing",
    "check_groups",
    "check_state_zeroing",
    "hit_positions",
    "owned_blocks",
]

#: The managers whose blocks kvgov governs (exact types: vLLM's subclasses of the full
#: attention manager, sink, R-SWA, circular buffers, HiSparse, keep refused).
GOVERNED_MANAGERS: tuple[type, ...] = (
    FullAttentionManager,
    SlidingWindowManager,
    ChunkedLocalAttentionManager,
    CrossAttentionManager,
    MambaManager,
)

_COORDINATORS = (
    UnitaryKVCacheCoordinator,
    HybridKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
)


def check_groups(
    kv_cache_config: Any, coordinator: Any, hash_block_size: int, *, connector: bool = False
) -> None:
    """Refuse a KV cache whose groups kvgov cannot govern.

    ``connector``: a KV connector is attached (vLLM then hashes every request, prefix
    caching on or off, and the connector loads whole blocks of the hash block size).

    The block sizes are checked only where requests are hashed (prefix caching on, or a
    KV connector): with prefix caching off and no connector (vLLM's
    ``KVCacheCoordinatorNoPrefixCache``) nothing is hashed, looked up, cached or shared,
    so groups of different block sizes (a Mamba group in ``mamba_cache_mode="none"``,
    whose one state block per request spans the model's length) are governed as they
    are: every block is owned while a request holds it and ordered zeroed when it leaves.

    Raises:
        UnsupportedEngine: a manager outside :data:`GOVERNED_MANAGERS`; a coordinator
            kvgov does not know; where requests are hashed, a group whose block size is
            not the hash block size (partial-block prefix caching, or a Mamba group
            outside "align" mode with a KV connector); a Mamba group where this process
            lacks kvgov's state zeroer (:func:`check_state_zeroing`); on the CPU build,
            a group whose blocks the workers' zeroer would not clear
            (:func:`check_cpu_zeroing`).
    """
    if type(coordinator) not in _COORDINATORS:
        raise UnsupportedEngine(
            f"the {type(coordinator).__name__}",
            "serve a model whose KV cache groups vLLM coordinates with its unitary or "
            "hybrid coordinator",
        )
    managers = coordinator.single_type_managers
    if any(type(m) not in GOVERNED_MANAGERS for m in managers):
        names = sorted({type(m).__name__ for m in managers if type(m) not in GOVERNED_MANAGERS})
        raise UnsupportedEngine(
            f"KV cache managers {names}",
            "serve a model whose layers use full, sliding-window, chunked local or cross "
            "attention, or Mamba / linear-attention state",
        )
    hashed = connector or type(coordinator) is not KVCacheCoordinatorNoPrefixCache
    for group in kv_cache_config.kv_cache_groups if hashed else ():
        size = group.kv_cache_spec.block_size
        if size != hash_block_size:
            with_connector = " with a KV connector" if connector else ""
            raise UnsupportedEngine(
                f"a hash block size of {hash_block_size} with blocks of {size} tokens"
                f"{with_connector} (kvgov's hit judging, the owners of a hit and a "
                "connector's loads count whole blocks of the hash block size)",
                "use one block size for every KV cache group (for a Mamba hybrid: prefix "
                "caching on, mamba_cache_mode 'align', no prefix_match_unit), or turn "
                "prefix caching off and run without a KV connector",
            )
    on_cpu = current_platform.is_cpu()
    check_state_zeroing(
        kv_cache_config,
        on_cpu=on_cpu,
        zeroer=fence.cpu_zeroer_installed() if on_cpu else fence.state_zeroer_installed(),
    )
    check_cpu_zeroing(kv_cache_config, on_cpu=on_cpu, zeroer=fence.cpu_zeroer_installed())


def check_state_zeroing(kv_cache_config: Any, *, on_cpu: bool, zeroer: bool) -> None:
    """Refuse a Mamba (state) group where the workers' zeroer would not clear its blocks.

    vLLM's zeroers skip Mamba layers (the GPU runners' ``KVBlockZeroer`` processes
    attention layers only, the CPU runner's full-attention layers only), so a state
    block that left its owner would be ordered zeroed and never cleared. kvgov's
    plugin wraps both (:func:`~kvgov.govern.vllm.fence.install_state_zeroer`,
    :func:`~kvgov.govern.vllm.fence.install_cpu_zeroer`) in every process vLLM starts;
    ``zeroer`` says whether this process has the one its workers use (the CPU build runs
    its worker here; a GPU worker is another process of the same environment, which
    runs the same plugin).

    Raises:
        UnsupportedEngine: a Mamba group and no kvgov state zeroer in this process.
    """
    if zeroer or not any(
        isinstance(group.kv_cache_spec, MambaSpec) for group in kv_cache_config.kv_cache_groups
    ):
        return
    where = "CPU runner's" if on_cpu else "GPU runners'"
    raise UnsupportedEngine(
        f"a Mamba state group without kvgov's state zeroer in the {where} zeroing (vLLM's "
        "zeroer clears attention layers only: a freed state block would stay unzeroed)",
        "let kvgov's plugin install it (it failed to: see the engine's log), or serve an "
        "attention model",
    )


def check_cpu_zeroing(kv_cache_config: Any, *, on_cpu: bool, zeroer: bool) -> None:
    """Refuse, on the CPU build, attention groups whose blocks its zeroer would not clear.

    With kvgov's CPU zeroer in this process (``zeroer``: the plugin installed it; the
    CPU build runs its worker in the engine core's process) every attention layer is
    cleared and nothing is refused. vLLM's own CPU zeroer clears a block in the tensors
    of ``FullAttentionSpec`` layers only.
    Every group's layers are laid over one allocation from its first byte, a block's
    pages one layer after another, so a group's block is cleared where a full-attention
    group's pages of that block span at least as many bytes. A configuration with no
    KV tensors (no worker holds its KV: scheduler-only tests) has nothing to clear.

    Raises:
        UnsupportedEngine: on the CPU, a sliding-window, chunked local or cross attention
            group and no full-attention group whose block spans as many bytes (a model
            whose layers all have a window, or more window layers than full ones).
    """
    if not on_cpu or zeroer or not getattr(kv_cache_config, "kv_cache_tensors", None):
        return
    full = 0
    others: dict[str, int] = {}
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if not isinstance(spec, AttentionSpec):
            continue
        span = int(spec.page_size_bytes) * len(group.layer_names)
        if isinstance(spec, FullAttentionSpec):
            full = max(full, span)
        else:
            name = type(spec).__name__
            others[name] = max(others.get(name, 0), span)
    short = sorted(name for name, span in others.items() if span > full)
    if short:
        raise UnsupportedEngine(
            f"on the CPU build, KV cache groups {short} whose blocks vLLM's CPU zeroer "
            "would not clear (it clears full-attention layers' tensors only)",
            "let kvgov's plugin install its CPU zeroer (it failed to: see the engine's "
            "log), serve the model on a GPU, or one whose full-attention layers are at "
            "least as many as its window layers (Gemma 2's alternating layers)",
        )


def hit_positions(hit_groups: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    """A lookup's hit blocks over every group, as (block index, block id), in prefix order.

    The null blocks a sliding-window group (or a Mamba group, before the state at the
    hit's end) pads its hit with are left out; blocks at the same index (one per group)
    come group by group.
    """
    found = [
        (i, b.block_id) for blocks in hit_groups for i, b in enumerate(blocks) if not b.is_null
    ]
    found.sort(key=lambda entry: entry[0])  # stable: group order within an index
    return found


def owned_blocks(groups: Sequence[Sequence[Any]], per_group: int | None = None) -> list[Any]:
    """The real blocks (null blocks left out) of every group, the first ``per_group`` of each."""
    return [b for blocks in groups for b in blocks[:per_group] if not b.is_null]
