"""kvgov's compiled per-block loops (govern/_blocks.c), or None where they were not built.

``blocks`` is the extension module ``kvgov.govern._blocks`` (built by setup.py where a
C compiler is found) or None; :data:`NATIVE_BLOCKS` says which. Its users keep the
pure loop beside each call as the specification and the fallback, chosen here
automatically: :func:`assign` (the owner and retention tables),
:class:`kvgov.govern.ownership.Owners` (``group``, ``assign_unowned``) and the SGLang
binding's page bookkeeping (:mod:`kvgov.govern.sglang`: the page ids of a hit or an
insert, the zeroing of released pages on the CPU).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["NATIVE_BLOCKS", "assign", "blocks"]

blocks: ModuleType | None
try:
    blocks = importlib.import_module("kvgov.govern._blocks")
except ImportError:  # no C compiler at install: the pure loops
    blocks = None

#: Whether the compiled per-block loops are installed (and used).
NATIVE_BLOCKS: bool = blocks is not None


def assign(table: list[Any], block_ids: Sequence[int], value: Any) -> None:
    """``table[b] = value`` for every block of ``block_ids`` (compiled where built).

    Raises:
        IndexError: an id is not an index of ``table`` (the compiled loop sets none, and
            refuses a negative id, which the pure loop indexes from the end).
    """
    if blocks is not None:
        blocks.assign(table, block_ids, value)
        return
    for b in block_ids:
        table[b] = value
