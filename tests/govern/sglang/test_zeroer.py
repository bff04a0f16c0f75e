"""The page zeroer's fills (torch only: runs in make test, no SGLang).

SGLang keeps a layer's K and V, when their shapes agree, as the two halves of one
``[2, rows, ...]`` allocation; the zeroer then clears both with one indexed fill per
layer. Whatever the layout, a flush zeroes exactly the released pages of every K and
V buffer and nothing else.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvgov.govern import native  # noqa: E402
from kvgov.govern.sglang.governance import PageZeroer  # noqa: E402

PAGE = 4
ROWS = 64  # token slots: 16 pages


@pytest.fixture(autouse=True, params=["native", "python"])
def _impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with the compiled zeroing loop (where built) and with numpy's fills."""
    if request.param == "native" and native.blocks is None:
        pytest.skip("kvgov.govern._blocks is not built here (tests/govern/test_blocks_native.py)")
    if request.param == "python":
        monkeypatch.setattr(native, "blocks", None)
    return str(request.param)


def _fused_layers(layers: int) -> list[torch.Tensor]:
    """Every K, then every V, each layer's pair the halves of one allocation (as SGLang's)."""
    fused = [torch.zeros((2, ROWS + PAGE, 2, 3)) for _ in range(layers)]
    return [buf[0, :ROWS] for buf in fused] + [buf[1, :ROWS] for buf in fused]


def _separate(layers: int) -> list[torch.Tensor]:
    return [torch.zeros((ROWS, 2, 3)) for _ in range(2 * layers)]


def _overlapping() -> list[torch.Tensor]:
    """K and V views whose element ranges overlap (no pool is laid out so; the fused view
    is refused, so a fill never reaches past the two views)."""
    base = torch.zeros(ROWS * 6 + 6)
    k = base[: ROWS * 6].view(ROWS, 2, 3)
    v = base[6:].view(ROWS, 2, 3)
    return [k, v]


def _v_before_k() -> list[torch.Tensor]:
    fused = torch.zeros((2, ROWS, 2, 3))
    return [fused[1], fused[0]]


def _strided_last() -> list[torch.Tensor]:
    """K and V whose last dimension is strided: numpy cannot view their bytes."""
    return [torch.zeros((ROWS, 3, 2)).transpose(1, 2) for _ in range(2)]


def _bf16_fused() -> list[torch.Tensor]:
    fused = torch.zeros((2, ROWS, 1, 8), dtype=torch.bfloat16)
    return [fused[0], fused[1]]


@pytest.mark.parametrize(
    ("buffers", "fills"),
    [
        pytest.param(_fused_layers(3), 3, id="fused: one fill per layer"),
        pytest.param(_separate(2), 4, id="separate: one fill per buffer"),
        pytest.param(_v_before_k(), 2, id="V before K: one by one"),
        pytest.param([*_fused_layers(2), torch.zeros((ROWS, 2, 3))], 5, id="odd count: alone"),
        pytest.param(_strided_last(), 2, id="strided last dimension: index_fill_"),
        pytest.param(_bf16_fused(), 1, id="bfloat16, fused"),
    ],
)
def test_a_flush_zeroes_exactly_the_released_pages_of_every_buffer(
    buffers: list[torch.Tensor], fills: int
) -> None:
    zeroer = PageZeroer(buffers, PAGE)
    assert len(zeroer.fills) == fills
    for buf in buffers:
        buf.fill_(1.0)
    zeroer.release(torch.tensor([3, 7]))
    zeroer.release(torch.tensor([[12]]))  # any shape of ids
    assert zeroer.flush() == [3, 7, 12]
    released = {3, 7, 12}
    for buf in buffers:
        for page in range(ROWS // PAGE):
            rows = buf[page * PAGE : (page + 1) * PAGE]
            if page in released:
                assert not rows.any(), f"page {page} not zeroed"
            else:
                assert bool((rows == 1.0).all()), f"page {page} touched"
    assert zeroer.reads_zero([3, 7, 12]) and not zeroer.reads_zero([4])
    assert zeroer.flush() == []  # nothing pending


def test_on_cpu_a_flush_writes_through_numpy_on_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not torch's index_fill_, which hands a fill of a few pages to its OpenMP threads."""
    buffers = _fused_layers(2)
    zeroer = PageZeroer(buffers, PAGE)
    assert zeroer.byte_fills is not None
    for buf in buffers:
        buf.fill_(1.0)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("index_fill_ called")

    monkeypatch.setattr(torch.Tensor, "index_fill_", refused)
    zeroer.release(torch.tensor([5]))
    assert zeroer.flush() == [5]
    assert zeroer.reads_zero([5]) and not zeroer.reads_zero([4])
    assert PageZeroer(_strided_last(), PAGE).byte_fills is None  # the fallback


def test_overlapping_halves_are_not_fused() -> None:
    zeroer = PageZeroer(_overlapping(), PAGE)
    assert [dim for _, dim in zeroer.fills] == [0, 0]
