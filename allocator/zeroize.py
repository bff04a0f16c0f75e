"""Batched zeroization of pool blocks: coalesce block ids into runs, one clear per run.

The pool tensor is block-major, so block ``i`` is one contiguous byte range and
adjacent ids are adjacent ranges. A batch of blocks is sorted, adjacent ids are
merged into runs, and each run is cleared with one call: on CPU a copy from a
buffer of zeros for small runs, a libc ``memset`` for larger ones and ``zero_()``
on a view for very large ones (:class:`CpuZeroizer`), on CUDA a
``zero_()`` on a view, one fill kernel per run enqueued on the pool's stream. Sixty-four
scattered blocks cost at most 64 calls; a freed sequence whose blocks were
handed out together usually costs one.

A zeroizer is chosen once per pool by device (:func:`make_zeroizer`); the pool
never checks the device again.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Protocol, cast

import numpy as np
import torch

from kvgov.exceptions import InternalError, ZeroizationError

__all__ = [
    "GIL_HELD_MAX_BYTES",
    "PARALLEL_MIN_BYTES",
    "RUN_VIEW_CACHE_SIZE",
    "CpuZeroizer",
    "CudaZeroizer",
    "RunViews",
    "Zeroizer",
    "byte_view",
    "coalesce_runs",
    "make_zeroizer",
    "zero_rows",
]

#: Run views a zeroizer keeps (see :class:`RunViews`); a view is a few hundred bytes.
RUN_VIEW_CACHE_SIZE = 4096


def coalesce_runs(sorted_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Merge ascending, distinct block ids into half-open runs of adjacent ids.

    Args:
        sorted_ids: block ids, ascending, no duplicates.

    Returns:
        ``[(start, stop), ...]`` with ``stop`` exclusive, ascending; empty for no ids.

    Example:
        ``coalesce_runs([1, 2, 3, 7, 9, 10]) == [(1, 4), (7, 8), (9, 11)]``
    """
    if not sorted_ids:
        return []
    if sorted_ids[-1] - sorted_ids[0] == len(sorted_ids) - 1:
        return [(sorted_ids[0], sorted_ids[-1] + 1)]  # one run: O(1), the common case
    runs: list[tuple[int, int]] = []
    start = prev = sorted_ids[0]
    for b in islice(sorted_ids, 1, None):
        if b != prev + 1:
            runs.append((start, prev + 1))
            start = b
        prev = b
    runs.append((start, prev + 1))
    return runs


class Zeroizer(Protocol):
    """Clears runs of blocks of one pool tensor and reports how long it took."""

    def zeroize(self, runs: Sequence[tuple[int, int]]) -> float:
        """Zero every block in ``runs``; return when the zeros are in memory.

        Args:
            runs: half-open ``(start, stop)`` block ranges from :func:`coalesce_runs`.

        Returns:
            Seconds the zeroing took (see :class:`~kvgov.allocator.events.BlocksZeroized`).

        Raises:
            ZeroizationError: verification is on and a block read back non-zero.
        """
        ...


def _verify(words: torch.Tensor, runs: Sequence[tuple[int, int]]) -> None:
    """Read every run back; raise naming each block that holds a non-zero word."""
    flags = torch.stack([words[a:b].any() for a, b in runs]).tolist()
    if any(flags):
        bad: list[int] = []
        for (a, b), dirty in zip(runs, flags, strict=True):
            if dirty:
                rows = words[a:b].any(dim=1).nonzero().flatten().tolist()
                bad.extend(a + int(r) for r in rows)
        raise ZeroizationError(bad)


class RunViews:
    """Views of runs of blocks of one pool tensor, memoized.

    Why: building a tensor view (``words[a:b]``) costs PyTorch more host time
    than zeroing a few small blocks, and a block pool reuses the same runs over
    and over (the free stack is LIFO, so a sequence's blocks come back as the
    run they left as). A dict from run to view makes the steady state one dict
    lookup per run. Bounded: when it holds ``limit`` views it is emptied and
    refilled, so memory stays small whatever the access pattern.

    Args:
        words: the pool as a ``[num_blocks, words_per_block]`` integer view.
        limit: most views kept.
    """

    __slots__ = ("_limit", "_views", "words")

    def __init__(self, words: torch.Tensor, limit: int = RUN_VIEW_CACHE_SIZE) -> None:
        self.words = words
        self._limit = limit
        self._views: dict[tuple[int, int], torch.Tensor] = {}

    def get(self, run: tuple[int, int]) -> torch.Tensor:
        """Return the view of blocks ``run[0] .. run[1] - 1``.

        Args:
            run: half-open block range.

        Returns:
            A ``[run[1] - run[0], words_per_block]`` view of the pool.
        """
        view = self._views.get(run)
        if view is None:
            if len(self._views) >= self._limit:
                self._views.clear()
            view = self._views[run] = self.words[run[0] : run[1]]
        return view


