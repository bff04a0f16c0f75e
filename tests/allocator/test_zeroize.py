"""Tests for allocator.zeroize: run coalescing, clearing, verification, CUDA."""

from __future__ import annotations

import pytest
import torch

from kvgov.allocator.zeroize import (
    GIL_HELD_MAX_BYTES,
    PARALLEL_MIN_BYTES,
    CpuZeroizer,
    RunViews,
    coalesce_runs,
    make_zeroizer,
    zero_rows,
)
from kvgov.exceptions import ZeroizationError


def _words(blocks: int = 8, width: int = 4) -> torch.Tensor:
    return torch.arange(1, blocks * width + 1, dtype=torch.int64).view(blocks, width)


@pytest.mark.parametrize(
    ("ids", "runs"),
    [
        ([], []),
        ([5], [(5, 6)]),
        ([0, 1, 2, 3], [(0, 4)]),
        ([1, 2, 3, 7, 9, 10], [(1, 4), (7, 8), (9, 11)]),
        ([0, 2, 4], [(0, 1), (2, 3), (4, 5)]),
        ([3, 4, 6, 7, 8], [(3, 5), (6, 9)]),
    ],
)
def test_coalesce_runs(ids: list[int], runs: list[tuple[int, int]]) -> None:
    """Ascending ids merge into half-open runs of adjacent ids."""
    assert coalesce_runs(ids) == runs


def test_cpu_zeroizer_clears_exactly_the_runs() -> None:
    """Only the blocks in the runs are zeroed; their neighbours keep their bytes."""
    words = _words()
    before = words.clone()
    seconds = CpuZeroizer(words, verify=True).zeroize([(1, 3), (5, 6)])
    assert seconds >= 0.0
    for b in range(8):
        if b in (1, 2, 5):
            assert not words[b].any()
        else:
            assert torch.equal(words[b], before[b])


def test_cpu_zeroizer_issues_one_clear_per_run() -> None:
    """Six blocks in three runs are cleared with three zero_() calls."""
    calls: list[tuple[int, ...]] = []

    class Counting(CpuZeroizer):
        def _clear(self, start: int, stop: int) -> None:
            calls.append(tuple(self._words[start:stop].shape))
            super()._clear(start, stop)

    Counting(_words(16), verify=False).zeroize(coalesce_runs([1, 2, 3, 7, 9, 10]))
    assert calls == [(3, 4), (1, 4), (2, 4)]


@pytest.mark.parametrize("libc", [True, False], ids=["libc", "no-libc"])
@pytest.mark.parametrize("run_bytes", [GIL_HELD_MAX_BYTES, PARALLEL_MIN_BYTES], ids=["mid", "big"])
def test_cpu_zeroizer_clears_large_runs(libc: bool, run_bytes: int) -> None:
    """Runs above GIL_HELD_MAX_BYTES (memset without the GIL, or zero_() without libc)
    and from PARALLEL_MIN_BYTES (zero_()) are cleared exactly with a small one (a copy
    from the zero buffer) beside them; the blocks between keep their bytes."""
    width = 1024  # 8 KiB blocks
    big = run_bytes // (width * 8) + 3
    words = _words(big + 6, width)
    before = words.clone()
    zeroizer = CpuZeroizer(words, verify=False)
    if not libc:
        zeroizer._memset_nogil = None
    zeroizer.zeroize([(1, 2), (3, 3 + big)])
    for b in range(big + 6):
        if b == 1 or 3 <= b < 3 + big:
            assert not words[b].any(), b
        else:
            assert torch.equal(words[b], before[b]), b


class _Faulty(CpuZeroizer):
    """A zeroizer whose memset silently does nothing to block 2 (a broken device)."""

    def _clear(self, start: int, stop: int) -> None:
        super()._clear(start, stop)
        view = self._words[start:stop]
        if view.data_ptr() <= self._target.data_ptr() < view.data_ptr() + view.nbytes:
            self._target.fill_(7)

    def __init__(self, words: torch.Tensor, verify: bool) -> None:
        super().__init__(words, verify)
        self._target = words[2]

    __slots__ = ("_target",)


