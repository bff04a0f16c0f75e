"""kvgov on SGLang's radix cache (``--radix-cache-backend kvgov``): see docs/sglang.md.

Importing this package needs no SGLang; :mod:`.cache` and :mod:`.plugin` import it.
"""

from __future__ import annotations

from .keys import NAMESPACE_PREFIX, is_tree_namespace, tree_namespace

__all__ = ["NAMESPACE_PREFIX", "is_tree_namespace", "tree_namespace"]
