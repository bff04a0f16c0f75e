"""kvgov: governance for the KV cache of a multi-tenant LLM server.

The public API lives in :mod:`govern` (``GovernedKVCache``, ``CacheScope``);
:mod:`allocator`, :mod:`policy` and :mod:`audit` are the lower layers. This
package holds only what all of them share: the exception hierarchy
(:mod:`kvgov.exceptions`), the named defaults (:mod:`kvgov.defaults`) and the
shared field names (:mod:`kvgov.schema`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvgov")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

__all__ = ["__version__"]
