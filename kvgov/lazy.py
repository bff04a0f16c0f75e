"""Exports resolved on first use (PEP 562), for the package ``__init__`` modules.

``kvgov`` and ``kvgov.govern`` re-export names whose modules import torch; resolving
them on first use keeps ``kvgov audit ...`` and ``kvgov policy ...`` (and any compliance
script that imports only :mod:`kvgov.audit`) from paying torch's import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of a package with lazy exports.

    Args:
        package: the package's name, for the error message.
        exports: ``{name: module}``: where each exported name is defined.
        namespace: the package's ``globals()``; a resolved name is stored there, so the
            next access does not come back here.

    Returns:
        ``(__getattr__, __dir__)``.
    """

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return getattr_, dir_
