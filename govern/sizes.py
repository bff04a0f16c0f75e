"""Sizes in bytes as people write them: ``8GiB``, ``512MiB``, ``1.5GB``, ``1073741824``.

One parser for every size kvgov reads (offload tier capacities, ``kvgov capacity
--memory``), built on pydantic's :class:`~pydantic.ByteSize`: binary units (``KiB``,
``MiB``, ``GiB``, ``TiB``, ``PiB``, ``EiB``: powers of 1024), decimal units (``KB`` or
``K``, ``MB`` or ``M``, ... : powers of 1000), bytes (``B`` or none), any case, an
optional space before the unit, a decimal fraction (rounded down to whole bytes).
Why pydantic rather than ``humanfriendly.parse_size``: humanfriendly takes any unit that
merely starts with a known letter (``8GiBx`` is 8 GB, ``1bogus`` is 1 byte), so a typo in
a capacity would pass unnoticed; pydantic refuses every unit it does not know.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from kvgov.exceptions import InvalidArgument

__all__ = ["parse_size"]

_EXAMPLES = "a size such as 8GiB, 512MiB, 1.5GB or 1073741824"


@cache
def _byte_size() -> tuple[Any, re.Pattern[str]]:
    """pydantic's validator and its pattern, built on first use (import: ~60 ms)."""
    from pydantic import ByteSize, TypeAdapter

    return TypeAdapter(ByteSize), ByteSize.byte_string_re


def parse_size(text: str, *, name: str = "capacity") -> int:
    """Bytes from ``"8GiB"``, ``"512MiB"``, ``"1.5GB"`` or ``"1073741824"``.

    Args:
        text: the size.
        name: what it is the size of (named in the error).

    Returns:
        The size in bytes, at least 1.

    Raises:
        InvalidArgument: not a size, or not positive.
    """
    from pydantic import ValidationError

    adapter, pattern = _byte_size()
    spec = text.strip() if isinstance(text, str) else ""
    found = pattern.match(spec)
    if found is None or found.end() != len(spec):
        # ByteSize's pattern anchors only the start: "8GiB foo" would pass as 8 GiB
        raise InvalidArgument(name, text, _EXAMPLES)
    try:
        value = int(adapter.validate_python(spec))
    except ValidationError:
        raise InvalidArgument(name, text, _EXAMPLES) from None
    if value <= 0:
        raise InvalidArgument(name, text, "must be positive")
    return value
