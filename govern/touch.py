"""A row of an engine fence's registry: one internal name of a serving engine kvgov touches.

Each engine binding keeps every access to its engine's private names in one fence module
(``kvgov.govern.vllm.fence``, ``kvgov.govern.sglang.fence``), with a ``TOUCHED`` registry
of :class:`Touch` rows; the engine's docs page carries the same rows as a table, and a
test compares the two.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Touch"]


class Touch(NamedTuple):
    """One name of an engine's that kvgov touches (a row of the engine's docs table)."""

    #: ``Class.name`` in the engine (or ``Class`` for a re-class).
    name: str
    #: private attribute, internal attribute, private method, override, re-class,
    #: patch, or kvgov attribute (kvgov's own name kept on an engine's object).
    kind: str
    #: The engine's module that defines it.
    where: str
    #: Why kvgov needs it.
    why: str
    #: What changes by version.
    versions: str
