"""The compiled per-block loops (govern/_blocks.c) against their specification, the pure loops.

``kvgov.govern._blocks`` runs where it is installed (``kvgov.govern.native.blocks``):
the owner table's ``group`` and ``assign_unowned``, the SGLang binding's page ids of a
slot run and its zeroing of released pages on the CPU. Each must return what the pure
loop returns and leave the table or the buffers as it leaves them, on any input the
binding can give; bad input must raise with nothing changed. The pure loops are
checked by the same tests (``Owners`` with the compiled module switched off).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgov.govern import native, ownership
from kvgov.govern.ownership import Owners
from kvgov.govern.sglang.governance import PageZeroer, page_ids
from tests.support.native import native_blocks_skip, native_blocks_unbuildable

from .conftest import make_scope

_WHY = native_blocks_skip()
needs_native = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

#: Owners a table holds: distinct scopes, one of them twice as equal objects, and None.
_A, _B, _C = make_scope(tenant="a"), make_scope(tenant="b"), make_scope(tenant="c")
_A_AGAIN = make_scope(tenant="a")  # equal to _A, another object
_OWNERS = [None, _A, _B, _C, _A_AGAIN]
_SIZE = 24


def test_the_compiled_loops_are_installed_where_they_can_be_built() -> None:
    """setup.py builds them wherever a C compiler and Python's headers are present."""
    if not native.NATIVE_BLOCKS:
        assert native_blocks_unbuildable() is not None, (
            "this machine can build kvgov.govern._blocks but the install did not: "
            "reinstall kvgov (make install) and read what the build printed"
        )


