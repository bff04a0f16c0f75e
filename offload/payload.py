"""What a caller hands in (bytes or a torch tensor) as the buffers AES-GCM reads and writes.

torch is imported only when a tensor is actually given, so a caller that offloads
bytes never pays for it (and then torch is already loaded anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvgov.exceptions import InvalidOffloadArgument

__all__ = ["Sink", "readable", "writable"]


def readable(payload: object) -> memoryview:
    """A read-only byte view of a payload: any bytes-like object, or a tensor.

    A CPU tensor is viewed in place (made contiguous first if it is not); a GPU tensor
    is copied to host memory.

    Args:
        payload: bytes, bytearray, memoryview, a NumPy array, or a ``torch.Tensor``.

    Returns:
        A one-dimensional byte view.

    Raises:
        InvalidOffloadArgument: neither bytes-like nor a tensor.
    """
    try:
        return memoryview(payload).cast("B")  # type: ignore[arg-type]
    except TypeError:
        pass
    tensor = _as_tensor(payload, "payload")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(_torch().uint8)
    return memoryview(flat.numpy()).cast("B")


@dataclass(frozen=True, slots=True)
class Sink:
    """A writable byte view to decrypt into, and what to do after (copy to the GPU)."""

    #: Exactly the bytes to fill.
    view: memoryview
    #: Called after a successful decryption (copies a staging buffer to the device,
    #: then zeroes the staging buffer).
    finish: Callable[[], None]


def writable(into: object) -> Sink:
    """A writable byte view of a caller's output buffer: a writable bytes-like object or a tensor.

    A contiguous CPU tensor is written in place; a GPU tensor gets a host staging
    buffer (pinned where CUDA is) that :attr:`Sink.finish` copies to the device and
    then overwrites with zeros (a refused decryption zeroes it already), so no
    plaintext stays behind in memory the allocator hands out again.

    Args:
        into: a bytearray, writable memoryview or NumPy array, or a contiguous tensor.

    Raises:
        InvalidOffloadArgument: read-only, not contiguous, or neither kind.
    """
    try:
        view = memoryview(into).cast("B")  # type: ignore[arg-type]
    except TypeError:
        view = None
    if view is not None:
        if view.readonly:
            raise InvalidOffloadArgument("into", type(into).__name__, "must be writable")
        return Sink(view, _nothing)
    tensor = _as_tensor(into, "into")
    if not tensor.is_contiguous():
        raise InvalidOffloadArgument("into", tuple(tensor.shape), "must be a contiguous tensor")
    torch = _torch()
    flat = tensor.reshape(-1).view(torch.uint8)
    if flat.device.type == "cpu":
        return Sink(memoryview(flat.numpy()).cast("B"), _nothing)
    # pinned where CUDA is (the DMA-able memory a device copy reads); torch's caching
    # host allocator hands the same pages back, so this is no cudaHostAlloc per block
    staging = torch.empty(flat.numel(), dtype=torch.uint8, pin_memory=torch.cuda.is_available())

    def finish() -> None:
        try:
            flat.copy_(staging)  # synchronous: the copy has read staging when it returns
        finally:
            # the plaintext must not outlive the copy in a buffer the allocator reuses
            staging.zero_()

    return Sink(memoryview(staging.numpy()).cast("B"), finish)


def _nothing() -> None:
    return None


def _torch() -> Any:
    import torch

    return torch


def _as_tensor(value: object, name: str) -> Any:
    torch = _torch()
    if not isinstance(value, torch.Tensor):
        raise InvalidOffloadArgument(
            name,
            type(value).__name__,
            "must be bytes-like (bytes, memoryview...) or a torch.Tensor",
        )
    return value
