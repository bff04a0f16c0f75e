"""The namespace of a governed request in SGLang's radix tree.

SGLang partitions its tree by a request's ``extra_key`` and ``cache_salt``, two
fields a client writes, and joins a LoRA adapter's id onto ``extra_key`` with no
separator (a base request whose ``extra_key`` is ``"x" + lora_id`` reads the
adapter's tree). The governed cache replaces both, for every request it admits,
with one string derived here from what kvgov decided::

    tree_namespace = "kvgov1:" || hex(SHA-256(
        b"kvgov.sglang.namespace.v1" 0x00
        || namespace root   (32 bytes: the tenant's or a share group's, keys.namespace_root)
        || scope digest              (32 bytes: every scope field but the tenant, adapter included)
        || field(extra_key) || field(cache_salt)
        [|| field(str(generation)), after an erasure retired the root's namespaces]))

``field`` is the length-prefixed, typed field of :mod:`kvgov.govern.keys`, so no
choice of the client's strings makes two requests of different scopes, adapters
or namespaces meet: the client's ``extra_key`` and ``cache_salt`` can only narrow
a namespace kvgov chose, never choose one. Needs no SGLang.
"""

from __future__ import annotations

import hashlib

from kvgov.exceptions import InvalidArgument

from ..keys import encode_field

__all__ = ["NAMESPACE_PREFIX", "is_tree_namespace", "tree_namespace"]

#: Every governed namespace string starts with it.
NAMESPACE_PREFIX = "kvgov1:"
_TAG = b"kvgov.sglang.namespace.v1\x00"


def _client_field(name: str, value: object) -> bytes:
    if value is None or value == "":
        return encode_field(None)
    if not isinstance(value, str):
        raise InvalidArgument(name, f"<{type(value).__name__}>", "must be a string or None")
    try:
        return encode_field(value)
    except UnicodeEncodeError:
        raise InvalidArgument(name, "<str>", "a lone surrogate has no UTF-8 form") from None


def tree_namespace(
    root: bytes, digest: bytes, extra_key: object, cache_salt: object, *, generation: int = 0
) -> str:
    """The tree namespace of a request (layout in the module docstring).

    Args:
        root: the namespace root kvgov's plan chose (32 bytes).
        digest: the scope digest (32 bytes, :func:`kvgov.govern.keys.scope_digest`).
        extra_key: SGLang's ``extra_key`` as the client sent it (LoRA id joined on), or None.
        cache_salt: SGLang's ``cache_salt`` as the client sent it, or None.
        generation: how many erasures retired this namespace root's namespaces (0: none;
            appended as one more field when not 0, so generation 0 is the layout above).

    Returns:
        ``"kvgov1:"`` and 64 lowercase hex digits.

    Raises:
        InvalidArgument: ``root`` or ``digest`` is not 32 bytes, a client field is
            not a string (or holds a lone surrogate), or ``generation`` is not an int >= 0.
    """
    for name, value in (("root", root), ("digest", digest)):
        if not isinstance(value, bytes | bytearray) or len(value) != 32:
            raise InvalidArgument(name, f"<{type(value).__name__}>", "must be 32 bytes")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise InvalidArgument("generation", generation, "must be an int >= 0")
    h = hashlib.sha256(_TAG)
    h.update(bytes(root))
    h.update(bytes(digest))
    h.update(_client_field("extra_key", extra_key))
    h.update(_client_field("cache_salt", cache_salt))
    if generation:
        h.update(encode_field(str(generation)))
    return NAMESPACE_PREFIX + h.hexdigest()


def is_tree_namespace(value: object) -> bool:
    """Whether ``value`` has the form of a governed namespace (not whether kvgov issued it)."""
    return (
        isinstance(value, str)
        and len(value) == len(NAMESPACE_PREFIX) + 64
        and value.startswith(NAMESPACE_PREFIX)
    )
