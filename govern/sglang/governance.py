"""The governor on SGLang's radix cache: :class:`SglangGovernance`, :class:`PageZeroer`.

One object per scheduler process. It admits each request once (scope from the
front end's signed scope token, admission policy, namespace; the policy's part
decided once per scope, prompt length and policy revision, :class:`Decided`), gives
it its tree namespace (:mod:`.keys`), records who owns every page the tree takes,
and zeroes every page that goes back to the allocator before the allocator can hand
it out again (:class:`PageZeroer`: every layer's K and V, one indexed fill per layer
per batch where K and V are one allocation's halves, else per buffer). Needs torch,
not SGLang: the cache (:mod:`.cache`) calls it.

The governor's internals are used here only: ``gov.ledger.owners`` (who owns a page),
``gov.drain`` (pool events into audit events); the lead's Ledger refactor moves
them, and this module is the one place to adapt.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from kvgov import defaults
from kvgov.allocator import (
    BlocksEvicted,
    BlockState,
    PoolCounts,
    PoolEvent,
    Revoked,
)
from kvgov.allocator.zeroize import byte_view
from kvgov.audit import AuditEvent, EventType
from kvgov.audit.events import OWN_REUSE_KEY
from kvgov.exceptions import (
    AuditUnavailable,
    BindingConfigError,
    InternalError,
    InvalidArgument,
    InvalidScope,
    InvalidSpec,
    PolicyDenied,
    PoolClosed,
    ScopeTokenError,
    TenantPurging,
    UnknownBlock,
    UnsupportedEngine,
)

from .. import native, sharing
from ..assemble import open_parts
from ..governor import Governor, admission_event
from ..keys import scope_digest
from ..refusal import describe_error, refuse, request_id_problem
from ..results import ErasureReport, InvalidationReport
from ..scope import CacheScope
from ..scope_resolver import EngineScope, ScopeResolver, revision_of
from ..views import ScopeView
from ..vllm.settings import BindingSettings
from .keys import NAMESPACE_PREFIX, tree_namespace

__all__ = [
    "ERROR_PATH",
    "SCOPE_PATH",
    "SWEEP_INTERVAL",
    "VLLM_ONLY_SETTINGS",
    "ZERO_AUDIT_BATCH",
    "Admitted",
    "Decided",
    "PageZeroer",
    "SglangGovernance",
    "SglangPoolAdapter",
    "page_ids",
]

_log = logging.getLogger("kvgov.sglang")

#: ``details.path`` of the refusals this binding decides itself.
SCOPE_PATH = "kvgov.sglang/scope"
ERROR_PATH = "kvgov.sglang/error"
#: Default shortest time between two retention sweeps (seconds): see ``sweep_due``.
SWEEP_INTERVAL = 60.0
#: Zeroed pages per batch of ``zeroization`` audit events (one event per owner per batch).
ZERO_AUDIT_BATCH = 4096
#: The vLLM binding's settings this binding cannot honour, refused when set (an engine
#: that read and dropped them would leave its operator believing it in a fleet, or
#: vouching for a connector, when it is not).
VLLM_ONLY_SETTINGS = (
    "connector_kinds",
    "fleet_url",
    "fleet_engine_id",
    "fleet_operator_keys_file",
    "fleet_poll_interval",
)


def _refuse_vllm_only(environ: Mapping[str, str]) -> None:
    """Raise BindingConfigError for a :data:`VLLM_ONLY_SETTINGS` setting in ``environ``."""
    for name in VLLM_ONLY_SETTINGS:
        env_name = defaults.SETTING_ENV_PREFIX + name.upper()
        if env_name in environ:  # its value is not shown: a fleet URL may hold a password
            raise BindingConfigError(
                env_name,
                "<set>",
                "a vLLM binding setting the SGLang binding does not take (no fleet agent, "
                "no KV connectors); unset it for SGLang",
            )


class PageZeroer:
    """Zeroes freed pages in every K and V buffer of SGLang's device KV pool.

    Args:
        buffers: every layer's K and V (or MLA KV) tensors, indexed by token slot.
        page_size: tokens per page.
        on_zeroed: called with the page ids and bytes just zeroed.
    """

    def __init__(
        self,
        buffers: Sequence[torch.Tensor],
        page_size: int,
        on_zeroed: Callable[[list[int], int, float], None] | None = None,
    ) -> None:
        if not buffers:
            raise UnsupportedEngine("a KV pool without K/V buffers", "use an MHA or MLA pool")
        self.buffers = list(buffers)
        self.page_size = page_size
        self.on_zeroed = on_zeroed
        self.pending: list[torch.Tensor] = []
        self.bytes_per_page = sum(page_size * b[0].numel() * b.element_size() for b in self.buffers)
        # each buffer seen as [pages, page_size, ...] (a view: the same storage), so a fill
        # indexes pages, not page_size times as many token slots
        # (a trailing partial page, if a buffer has one, is never handed out)
        self._paged = [
            b[: b.shape[0] - b.shape[0] % page_size].view(-1, page_size, *b.shape[1:])
            for b in self.buffers
        ]
        #: what a flush fills, each indexed by page along ``dim``: a layer's K and V as one
        #: view where they are two halves of one allocation, else each buffer alone
        self.fills: list[tuple[torch.Tensor, int]] = _fill_targets(self._paged)
        self.device = self.buffers[0].device
        #: on CPU, the same targets as numpy byte views (None: a target numpy cannot view,
        #: or not on CPU; then torch's index_fill_): see :meth:`flush`
        self.byte_fills: list[tuple[np.ndarray, int]] | None = _byte_views(self.fills)
        #: the byte views the compiled loop zeroes (``kvgov.govern._blocks.zero``: one call
        #: for every page and view), or None: not built, or a view it cannot take
        self.native_fills: list[tuple[np.ndarray, int]] | None = _native_fills(self.byte_fills)

    def release(self, page_ids: torch.Tensor) -> None:
        """Note pages going back to the allocator (zeroed by the next :meth:`flush`)."""
        if page_ids.numel():
            self.pending.append(page_ids if page_ids.dim() == 1 else page_ids.reshape(-1))

    def pending_ids(self) -> list[int]:
        """The pages released and not yet zeroed, in release order."""
        if not self.pending:
            return []
        return [int(i) for t in self.pending for i in t.tolist()]

    def reads_zero(self, page_ids: Sequence[int]) -> bool:
        """Whether the pages read zero in every buffer (a read-back, for erasure checks)."""
        if not page_ids:
            return True
        dev = self.buffers[0].device
        pages = torch.tensor(list(page_ids), dtype=torch.int64, device=dev)
        return all(not bool(buf.index_select(0, pages).any()) for buf in self._paged)

    def flush(self) -> list[int]:
        """Zero every pending page now; returns their ids, in release order.

        One compiled call over every byte view where :attr:`native_fills`, else one
        indexed fill per :attr:`fills`. A fill that raises leaves the pages pending.
        """
        if not self.pending:
            return []
        blocks = native.blocks
        start = time.perf_counter()
        if blocks is not None and self.native_fills is not None:
            try:  # SGLang's page ids are CPU int64 tensors where its KV pool is on the CPU
                chunks = [t.numpy() for t in self.pending]
                ids: list[int] = blocks.zero(self.native_fills, chunks)
            except TypeError:  # another dtype (checked by zero) or device: converted
                chunks = [t.to("cpu", torch.int64).numpy() for t in self.pending]
                ids = blocks.zero(self.native_fills, chunks)
            self.pending = []  # only once zeroed: a failed flush leaves them pending
            return self._report(ids, start)
        pages = torch.cat(self.pending) if len(self.pending) > 1 else self.pending[0]
        if pages.dtype != torch.int64 or pages.device != self.device:
            pages = pages.to(self.device, torch.int64)
        byte_fills = self.byte_fills
        if byte_fills is not None:  # on the calling thread: no OpenMP hand-off for a few pages
            rows = pages.numpy()
            for raw, dim in byte_fills:
                if dim:
                    raw[:, rows] = 0
                else:
                    raw[rows] = 0
        else:
            for target, dim in self.fills:
                target.index_fill_(dim, pages, 0)
        self.pending = []
        return self._report(pages.tolist(), start)

    def _report(self, ids: list[int], start: float) -> list[int]:
        """Hand the pages just zeroed to :attr:`on_zeroed` (bytes, seconds since ``start``)."""
        if self.on_zeroed is not None:
            self.on_zeroed(ids, len(ids) * self.bytes_per_page, time.perf_counter() - start)
        return ids


def _native_fills(
    byte_fills: list[tuple[np.ndarray, int]] | None,
) -> list[tuple[np.ndarray, int]] | None:
    """``byte_fills`` where the compiled loop can zero them (checked by it), else None."""
    blocks = native.blocks
    if blocks is None or byte_fills is None:
        return None
    try:
        blocks.zero(byte_fills, [])  # checks every view, zeroes nothing
    except (TypeError, ValueError, BufferError):
        return None
    return byte_fills


def page_ids(
    slots: torch.Tensor, unit: int, *, start: int = 0, stop: int | None = None
) -> list[int]:
    """The page of every ``unit``-th token slot of ``slots[start:stop]`` (a page-aligned run).

    Compiled for a CPU int64 tensor where :data:`kvgov.govern.native.NATIVE_BLOCKS`
    (one call, no list of slots in between); otherwise this comprehension.
    """
    blocks = native.blocks
    if blocks is not None:
        try:
            ids: list[int] = blocks.page_ids(
                slots.numpy(), start, unit, unit, -1 if stop is None else stop
            )
            return ids
        except TypeError:  # not on the CPU, or not int64: the comprehension
            pass
    return [slot // unit for slot in slots[start:stop:unit].tolist()]


def _fill_targets(paged: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
    """What to fill so every paged buffer is reached: pairs fused, the rest alone.

    SGLang stores a layer's K and V (when their shapes agree) as the two halves of one
    ``[2, rows, ...]`` allocation; ``paged`` lists every K, then every V. Where K and V
    of a layer are such halves (one storage, equal shape, strides and type, V at a
    fixed element distance from K, the halves not overlapping), the pair is one view
    ``[2, pages, page_size, ...]`` over exactly their elements (checked), zeroed by one
    indexed fill along dimension 1; any other buffer is filled alone along 0.
    """
    half = len(paged) // 2
    targets: list[tuple[torch.Tensor, int]] = []
    fused: set[int] = set()
    if len(paged) % 2 == 0:
        for i in range(half):
            pair = _fused(paged[i], paged[half + i])
            if pair is not None:
                targets.append((pair, 1))
                fused.update((i, half + i))
    targets.extend((buf, 0) for i, buf in enumerate(paged) if i not in fused)
    return targets


def _byte_views(fills: Sequence[tuple[torch.Tensor, int]]) -> list[tuple[np.ndarray, int]] | None:
    """Each CPU fill target as a numpy array of its bytes (same memory), or None.

    A numpy indexed assignment zeroes the pages on the calling thread; torch's
    ``index_fill_`` hands a fill to its OpenMP threads, which in a serving process wait
    for cores the engine holds (:func:`kvgov.allocator.zeroize.zero_rows`). None where a
    target is not on the CPU or numpy cannot view it as bytes (its last dimension
    strided): every fill then goes through ``index_fill_``.
    """
    views: list[tuple[np.ndarray, int]] = []
    for target, dim in fills:
        raw = byte_view(target)
        if raw is None or raw.shape[: dim + 1] != tuple(target.shape[: dim + 1]):
            return None  # no byte view, or not page-indexed along the same dimension
        views.append((raw, dim))
    return views


def _fused(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """One ``[2, *k.shape]`` view whose halves are exactly ``k`` and ``v``, or None."""
    if (
        k.dtype != v.dtype
        or k.device != v.device
        or k.shape != v.shape
        or k.stride() != v.stride()
        or k.numel() == 0
        or k.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
    ):
        return None
    distance = v.storage_offset() - k.storage_offset()
    # the highest element offset a buffer reaches from its first, plus one
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(k.shape, k.stride(), strict=True))
    if distance < span or any(st < 0 for st in k.stride()):
        return None  # V before K, or the halves overlap: filled one by one
    try:
        pair = k.as_strided((2, *k.shape), (distance, *k.stride()), k.storage_offset())
    except RuntimeError:  # beyond the storage
        return None
    for half, buf in zip(pair, (k, v), strict=True):
        if (
            half.data_ptr() != buf.data_ptr()
            or half.shape != buf.shape
            or half.stride() != buf.stride()
        ):
            return None
    return pair


class SglangPoolAdapter:
    """SGLang's paged KV pool as the governor's observed pool.

    SGLang's tree and allocator hand out, match and free pages themselves; the
    governor only reads events (:meth:`take_events`) and states. Page ids are
    ``0..num_pages`` (page 0 is SGLang's padding page, never handed out).
    """

    __slots__ = (
        "_allocator",
        "_bytes",
        "_events",
        "_num",
        "audit_zeroized",
        "evict_unlocked",
        "zeroer",
    )

    def __init__(
        self, allocator: Any, num_pages: int, bytes_per_page: int, zeroer: PageZeroer
    ) -> None:
        self._allocator = allocator
        self._num = num_pages + 1
        self._bytes = bytes_per_page
        self._events: list[PoolEvent] = []
        self.zeroer = zeroer
        #: the cache's "evict every unlocked page" (set by the governed cache)
        self.evict_unlocked: Callable[[], int] | None = None
        #: writes the zeroization events still pending (set by the governance)
        self.audit_zeroized: Callable[[], None] | None = None

    @property
    def num_blocks(self) -> int:
        """Pages in the pool, SGLang's padding page 0 included."""
        return self._num

    @property
    def bytes_per_block(self) -> int:
        """Bytes of KV one page holds across every layer's K and V."""
        return self._bytes

    def add(self, event: PoolEvent) -> None:
        """Queue an event for the governor (the zeroer and the cache call it)."""
        self._events.append(event)

    def take_events(self) -> list[PoolEvent]:
        """Events since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def _free_set(self) -> set[int]:
        return set(self._allocator.get_all_free_pages().tolist())

    def states(self, block_ids: Sequence[int]) -> list[BlockState]:
        """FREE if in the allocator's free list, else OWNED (the tree holds it)."""
        free = self._free_set()
        return [BlockState.FREE if i == 0 or i in free else BlockState.OWNED for i in block_ids]

    def counts(self) -> PoolCounts:
        """Pages by state (cached pages count as owned: the tree holds them)."""
        free = len(self._free_set()) + 1
        return PoolCounts(free=free, owned=self._num - free, cached=0, dirty=0)

    def read_back_zero(self, block_ids: Sequence[int]) -> bool | None:
        """Whether every page reads zero in every K and V buffer (pending zeroing done first).

        The device KV buffers live in this process (SGLang's scheduler), so they are read.
        """
        self.zeroer.flush()
        return self.zeroer.reads_zero(_checked(block_ids, self._num))

    def _driven(self, call: str) -> InternalError:
        return InternalError(f"{call} on SGLang's pool: SGLang's tree does that itself")

    def _erase(self, block_ids: Iterable[int], reason: str) -> list[int]:
        """Evict every unlocked page of the tree; the ones of ``block_ids`` now free, zeroed."""
        if not isinstance(reason, str) or not reason:
            raise InvalidSpec("reason", reason, "must be a non-empty string")
        ids = _checked(block_ids, self._num)
        if self.evict_unlocked is None:
            raise self._driven("evict (no cache attached)")
        zeroer = self.zeroer
        zeroer.flush()  # what was released before: its own zeroization
        self.evict_unlocked()
        freed = zeroer.pending_ids()
        if freed:
            self.add(BlocksEvicted(tuple(freed), (b"",) * len(freed), reason))
            zeroer.flush()
        if self.audit_zeroized is not None:  # the zeroizations before the erasure's event
            self.audit_zeroized()
        free = self._free_set()
        return [i for i in ids if i in free]

    def evict(self, block_ids: Iterable[int], reason: str) -> list[int]:
        """Evict the cached pages among ``block_ids`` (retention); returns those now free.

        SGLang's tree core cannot evict chosen nodes: every page no running request
        holds is evicted (and zeroed); the other tenants' pages are simply recomputed.

        Raises:
            InvalidSpec: ``reason`` is not a non-empty string.
            UnknownBlock: an id is not a page of the pool.
        """
        return self._erase(block_ids, reason)

    def revoke(self, block_ids: Iterable[int], reason: str) -> Revoked:
        """As :meth:`evict` (purge, invalidation); held pages stay, in retired namespaces.

        Raises:
            InvalidSpec: ``reason`` is not a non-empty string.
            UnknownBlock: an id is not a page of the pool.
        """
        return Revoked(evicted=tuple(self._erase(block_ids, reason)), detached=())

    def allocate(self, n: int) -> list[int]:
        """Never called: SGLang allocates."""
        raise self._driven("allocate")

    def free(self, block_ids: Iterable[int], *, cache: bool = True) -> None:
        """Never called: SGLang frees."""
        raise self._driven("free")

    def lookup(self, keys: Iterable[bytes]) -> list[int]:
        """Never called: SGLang's tree matches."""
        raise self._driven("lookup")

    def set_keys(
        self, block_ids: Sequence[int], keys: Sequence[bytes], *, priority: int
    ) -> list[bool]:
        """Never called: SGLang's tree inserts."""
        raise self._driven("set_keys")


def _checked(block_ids: Iterable[int], num: int) -> list[int]:
    ids = list(block_ids)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num:
            raise UnknownBlock(i, num)
    return ids


@dataclass(slots=True)
class Decided:
    """One scope's admission at one prompt length, decided under one policy revision.

    Attributes:
        revision: the policy bundle revision it was decided under.
        view: the scope's view.
        ttl: retention of its pages; None: it may cache nothing (a private namespace).
        root: the namespace root it publishes in (its tenant's or a share group's).
        digest: the scope digest.
        shared: ``root`` is a share group's.
        event: its ``admission`` event without a request id (each request's is derived).
        namespaces: (extra_key, cache_salt, generation) -> its tree namespace.
        folded: pages reused -> ``event`` holding an own reuse of that many pages
            (``details.own_reuse``, ``reused_tokens``), each request's derived from it
            (its id and pages): the details checked once and shared, so the sealer
            encodes them once for a run of equal hits.
    """

    revision: str
    view: ScopeView
    ttl: float | None
    root: bytes
    digest: bytes
    shared: bool
    event: AuditEvent
    namespaces: dict[tuple[str | None, str | None, int], str] = field(default_factory=dict)
    folded: dict[int, AuditEvent] = field(default_factory=dict)


@dataclass(slots=True)
class Admitted:
    """What the binding decided for one request (kept on the request while it lives).

    Attributes:
        namespace: its tree namespace.
        scope: its scope; None: refused, a private namespace, nothing shared.
        ttl: retention of the pages it caches (None: none).
        view: the scope's view where its hits are judged and audited (None: it
            caches nothing shared, a private namespace).
        seq_id: the request id (the audit trail's ``sequence_id``).
        shared: it publishes and reads in a share group's namespace, where pages
            of other tenants are judged per owner by the sharing policy.
        reused: pages of its hit already audited as reused (a later match that
            finds more audits only the rest).
        pending: the admission whose event (``Decided.event`` with this request's
            id) is held back for the request's first match, which writes it
            (:meth:`SglangGovernance.record_admission`); None once written, or
            written at admission.
    """

    namespace: str
    scope: CacheScope | None
    ttl: float | None = None
    view: ScopeView | None = None
    seq_id: str = ""
    shared: bool = False
    reused: int = 0
    pending: Decided | None = None


def _request_facts(req: Any) -> tuple[int, Any]:
    """A request's prompt length and its front end's parameters (``custom_params``), as
    a refusal names them; raises whatever reading SGLang's request raises."""
    sp = getattr(req, "sampling_params", None)
    return len(req.origin_input_ids), getattr(sp, "custom_params", None) if sp is not None else None


class SglangGovernance:
    """One scheduler's governance: governor, scope resolver, page zeroer.

    ``fold_own_reuse`` (True) is the audit trail's event layout: a request first
    seen by a match (``admit(req, defer=True)``) has its ``admission`` event written
    after that match, and where the match's hit, in the request's own namespace, is
    only its own scope's pages, that one event records the reuse too
    (``details.own_reuse``, ``block_ids`` the pages, ``reused_tokens`` theirs; every
    compliance query lists it as its own ``reuse`` record), not an admission and a
    ``reuse``. False writes every admission when the request is admitted and each
    reuse apart (the layout before; the equivalence test replays a workload under
    each).

    Args:
        governor: the governor over a :class:`SglangPoolAdapter`.
        adapter: that adapter.
        resolver: request -> scope.
        zeroer: the device pool's zeroer.
        sweep_interval: the shortest time between two sweeps of :meth:`sweep_due`.

    Raises:
        InvalidArgument: ``sweep_interval`` is not a finite number >= 0.
    """

    #: The event layout (see the class docstring).
    fold_own_reuse: bool = True

    def __init__(
        self,
        *,
        governor: Governor,
        adapter: SglangPoolAdapter,
        resolver: ScopeResolver,
        zeroer: PageZeroer,
        sweep_interval: float = SWEEP_INTERVAL,
    ) -> None:
        self.gov = governor
        self.adapter = adapter
        self.resolver = resolver
        self.zeroer = zeroer
        self.device = str(zeroer.buffers[0].device)
        zeroer.on_zeroed = self._zeroed
        adapter.audit_zeroized = self.audit_zeroized
        # zeroed pages whose zeroization event is not written yet: id(owner) -> the owner,
        # its pages, the seconds spent zeroing them (see _zeroed)
        self._zero_pending: dict[int, tuple[CacheScope | None, list[int], list[float]]] = {}
        self._zero_pending_pages = 0
        self._zero_bytes_per_page = zeroer.bytes_per_page
        # (id of the scope, prompt tokens) -> its admission decided under a policy revision
        self._decided: dict[tuple[int, int], Decided] = {}
        self._digests: dict[CacheScope, bytes] = {}
        #: the REUSE event of each owner scope, derived per reuse (see judge_hit)
        # namespace root -> generation: an erasure moves every namespace it retires to
        # the next one, so pages a running request still holds there are never found again
        self._generation: dict[bytes, int] = {}
        # live namespace -> its root, and the scopes admitted into it
        self._ns_root: dict[str, bytes] = {}
        self._ns_scopes: dict[str, set[CacheScope]] = {}
        #: the cache's "forget these namespaces" (set by the governed cache)
        self.on_retired: Callable[[set[str]], None] | None = None
        self._sweep_interval = SWEEP_INTERVAL
        self.sweep_interval = sweep_interval
        self._last_sweep = -math.inf
        # HiCache host pages zeroed and not yet audited: pages, bytes, seconds (any thread)
        self._host_lock = threading.Lock()
        self._host_pending: list[float] = [0, 0, 0.0]
        #: HiCache host-pool pages zeroed so far
        self.host_pages_zeroed = 0

    @classmethod
    def open(
        cls,
        *,
        allocator: Any,
        buffers: Sequence[torch.Tensor],
        page_size: int,
        num_pages: int,
        engine: EngineScope,
        environ: Mapping[str, str],
        clock: Callable[[], float] = time.time,
    ) -> SglangGovernance:
        """Read the settings (``KVGOV_*`` environment), open the governor's parts.

        Raises:
            BindingConfigError: invalid settings, a scope token required without a key,
                or a setting of the vLLM binding's this one cannot honour
                (:data:`VLLM_ONLY_SETTINGS`).
            KeySecretError, PolicyLoadError, AuditSchemaError: as for the vLLM binding.
        """
        settings = BindingSettings.load(None, environ)
        _refuse_vllm_only(environ)
        engine = replace(  # the revision settings override SGLang's --revision, as for vLLM
            engine,
            model_revision=revision_of(settings.model_revision or engine.model_revision),
            tokenizer_revision=revision_of(
                settings.tokenizer_revision or engine.tokenizer_revision
            ),
        )
        resolver = ScopeResolver.from_settings(settings, engine, environ, clock)
        zeroer = PageZeroer(buffers, page_size)
        parts = open_parts(
            policy_dir=settings.policy_dir,
            policy_data=settings.policy_data,
            audit_url=settings.audit_url,
            key_secret=settings.key_secret(),
            ephemeral_secret=settings.ephemeral_secret,
            clock=clock,
            worker_id=settings.worker_id,
            policy_engine="embedded",
            audit_writer=settings.audit_writer,
        )
        try:
            adapter = SglangPoolAdapter(allocator, num_pages, zeroer.bytes_per_page, zeroer)
            governor = Governor(
                pool=adapter,  # the observed half of the protocol (the others raise)
                policy=parts.policy,
                audit=parts.audit,
                deriver=parts.deriver,
                block_size=page_size,
                clock=clock,
            )
            return cls(governor=governor, adapter=adapter, resolver=resolver, zeroer=zeroer)
        except BaseException:
            parts.close()
            raise

    # ------------------------------------------------------------------ admission

    def admit(self, req: Any, *, defer: bool = False) -> Admitted:
        """Decide a request once; returns its tree namespace (refused: a private one).

        Never raises: a refusal (no or bad scope, policy denial, an unexpected error) is
        audited, and the request gets a namespace of its own, so it reads and publishes
        nothing shared (SGLang's tree cannot refuse a request; the front end can).

        Args:
            req: SGLang's request.
            defer: the caller matches the request next and then calls
                :meth:`record_admission`, whatever happens: a cacheable admission's
                event is held back for it (``Admitted.pending``, under
                :attr:`fold_own_reuse`); it is counted now.
        """
        try:
            seq_id = str(req.rid)
            num_tokens, params = _request_facts(req)
        except Exception as exc:
            refuse(
                self.gov.ledger,
                self.gov.audit,
                "",
                None,
                describe_error(exc),
                None,
                path=ERROR_PATH,
            )
            return self._private()
        problem = request_id_problem(seq_id)
        if problem is not None:  # the trail could not name it: refused, audited escaped
            refuse(self.gov.ledger, self.gov.audit, seq_id, num_tokens, problem, params,
                   path=SCOPE_PATH)  # fmt: skip
            return self._private()
        try:
            return self._admit(req, seq_id, num_tokens, params, defer)
        except Exception as exc:
            _log.exception("kvgov: admitting request %r failed; caching nothing of it", seq_id)
            refuse(
                self.gov.ledger,
                self.gov.audit,
                seq_id,
                num_tokens,
                describe_error(exc),
                params,
                path=ERROR_PATH,
            )
            return self._private()

    def _private(self) -> Admitted:
        return Admitted(namespace=f"{NAMESPACE_PREFIX}private:{uuid.uuid4().hex}", scope=None)

    def _admit(
        self,
        req: Any,
        seq_id: str,
        num_tokens: int,
        params: Mapping[str, Any] | None,
        defer: bool = False,
    ) -> Admitted:
        gov = self.gov
        try:
            gov.check_open()
            adapter = _LoraName(req.lora_id) if getattr(req, "lora_id", None) else None
            scope = self.resolver.resolve(params, adapter)
            gov.check_not_purging(scope.tenant)
            # keyed by the scope object (the resolver hands out one per scope; the entry
            # holds it, so its id stays its own while the entry lives)
            decided = self._decided.get((id(scope), num_tokens))
            if (
                decided is None
                or decided.view.scope is not scope
                or decided.revision != gov.policy.bundle_revision
            ):
                decided = self._decide(scope, seq_id, num_tokens)
        except PolicyDenied:  # audited by the governor
            return self._private()
        except (InvalidScope, ScopeTokenError, PoolClosed, TenantPurging, InvalidArgument) as exc:
            refuse(gov.ledger, gov.audit, seq_id, num_tokens, str(exc), params, path=SCOPE_PATH)
            return self._private()
        except AuditUnavailable:  # fail closed: nothing shared unaudited
            return self._private()
        # every request's admission is counted and audited, the decision made or not:
        # its event is the decided one's with this request's id, written now or, held
        # back, by the request's first match (record_admission), before it uses a page
        gov.count_admission(scope.tenant, num_tokens, 0)
        if decided.ttl is None:  # not cacheable
            gov.audit.record(decided.event.derive(sequence_id=seq_id))
            return Admitted(namespace=self._private().namespace, scope=scope)
        pending = decided if defer and self.fold_own_reuse else None
        if pending is None:
            gov.audit.record(decided.event.derive(sequence_id=seq_id))
        extra_key = getattr(req, "extra_key", None)
        cache_salt = getattr(req, "cache_salt", None)
        root = decided.root
        generation = self._generation.get(root, 0)
        plain = _plain(extra_key) and _plain(cache_salt)
        memo = (extra_key, cache_salt, generation)
        ns = decided.namespaces.get(memo) if plain else None
        if ns is None:
            ns = tree_namespace(root, decided.digest, extra_key, cache_salt, generation=generation)
            # the scope is registered in its namespace (for erasures) whenever the
            # namespace is computed: the memo is per scope, so a hit means it was
            self._ns_root[ns] = root
            self._ns_scopes.setdefault(ns, set()).add(scope)
            if plain:
                if len(decided.namespaces) >= _NAMESPACES_KEPT:
                    decided.namespaces.clear()
                decided.namespaces[memo] = ns
        return Admitted(
            namespace=ns,
            scope=scope,
            ttl=decided.ttl,
            view=decided.view,
            seq_id=seq_id,
            shared=decided.shared,
            pending=pending,
        )

    def record_admission(self, req: Any, adm: Admitted, pages: Sequence[int] = ()) -> bool:
        """Write the admission event :meth:`admit` held back for the request's first match.

        Where ``pages`` (that match's hit, in prefix order, in the request's own
        namespace: not a share group's) are all of one owner, the request's own
        scope, the event records their reuse too (:data:`~kvgov.audit.events.OWN_REUSE_KEY`,
        ``block_ids`` the pages, ``reused_tokens`` their tokens), and the reuse counts
        as audited (``adm.reused``, the tenant's hit tokens): no ``reuse`` event
        follows (:meth:`judge_hit` finds nothing left to audit). Otherwise (no hit, a
        share group's namespace, other owners, an unowned page, a failure while
        looking) the event is the one :meth:`admit` writes, and the hit is judged and
        audited apart. Nothing to do (True) if nothing is held back.

        Never raises: an admission that cannot be written refuses the request as
        :meth:`admit` does (the refusal audited, ``adm`` turned into a private
        namespace's: it reads and publishes nothing shared) and returns False.

        Args:
            req: SGLang's request (the refusal's facts).
            adm: its admission.
            pages: the page ids of the first match's hit (empty: none or not judged).
        """
        decided = adm.pending
        if decided is None:
            return True
        adm.pending = None
        template = decided.event
        gov = self.gov
        event: AuditEvent | None = None
        own, tenant = 0, ""
        try:
            view = adm.view
            if pages and not adm.shared and view is not None:
                groups = gov.ledger.owners.group(pages)
                owner = groups[0][0] if len(groups) == 1 else None
                # the same object as a rule (the owners are the admitted scopes); equal
                # compares the scope's nine fields
                if owner is not None and (owner is view.scope or owner == view.scope):
                    own, tenant = len(pages), view.scope.tenant
                    folded = decided.folded.get(own)
                    if folded is None:
                        if len(decided.folded) >= _FOLDS_KEPT:
                            decided.folded.clear()
                        tokens = own * self.zeroer.page_size
                        folded = decided.folded[own] = template.derive(
                            reused_tokens=tokens,
                            details={
                                **template.details,
                                OWN_REUSE_KEY: {"blocks": own, "reused_tokens": tokens},
                            },
                        )
                    event = folded.derive(sequence_id=adm.seq_id, block_ids=tuple(pages))
        except Exception:  # the admission is written all the same, the hit judged apart
            _log.exception("kvgov: folding the reuse of %r into its admission failed", adm.seq_id)
            event, own = None, 0
        try:
            gov.audit.record(event or template.derive(sequence_id=adm.seq_id))
        except Exception as exc:  # as admit: refused, audited, nothing shared
            _log.exception("kvgov: the admission of request %r could not be audited", adm.seq_id)
            try:
                num_tokens, params = _request_facts(req)
            except Exception:
                num_tokens, params = None, None
            refuse(gov.ledger, gov.audit, adm.seq_id, num_tokens, describe_error(exc), params,
                   path=ERROR_PATH)  # fmt: skip
            adm.namespace = self._private().namespace
            adm.scope = adm.view = adm.ttl = None
            adm.shared = False
            return False
        if own:  # the hit's tokens count as its reuse is audited (as judge_hit counts them)
            gov.ledger.counters[tenant].hit_tokens += own * self.zeroer.page_size
            adm.reused = own
        return True

    def _decide(self, scope: CacheScope, seq_id: str, num_tokens: int) -> Decided:
        """Decide a scope's admission at a prompt length: view, admission policy, plan.

        The outcome is kept (:attr:`_decided`) under the policy revision it was made
        under, when that revision covers everything it read: an allowed admission,
        every decision without an error, a revision whose decisions the policy's cache
        keeps until it changes (``CachedEngine.kept_revision``, as the governor's plans
        are kept: not empty, not unknown, not an OPA server's timed one, the cache on).
        A later request of the
        same scope and length under the same revision is admitted from it: the same
        decisions, as the policy's decision cache would give them, with no policy
        input built. A refusal or a failed decision is never kept (each request asks
        again and each refusal is audited).

        Raises:
            PolicyDenied, InvalidScope, AuditUnavailable: as the governor's steps.
        """
        gov = self.gov
        # read before deciding: a decision made as the policy changes is kept under the
        # older revision, so the next request misses and decides again
        revision = gov.policy.engine.kept_revision()
        view = gov.admission_view(scope, seq_id, num_tokens)
        adm = gov.decide(view, seq_id, num_tokens, None)
        plan = gov.plan(view, b"", bool(adm.cache), 0)
        digest = self._digests.get(scope)
        if digest is None:
            if len(self._digests) >= _DIGESTS_KEPT:
                self._digests.clear()
            digest = self._digests[scope] = bytes(scope_digest(scope))
        root = bytes(plan.root)
        decided = Decided(
            revision=revision or "",
            view=view,
            ttl=plan.ttl if plan.cacheable else None,
            root=root,
            digest=digest,
            shared=root != bytes(view.own_root),
            event=admission_event(
                view,
                None,
                (),
                adm,
                num_tokens=num_tokens,
                cacheable=plan.cacheable,
                ttl=plan.ttl,
                requested_priority=None,
                cached_tokens=0,
            ),
        )
        # kept only under a revision whose decisions the policy's cache itself keeps
        # until it changes (not an OPA server's timed ones, an unknown or empty one)
        if revision is not None and adm.decision.error is None and not plan.failed:
            if len(self._decided) >= _DECIDED_SIZE:
                self._decided.clear()
            self._decided[(id(scope), num_tokens)] = decided
        return decided

    # ------------------------------------------------------------------ hits

    def judge_hit(self, adm: Admitted, pages: Sequence[int]) -> int:
        """How many leading pages of a hit the request may use; the reuse is audited.

        In a share group's namespace the hit may hold pages of other tenants: each
        owner is judged by the sharing policy (:func:`kvgov.govern.sharing.judge`, one
        decision per owner scope), the hit is cut at the first page whose owner is
        refused (``share_denied``, audited). The pages kept that were not audited by
        an earlier match of the same request are audited as reused (``reuse``, or
        ``cross_tenant_reuse`` naming the granting decision), once per owner scope;
        those the request's admission event already holds
        (:meth:`record_admission`) are not audited again.
        In the tenant's own namespace every page is the tenant's: no decision.

        Never raises: a failure (an unowned page, the audit trail down for a
        critical event) is logged and the hit refused (0), so nothing is shared
        unjudged or unaudited.

        Args:
            adm: the request's admission (``adm.view`` not None).
            pages: the page ids of the hit, in prefix order.

        Returns:
            The pages the request may use (a prefix of ``pages``).
        """
        view = adm.view
        if view is None or not pages:
            return 0
        gov = self.gov
        try:
            if adm.shared:
                verdict = sharing.judge(gov.ledger, gov.policy, gov.audit, view, pages, adm.seq_id)
                keep, granted = verdict.keep, verdict.granted
            else:
                keep, granted = len(pages), {}
            if keep > adm.reused:
                # the admission's count holds no hit (SGLang matches after admitting):
                # the hit's tokens count here, once per request as the reuse is audited
                # (or in record_admission, where the admission's event holds the reuse)
                sharing.audit_reuse(
                    gov.ledger,
                    gov.audit,
                    self.zeroer.page_size,
                    view,
                    pages[adm.reused : keep],
                    adm.seq_id,
                    granted,
                )
                gov.ledger.counters[view.scope.tenant].hit_tokens += (
                    keep - adm.reused
                ) * self.zeroer.page_size
                adm.reused = keep
        except Exception:
            _log.exception("kvgov: judging the hit of request %r failed; refusing it", adm.seq_id)
            return 0
        return keep

    # ------------------------------------------------------------------ pages

    def owned(self, pages: Sequence[int], scope: CacheScope, ttl: float | None = None) -> None:
        """The tree took ``pages`` written by ``scope``: record the owner of the unowned ones.

        ``ttl``: their retention (seconds from now; None: none), for :meth:`sweep`.
        """
        if not pages:
            return
        ledger = self.gov.ledger
        new = ledger.owners.assign_unowned(pages, scope)
        if new and ttl is not None:
            ledger.deadlines.keyed_cached(new, ttl)

    # ------------------------------------------------------------------ erasure

    def _retire(self, matches: Callable[[CacheScope], bool]) -> None:
        """Retire every namespace a matching scope was admitted into (next generation)."""
        retired = {ns for ns, scopes in self._ns_scopes.items() if any(map(matches, scopes))}
        for ns in retired:
            root = self._ns_root.pop(ns)
            self._ns_scopes.pop(ns)
            self._generation[root] = self._generation.get(root, 0) + 1
        if retired and self.on_retired is not None:
            self.on_retired(retired)

    def purge_tenant(self, tenant: str) -> ErasureReport:
        """Erase a tenant: every page it wrote that no running request holds is evicted and zeroed.

        Audited (``erasure``); ``verified`` from ownership (every page the ledger names the
        tenant's is free and reads zero). A page a running request holds counts in
        ``held_blocks``; the tenant's namespaces are retired, so nothing matches it again.

        Raises:
            InvalidScope: tenant is not a valid identifier.
            AuditUnavailable: the erasure could not be audited.
        """
        report = self.gov.purge_tenant(tenant, ())
        self._retire(lambda scope: scope.tenant == tenant)
        return report

    def invalidate(self, wanted: Mapping[str, str]) -> InvalidationReport:
        """Drop every page of a matching scope (``model``, ``adapter``, ... = value), audited.

        Raises:
            InvalidArgument: no filter, or a field that is not a filter.
        """
        report = self.gov.invalidate(wanted, ())
        self._retire(lambda scope: all(getattr(scope, k) == v for k, v in wanted.items()))
        return report

    @property
    def sweep_interval(self) -> float:
        """The shortest time between two sweeps of :meth:`sweep_due` (seconds)."""
        return self._sweep_interval

    @sweep_interval.setter
    def sweep_interval(self, seconds: float) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            raise InvalidArgument("sweep_interval", seconds, "a finite number of seconds >= 0")
        self._sweep_interval = float(seconds)

    def sweep(self) -> int:
        """Evict the pages past their retention (audited ``retention_sweep``); returns how many.

        SGLang's tree core cannot evict chosen nodes safely (see :meth:`sweep_due`), so a
        sweep with anything due evicts every page no running request holds.
        """
        gov = self.gov
        self._last_sweep = gov.clock()
        return gov.sweep()

    def sweep_due(self) -> int:
        """:meth:`sweep` if a deadline is due and the last sweep is ``sweep_interval`` old.

        Expiries are batched: a sweep empties the unheld part of the tree (the Rust
        tree core evicts chosen nodes only by a call that panics, poisoning the tree,
        on a node a running request holds, and it does not say which are held), so
        sweeping at every deadline would keep the cache empty. A page outlives its
        retention by at most ``sweep_interval`` (default :data:`SWEEP_INTERVAL`).
        """
        gov = self.gov
        now = gov.clock()
        if gov.ledger.deadlines.next_due() > now or now - self._last_sweep < self._sweep_interval:
            return 0
        return self.sweep()

    def _zeroed(self, pages: list[int], nbytes: int, seconds: float) -> None:
        """Pages were just zeroed: clear their owners and count them now; audit in batches.

        The bytes are zero before the allocator can hand the pages out again; the
        ``zeroization`` events (one per owner) are written per batch of
        :data:`ZERO_AUDIT_BATCH` pages, and always before an erasure's, a sweep's or
        the close's own events (:meth:`audit_zeroized`).
        """
        if not pages:
            return
        ledger = self.gov.ledger
        per_page = nbytes // len(pages)
        pending = self._zero_pending
        for scope, ids in ledger.owners.group(pages, clear=True):
            counters = ledger.counters[scope.tenant] if scope else ledger.unattributed
            counters.blocks_zeroized += len(ids)
            counters.bytes_zeroized += per_page * len(ids)
            entry = pending.get(id(scope))
            if entry is None:
                pending[id(scope)] = (scope, list(ids), [seconds])
            else:
                entry[1].extend(ids)
                entry[2][0] += seconds
        self._zero_pending_pages += len(pages)
        self._zero_bytes_per_page = per_page
        if self._zero_pending_pages >= ZERO_AUDIT_BATCH:
            self.audit_zeroized()

    def audit_zeroized(self) -> None:
        """Write the ``zeroization`` events of the pages zeroed since the last call, per owner."""
        pending, self._zero_pending = self._zero_pending, {}
        self._zero_pending_pages = 0
        per_page = self._zero_bytes_per_page
        for scope, ids, seconds in pending.values():
            self.gov.audit.record(
                AuditEvent(
                    type=EventType.ZEROIZATION,
                    tenant=scope.tenant if scope else None,
                    block_ids=tuple(ids),
                    details={
                        "bytes": per_page * len(ids),
                        "device": self.device,
                        "seconds": seconds[0],
                    },
                )
            )

    def host_zeroed(self, pages: int, nbytes: int, seconds: float) -> None:
        """HiCache host pages were just zeroed (the host pool took them back).

        Counted now; audited (``zeroization``, ``details.device`` ``"host"``) per batch
        of :data:`ZERO_AUDIT_BATCH` pages and at close. Host pages have no owner in the
        ledger (it names device pages), so the events name no tenant. Thread-safe.
        """
        with self._host_lock:
            pending = self._host_pending
            pending[0] += pages
            pending[1] += nbytes
            pending[2] += seconds
            self.host_pages_zeroed += pages
            due = pending[0] >= ZERO_AUDIT_BATCH
        if due:
            self.audit_host_zeroized()

    def audit_host_zeroized(self) -> None:
        """Write the ``zeroization`` event of the host pages zeroed since the last call."""
        with self._host_lock:
            pages, nbytes, seconds = self._host_pending
            self._host_pending = [0, 0, 0.0]
        if not pages:
            return
        self.gov.audit.record(
            AuditEvent(
                type=EventType.ZEROIZATION,
                details={
                    "bytes": int(nbytes),
                    "device": "host",
                    "pages": int(pages),
                    "pool": "hicache_host",
                    "seconds": seconds,
                },
            )
        )

    def flush(self) -> None:
        """Zero what is pending, write the zeroization events held back, store every event.

        Everything the cache has done is then evidence in the audit database (or its
        spool while the database is down); the cache stays open. What :meth:`close`
        does before it closes; for an operator's checkpoint, and for a benchmark
        whose timed work ends with its evidence stored.

        Raises:
            PoolClosed: the governance is closed.
            AuditUnavailable: some events could be written neither to the database
                nor to the spool (they stay in memory and are retried).
        """
        self.gov.check_open()
        self._zero_pending_audited()
        self.gov.audit.flush()

    def close(self) -> None:
        """Zero what is pending, flush and close the audit trail. Idempotent."""
        if self.gov.closed:
            return
        try:
            self._zero_pending_audited()
        finally:
            self.gov.close()

    def _zero_pending_audited(self) -> None:
        """Zero the pages released since the last allocation; write every zeroization
        event held back (device and host)."""
        self.zeroer.flush()
        self.audit_zeroized()
        self.audit_host_zeroized()


#: Scope digests kept, then emptied (a bound on memory).
_DIGESTS_KEPT = 65_536
#: Admissions kept (scope and prompt length: the admission policy's input), then emptied:
#: a bound on memory (each holds its view and admission event, and up to _FOLDS_KEPT
#: folded ones: a few KiB, at most some tens).
_DECIDED_SIZE = 4096
#: Tree namespaces kept per admission (client extra_key and cache_salt), then emptied.
_NAMESPACES_KEPT = 1024
#: Folded admission events kept per admission (one per hit length in pages), then emptied:
#: with _DECIDED_SIZE, a bound on memory (a scope's hits at one prompt length mostly
#: have one or two lengths, its shared system prompts').
_FOLDS_KEPT = 8


def _plain(value: object) -> bool:
    """A client field the namespace cache may key on: None or an exact ``str``."""
    return value is None or type(value) is str


@dataclass(frozen=True, slots=True)
class _LoraName:
    """SGLang's adapter id as the resolver reads an adapter (name and path)."""

    lora_id: str

    @property
    def lora_name(self) -> str:
        return self.lora_id

    @property
    def lora_path(self) -> str:
        return revision_of(self.lora_id)
