"""The frames between an engine and its audit writer process: length-prefixed pickles.

The two ends are a parent and the child it started, over the child's stdin and
stdout (pipes only they hold), so a frame is a trusted Python value: a tag and its
arguments, records as tuples (never dicts per event), pickled in one C call per batch.
A frame is a 4-byte big-endian length and that many bytes of pickle.
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import IO, Any, Final

__all__ = ["WireClosed", "read_frame", "write_frame"]

_HEADER: Final = struct.Struct(">I")


class WireClosed(EOFError):
    """The other end closed its pipe (it exited, or was killed)."""


def write_frame(fd: int, value: Any) -> None:
    """Pickle ``value`` and write it as one frame to the file descriptor ``fd``.

    Raises:
        WireClosed: the reader is gone (a broken pipe).
    """
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise WireClosed(str(exc)) from exc
    except OSError as exc:  # EBADF: our end was closed under us (the link was dropped)
        raise WireClosed(str(exc)) from exc


def read_frame(stream: IO[bytes]) -> Any:
    """Read one frame from a buffered binary stream.

    Raises:
        WireClosed: the writer closed its end (at a frame boundary or within one).
    """
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise WireClosed("end of stream")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise WireClosed("end of stream within a frame")
    return pickle.loads(data)