def _libc_memset() -> Callable[[int, int, int], object] | None:
    """libc ``memset`` through ctypes, called without the GIL; None where libc cannot
    be loaded.

    Why not ``zero_()`` for runs under ``PARALLEL_MIN_BYTES``: ``zero_()`` on CPU
    fills with OpenMP worker threads, which spin for a while after every parallel
    region. In a serving process those spinning workers took more CPU than the
    whole governed hot path (about 3 us per block of a trace replay on 2 cores)
    away from the audit writer and everything else. ``ctypes.CDLL`` releases the
    GIL for the call, so other Python threads run during a large clear, and starts
    no thread pool; memory bandwidth, not threads, bounds it.
    """
    try:
        fn = ctypes.CDLL(None).memset
    except (OSError, AttributeError, TypeError):  # pragma: no cover - no libc (Windows)
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    fn.restype = ctypes.c_void_p
    return cast(Callable[[int, int, int], object], fn)  # called as is: no wrapper frame


#: Runs up to this many bytes are cleared by a copy from a buffer of zeros with the
#: GIL held (tens of microseconds at most); larger ones by memset with the GIL
#: released, so other threads run meanwhile (``zero_()`` where libc is missing).
GIL_HELD_MAX_BYTES = 256 * 2**10
#: Runs of at least this many bytes are cleared by ``zero_()``: filling one takes
#: long enough that OpenMP's parallel fill pays for its workers' spin afterwards
#: (two workers clear 64 scattered 2 MiB blocks about 1.4x faster than memset here);
#: a request's many small runs would pay the spin on every one.
PARALLEL_MIN_BYTES = 2**20


@functools.cache
def _zeros() -> memoryview:
    """``GIL_HELD_MAX_BYTES`` zero bytes, read-only, one buffer for every CPU pool."""
    return memoryview(bytes(GIL_HELD_MAX_BYTES))


class CpuZeroizer:
    """Zeroizes blocks of a CPU pool; ``seconds`` is host wall time of the clears.

    Runs are cleared straight in the pool's contiguous memory, by size:

    * up to ``GIL_HELD_MAX_BYTES``: copied over from a buffer of zeros through a
      ``memoryview`` of the pool, with the GIL held. Why not ``zero_()``: PyTorch
      releases the GIL for every op, and taking it back waits for whichever thread
      holds it then (the audit writer, a scheduler) for up to the interpreter's
      switch interval; for the small runs a request frees that wait was 25x the
      clear itself (1.4 us alone, about 36 us beside a busy writer thread). Why
      not a ctypes ``memset``: converting its three arguments costs 1.0 us a call,
      the slice assignment 0.35 us, for the same 8 KiB;
    * below ``PARALLEL_MIN_BYTES``: libc ``memset`` with the GIL released (see
      :func:`_libc_memset`);
    * from ``PARALLEL_MIN_BYTES``, and where libc cannot be loaded: ``zero_()`` on
      a view of the run.

    Either way the bytes are zero when this returns.

    Args:
        words: the pool as a contiguous ``[num_blocks, words_per_block]`` integer view.
        verify: read each run back after clearing it and raise if any word is non-zero.

    Raises:
        InternalError: ``words`` is not contiguous (the byte arithmetic needs it).
    """

    __slots__ = (
        "_base",
        "_block_bytes",
        "_mem",
        "_memset_nogil",
        "_verify",
        "_views",
        "_words",
        "_zeros",
    )

    def __init__(self, words: torch.Tensor, verify: bool) -> None:
        if not words.is_contiguous():
            raise InternalError("CPU zeroizer needs the contiguous pool tensor")
        self._words = words
        self._views = RunViews(words)
        self._verify = verify
        self._memset_nogil = _libc_memset()
        self._base = words.data_ptr()
        self._block_bytes = words.shape[1] * words.element_size()
        # The pool's bytes as one writable buffer (the tensor, held above, owns them)
        # and the zeros small runs are copied from.
        pool_bytes = ctypes.c_char * (words.shape[0] * self._block_bytes)
        self._mem = memoryview(pool_bytes.from_address(self._base)).cast("B")
        self._zeros = _zeros()

    def _clear(self, start: int, stop: int) -> None:
        """Zero blocks ``start .. stop - 1`` (one run); the one place bytes are cleared."""
        nbytes = (stop - start) * self._block_bytes
        if nbytes <= GIL_HELD_MAX_BYTES:
            offset = start * self._block_bytes
            self._mem[offset : offset + nbytes] = self._zeros[:nbytes]
        elif nbytes < PARALLEL_MIN_BYTES and self._memset_nogil is not None:
            self._memset_nogil(self._base + start * self._block_bytes, 0, nbytes)
        else:
            self._views.get((start, stop)).zero_()

    def zeroize(self, runs: Sequence[tuple[int, int]]) -> float:
        """Zero every block in ``runs`` (see :meth:`Zeroizer.zeroize`)."""
        clear = self._clear
        t0 = time.perf_counter()
        for start, stop in runs:
            clear(start, stop)
        seconds = time.perf_counter() - t0
        if self._verify:
            _verify(self._words, runs)
        return seconds


