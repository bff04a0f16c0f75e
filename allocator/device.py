"""Where a pool lives: :func:`resolve_device` parses a device and refuses one this
machine does not have.
"""

from __future__ import annotations

import torch

from kvgov.exceptions import InvalidSpec

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """Parse a device and refuse one this machine does not have, before torch asserts.

    Callers that set other things up first (an audit log, an output folder) check the
    device with this before they do, so that a wrong device changes nothing.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or a torch device.

    Returns:
        The torch device.

    Raises:
        InvalidSpec: not a device torch knows; CUDA asked where torch sees none
            ("CUDA is not available on this machine"), or a CUDA index beyond the
            machine's devices.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidSpec("device", device, f"not a torch device: {exc}") from exc
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise InvalidSpec(
            "device", device, "CUDA is not available on this machine; use device='cpu'"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise InvalidSpec("device", device, f"this machine has {count} CUDA device(s)")
    return dev