@pytest.fixture(params=["native", "python"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each implementation in turn, chosen as kvgov chooses it (``native.blocks``)."""
    if request.param == "native":
        if _WHY is not None:
            pytest.skip(_WHY)
    else:
        monkeypatch.setattr(native, "blocks", None)
    yield request.param


_tables = st.lists(st.sampled_from(range(len(_OWNERS))), min_size=_SIZE, max_size=_SIZE)
_ids = st.lists(st.integers(0, _SIZE - 1), max_size=40)


def _table(picks: list[int]) -> list[object]:
    return [_OWNERS[i] for i in picks]


@needs_native
@settings(max_examples=300, deadline=None)
@given(picks=_tables, ids=_ids, clear=st.booleans(), as_tuple=st.booleans())
def test_group_is_the_pure_loop(
    picks: list[int], ids: list[int], clear: bool, as_tuple: bool
) -> None:
    assert native.blocks is not None
    given_ids = tuple(ids) if as_tuple else ids
    pure_table, compiled_table = _table(picks), _table(picks)
    want = ownership.group(pure_table, given_ids, clear=clear)  # type: ignore[arg-type]
    got = native.blocks.group(compiled_table, given_ids, clear)
    assert [(o, list(i)) for o, i in got] == [(o, list(i)) for o, i in want]
    assert [o for o, _ in got] == [o for o, _ in want] and all(
        a is b for (a, _), (b, _) in zip(got, want, strict=True)
    ), "the same owner objects"
    assert all(x is y for x, y in zip(compiled_table, pure_table, strict=True))
    if len(want) == 1:
        assert got[0][1] is given_ids  # one owner: the ids themselves, as the pure loop


@needs_native
@settings(max_examples=300, deadline=None)
@given(picks=_tables, ids=_ids)
def test_assign_unowned_is_the_pure_loop(picks: list[int], ids: list[int]) -> None:
    assert native.blocks is not None
    pure_table, compiled_table = _table(picks), _table(picks)
    want = ownership.assign_unowned(pure_table, ids, _C)  # type: ignore[arg-type]
    got = native.blocks.assign_unowned(compiled_table, ids, _C)
    assert got == want
    assert all(x is y for x, y in zip(compiled_table, pure_table, strict=True))


def test_owners_group_and_assign_unowned_in_either_implementation(impl: str) -> None:
    owners = Owners(8)
    assert owners.assign_unowned([1, 2, 3], _A) == [1, 2, 3]
    assert owners.assign_unowned([2, 3, 4, 5], _B) == [4, 5]  # 2 and 3 are _A's
    assert owners.table[1:6] == [_A, _A, _A, _B, _B]
    assert owners.group([1, 2, 4, 3, 5, 6]) == [(_A, [1, 2, 3]), (_B, [4, 5]), (None, [6])]
    one = [1, 2, 3]
    assert owners.group(one, clear=True) == [(_A, one)]
    assert owners.table[1:4] == [None, None, None]
    assert owners.group([]) == []


@pytest.mark.parametrize("bad", [[0, 8], [3, 99]])
def test_an_id_out_of_range_raises(impl: str, bad: list[int]) -> None:
    owners = Owners(8)
    owners.assign([0, 1, 2, 3], _A)
    before = list(owners.table)
    with pytest.raises(IndexError):
        owners.group(bad, clear=True)
    if impl == "native":  # checked before anything is cleared
        assert owners.table == before
    owners.table[:] = before
    with pytest.raises(IndexError):
        owners.assign_unowned(bad, _B)
    with pytest.raises(IndexError):
        owners.assign(bad, _B)
    if impl == "native":
        assert owners.table == before


@needs_native
def test_the_compiled_loops_refuse_a_negative_id_and_change_nothing() -> None:
    """Where the pure loops would index a negative id from the end of the table."""
    owners = Owners(8)
    owners.assign([0, 1, 2, 3], _A)
    before = list(owners.table)
    for call in (
        lambda: owners.group([1, -1], clear=True),
        lambda: owners.assign_unowned([5, -1], _B),
        lambda: owners.assign([5, -1], _B),
    ):
        with pytest.raises(IndexError):
            call()
        assert owners.table == before


@needs_native
def test_the_compiled_loops_refuse_what_is_not_ids() -> None:
    blocks = native.blocks
    assert blocks is not None
    table: list[object] = [None] * 4
    with pytest.raises(TypeError):
        blocks.group(table, [1.0], False)
    with pytest.raises(TypeError):
        blocks.assign_unowned(table, ["1"], _A)
    with pytest.raises(TypeError):
        blocks.group((None,), [0], False)  # the table is a list
    assert table == [None] * 4
    with pytest.raises(TypeError):
        blocks.page_ids(np.zeros(4, dtype=np.int32), 0, 1, 1)
    with pytest.raises(ValueError):
        blocks.page_ids(np.zeros(4, dtype=np.int64), 0, 0, 1)
    with pytest.raises(ValueError):
        blocks.page_ids(np.array([4, -4], dtype=np.int64), 0, 1, 4)


@settings(max_examples=300, deadline=None)
@given(
    slots=st.lists(st.integers(0, 2**40), max_size=64),
    unit=st.integers(1, 16),
    start=st.integers(0, 70),
    stop=st.one_of(st.none(), st.integers(0, 70)),
    strided=st.booleans(),
)
def test_page_ids_is_the_comprehension(
    slots: list[int], unit: int, start: int, stop: int | None, strided: bool
) -> None:
    tensor = torch.tensor(slots, dtype=torch.int64)
    if strided:  # a view with a stride, as a slice of SGLang's indices is
        tensor = torch.tensor([s for s in slots for _ in (0, 1)], dtype=torch.int64)[::2]
    want = [slot // unit for slot in tensor[start:stop:unit].tolist()]
    assert page_ids(tensor, unit, start=start, stop=stop) == want
    saved = native.blocks
    native.blocks = None
    try:
        assert page_ids(tensor, unit, start=start, stop=stop) == want
    finally:
        native.blocks = saved


def test_page_ids_of_another_dtype_take_the_pure_path(impl: str) -> None:
    tensor = torch.arange(32, 64, dtype=torch.int32)  # two pages' slots
    assert page_ids(tensor, 16) == [2, 3]


def _fused(pages: int, page: int) -> list[torch.Tensor]:
    """Two layers, each K and V the halves of one allocation (as SGLang keeps them)."""
    fused = [torch.rand((2, pages * page, 2, 4)) + 1 for _ in range(2)]
    return [buf[0] for buf in fused] + [buf[1] for buf in fused]


@settings(max_examples=100, deadline=None)
@given(
    chunks=st.lists(st.lists(st.integers(1, 15), max_size=8), max_size=5),
    separate=st.booleans(),
)
def test_a_compiled_flush_is_the_numpy_flush(chunks: list[list[int]], separate: bool) -> None:
    """Both zero the same pages of every buffer and return the same ids, in order."""
    page = 4
    bufs = [torch.rand((16 * page, 2, 4)) + 1 for _ in range(4)] if separate else _fused(16, page)
    twins = [b.clone() for b in bufs]
    compiled = PageZeroer(bufs, page)
    saved = native.blocks
    native.blocks = None
    try:
        pure = PageZeroer(twins, page)
        assert pure.native_fills is None
        for ids in chunks:
            pure.release(torch.tensor(ids, dtype=torch.int64))
        want = pure.flush()
    finally:
        native.blocks = saved
    for ids in chunks:
        compiled.release(torch.tensor(ids, dtype=torch.int64))
    assert compiled.flush() == want
    assert all(torch.equal(a, b) for a, b in zip(bufs, twins, strict=True))


@needs_native
def test_a_compiled_flush_checks_every_id_before_it_zeroes_any() -> None:
    bufs = _fused(16, 4)
    before = [b.clone() for b in bufs]
    zeroer = PageZeroer(bufs, 4)
    assert zeroer.native_fills is not None
    zeroer.release(torch.tensor([2, 3]))
    zeroer.release(torch.tensor([16]))  # one page past the pool
    with pytest.raises(IndexError):
        zeroer.flush()
    assert all(torch.equal(a, b) for a, b in zip(bufs, before, strict=True))
    assert zeroer.pending_ids() == [2, 3, 16]  # still owed a zeroing: the next flush fails too
    blocks = native.blocks
    assert blocks is not None
    with pytest.raises(IndexError):
        blocks.zero(zeroer.native_fills, [np.array([-1], dtype=np.int64)])
    with pytest.raises(ValueError):  # a view whose blocks are not contiguous
        blocks.zero([(np.zeros((4, 3, 2), dtype=np.uint8).transpose(0, 2, 1), 0)], [])
    with pytest.raises(ValueError, match="read-only"):  # numpy refuses a writable buffer
        ro = np.zeros((4, 8), dtype=np.uint8)
        ro.setflags(write=False)
        blocks.zero([(ro, 0)], [])