class CudaZeroizer:
    """Zeroizes blocks of a CUDA pool on the pool's stream and waits for them to finish.

    The batch is bracketed by two CUDA events recorded on the stream; the call
    returns only after the end event completed, so a block reported zeroized is
    zero in device memory and any later kernel, on any stream, sees zeros.
    ``seconds`` is the device time between the two events: the fills
    themselves, not work queued on the stream before them (the start event
    only fires once that work is done).

    Args:
        words: the pool as a ``[num_blocks, words_per_block]`` integer view.
        verify: read each run back after clearing it and raise if any word is non-zero.
        stream: the stream to clear on.
    """

    __slots__ = ("_end", "_start", "_stream", "_verify", "_views", "_words")

    def __init__(self, words: torch.Tensor, verify: bool, stream: torch.cuda.Stream) -> None:
        self._words = words
        self._views = RunViews(words)
        self._verify = verify
        self._stream = stream
        self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def _clear(self, view: torch.Tensor) -> None:
        view.zero_()

    def zeroize(self, runs: Sequence[tuple[int, int]]) -> float:
        """Zero every block in ``runs`` (see :meth:`Zeroizer.zeroize`)."""
        view = self._views.get
        clear = self._clear
        with torch.cuda.stream(self._stream):
            self._start.record(self._stream)
            for run in runs:
                clear(view(run))
            self._end.record(self._stream)
            self._end.synchronize()
            seconds = float(self._start.elapsed_time(self._end)) / 1000.0
            if self._verify:
                _verify(self._words, runs)
        return seconds


def make_zeroizer(words: torch.Tensor, verify: bool) -> CpuZeroizer | CudaZeroizer:
    """Pick the zeroizer for the device ``words`` lives on.

    Args:
        words: the pool as a ``[num_blocks, words_per_block]`` integer view.
        verify: read every cleared run back (see :class:`CpuZeroizer`).

    Returns:
        A :class:`CudaZeroizer` on the current stream of the tensor's CUDA device,
        else a :class:`CpuZeroizer`.
    """
    if words.device.type == "cuda":
        return CudaZeroizer(words, verify, torch.cuda.current_stream(words.device))
    return CpuZeroizer(words, verify)


def zero_rows(tensor: torch.Tensor, rows: Sequence[int]) -> None:
    """Zero ``rows`` of ``tensor``'s first dimension in place; the zeros are there on return.

    For a serving engine's KV and state tensors, which the engine lays out (kvgov's
    own pool has :class:`CpuZeroizer`): on CPU, one numpy indexed assignment over the
    tensor's bytes, on the calling thread. Not torch's ``index_fill_``: it splits a
    fill of a few blocks of a layer (hundreds of KiB) over torch's OpenMP threads, which
    in a serving process wait for the cores the engine's other threads and processes
    hold (measured in vLLM's CPU build on 2 cores: 12 layers x 17 blocks of 64 KiB,
    0.47 ms median and 83 ms worst for ``index_fill_`` against 0.16 and 8 here; a
    worker's block copy of that size waited 2-57 ms). On CUDA, or a tensor numpy cannot
    view as bytes (its last dimension strided), ``index_fill_``.

    Args:
        tensor: rows along dimension 0 (any dtype; zero bytes are zero in each).
        rows: the row ids; duplicates allowed.

    Raises:
        IndexError: a row outside ``0 .. tensor.shape[0] - 1`` (nothing is zeroed).
    """
    if not rows:
        return
    n = int(tensor.shape[0])
    low, high = min(rows), max(rows)
    if low < 0 or high >= n:
        raise IndexError(f"rows {low}..{high} outside the first dimension of {n}")
    raw = byte_view(tensor)
    if raw is not None:
        raw[np.asarray(rows, dtype=np.intp)] = 0
        return
    tensor.index_fill_(0, torch.tensor(list(rows), dtype=torch.long, device=tensor.device), 0)


def byte_view(tensor: torch.Tensor) -> np.ndarray | None:
    """``tensor``'s bytes as a numpy array over the same memory (its last dimension in
    bytes), or None: not on the CPU, no dimension, its last dimension strided, or a
    tensor numpy cannot share. For zeroing through numpy on the calling thread."""
    if tensor.device.type != "cpu" or tensor.dim() == 0 or tensor.stride(-1) != 1:
        return None
    try:
        view: np.ndarray = tensor.detach().view(torch.uint8).numpy()
    except (RuntimeError, TypeError, ValueError):  # a tensor numpy cannot share
        return None
    return view