def test_verify_raises_naming_the_blocks_left_non_zero() -> None:
    """With verify on, a block that reads back non-zero raises ZeroizationError naming it."""
    words = _words()
    with pytest.raises(ZeroizationError) as info:
        _Faulty(words, verify=True).zeroize([(0, 4)])
    assert info.value.block_ids == (2,)


def test_without_verify_a_failed_clear_goes_unnoticed() -> None:
    """Verification is what catches a failed clear: without it no error is raised."""
    _Faulty(_words(), verify=False).zeroize([(0, 4)])


def test_run_views_memoize_and_stay_bounded() -> None:
    """The same run returns the same view; past the limit the memo is emptied."""
    words = _words()
    views = RunViews(words, limit=2)
    first = views.get((0, 2))
    assert views.get((0, 2)) is first
    assert torch.equal(first, words[0:2])
    views.get((2, 3))
    views.get((3, 4))  # over the limit: memo emptied, then refilled
    assert views.get((0, 2)) is not first


def test_make_zeroizer_picks_cpu_for_cpu_tensors() -> None:
    """A CPU tensor gets the CPU zeroizer."""
    assert isinstance(make_zeroizer(_words(), verify=False), CpuZeroizer)


@pytest.mark.gpu
def test_cuda_zeroizer_clears_runs_on_the_device() -> None:
    """On CUDA the runs are zero in device memory when zeroize returns, and verified."""
    from kvgov.allocator.zeroize import CudaZeroizer

    words = _words(64, 1024).cuda()
    before = words.clone()
    zeroizer = make_zeroizer(words, verify=True)
    assert isinstance(zeroizer, CudaZeroizer)
    seconds = zeroizer.zeroize([(3, 9), (20, 21)])
    assert seconds >= 0.0
    cleared = set(range(3, 9)) | {20}
    for b in range(64):
        if b in cleared:
            assert not words[b].any().item()
        else:
            assert torch.equal(words[b], before[b])


# ---------------------------------------------------------------- zero_rows (engine tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_zero_rows_zeroes_exactly_the_rows(dtype: torch.dtype) -> None:
    t = (torch.arange(1, 8 * 4 * 3 + 1) % 100 + 1).reshape(8, 4, 3).to(dtype)
    expected = t.clone()
    expected.index_fill_(0, torch.tensor([1, 5, 6]), 0)
    zero_rows(t, [5, 1, 6, 5])
    assert torch.equal(t, expected)
    assert t[0].ne(0).all() and t[7].ne(0).all()


def test_zero_rows_on_strided_views_leaves_the_bytes_around_them() -> None:
    """A Mamba state is a view of each block's page ([blocks, *shape], the block's stride
    the page's): only the view's elements of the given blocks are cleared."""
    page = torch.arange(1.0, 8 * 100 + 1).reshape(8, 100)
    conv = page[:, 10:40].view(8, 5, 6)
    ssm = page[:, 40:100].view(8, 6, 10)
    zero_rows(conv, [2, 3])
    zero_rows(ssm, [3])
    assert page[2, 10:40].eq(0).all() and page[3, 10:100].eq(0).all()
    assert page[2, :10].ne(0).all() and page[2, 40:].ne(0).all() and page[3, :10].ne(0).all()
    assert page[[0, 1, 4, 5, 6, 7]].ne(0).all()


def test_zero_rows_falls_back_where_numpy_cannot_view_the_bytes() -> None:
    base = torch.arange(1.0, 8 * 6 + 1).reshape(8, 6)
    strided = base[:, ::2]  # last dimension strided
    zero_rows(strided, [4])
    assert base[4, ::2].eq(0).all() and base[4, 1::2].ne(0).all()
    assert base[[0, 1, 2, 3, 5, 6, 7]].ne(0).all()


@pytest.mark.parametrize("rows", [[8], [-1], [0, 9]])
def test_zero_rows_out_of_range_changes_nothing(rows: list[int]) -> None:
    t = torch.arange(1.0, 8 * 3 + 1).reshape(8, 3)
    before = t.clone()
    with pytest.raises(IndexError, match="outside the first dimension of 8"):
        zero_rows(t, rows)
    assert torch.equal(t, before)


def test_zero_rows_of_nothing_is_nothing() -> None:
    t = torch.ones(4, 2)
    zero_rows(t, [])
    assert t.eq(1).all()
