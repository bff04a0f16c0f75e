"""Cache-key derivation: scoped, chained, keyed with a secret.

A cache key names one full block of KV state. It must (a) never collide
across scopes, (b) never reveal prompt content to someone who sees keys, and
(c) chain, so that a block's key commits to every token before it, as vLLM's
block hash does. Byte layouts (all integers big-endian unless said otherwise)::

    field(v)       = 0x00                              if v is None
                   = 0x01 || len(utf8(v)) as u32 || utf8(v)   otherwise

    ScopeDigest    = SHA-256( b"kvgov.scope.v1" 0x00
                              || field(classification) || field(model)
                              || field(model_revision) || field(adapter)
                              || field(adapter_revision) || field(tokenizer)
                              || field(tokenizer_revision) || field(template_version) )

    NamespaceRoot  = SHA-256( b"kvgov.namespace.v1" 0x00 || field(kind) || field(name) )
                     kind is "tenant" or "group"

    token_bytes_i  = tokens[i*B : (i+1)*B] as little-endian u32 each (B = block size)

    CacheKey_0     = HMAC-SHA256(secret, NamespaceRoot || ScopeDigest || token_bytes_0)
    CacheKey_i     = HMAC-SHA256(secret, CacheKey_{i-1} || ScopeDigest || token_bytes_i)

    CacheKey_i     = HMAC-SHA256(secret, CacheKey_{i-1} || ScopeDigest || token_bytes_i
                                         || ExtraKeys_i)       with a serving engine's extra keys

    ExtraKeys_i    = b""                                  if block i has no extra keys
                   = b"kvgov.extra.v1" 0x00 || item(E_i)   otherwise
                     E_i is what the engine adds to block i's hash besides its tokens
                     (vLLM: LoRA name and path, the cache salt on block 0, the
                     identifier and offset of each multimodal item overlapping the
                     block, a digest of the block's prompt embeddings)
    item(None)     = 0x00
    item(b)        = 0x01 || (0x01 if b else 0x00)          bool
    item(n)        = 0x02 || len(d) as u32 || d               int; d = ASCII decimal of n
    item(s)        = 0x03 || len(utf8(s)) as u32 || utf8(s)   str
    item(x)        = 0x04 || len(x) as u32 || x               bytes
    item(t)        = 0x05 || len(t) as u32 || item(t_0) || ... || item(t_{n-1})   tuple or list

    ContinuationRoot = SHA-256( b"kvgov.continue.v1" 0x00 || NamespaceRoot || CacheKey_last )
                     the parent of the first block after a public prefix (see
                     ``GovernedKVCache.admit(public_prefix_tokens=...)``): the prefix is
                     keyed in its own (public, maybe shared) chain, the rest chains from
                     here, so it commits to the prefix *and* to its own namespace.

Every field is length-prefixed, so no choice of strings can make two scopes
encode alike (``("a|b", "c")`` and ``("a", "b|c")`` differ), and ``None``
differs from every string. The tenant is not in the scope digest: it is the
namespace, so a share group's namespace can hold blocks of several tenants
while every other field still has to match. Known-answer vectors live in
``tests/vectors/cache_keys.json``.

Extra keys are typed and length-prefixed too, so the encoding is injective:
two images behind the same placeholder tokens (different identifiers), the
same image at two offsets, a LoRA and its re-pointed path, or two salts never
encode alike. For one block size the token part is exactly ``4 * B`` bytes,
so a block without extra keys (``ExtraKeys = b""``) and one with them never
share an HMAC input either; a block without extra keys is keyed exactly as
kvgov's own cache keys it. Vectors: ``tests/vectors/cache_keys_extra.json``.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import secrets
import sys
from array import array
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Literal, NewType, cast, get_args

from kvgov.defaults import KEY_SECRET_ENV, KEYCHAIN_ENV, MIN_KEY_SECRET_BYTES
from kvgov.exceptions import InvalidArgument, InvalidTokens, KeySecretError

from .scope import SCOPE_FIELDS, CacheScope

_native_chain: Any
try:  # the compiled key chain (govern/_keychain.c), built by setup.py where it can be
    _native_chain = importlib.import_module("kvgov.govern._keychain").Chain
except ImportError:  # no C compiler or no OpenSSL headers at install: the pure path
    _native_chain = None

#: Whether the compiled key chain is installed; :class:`KeyDeriver` uses it where it is.
NATIVE_KEYCHAIN: bool = _native_chain is not None
#: Which key-chain implementation a :class:`KeyDeriver` uses (``implementation=``).
KeyChainImpl = Literal["auto", "native", "python"]
#: The values of :data:`KeyChainImpl` (``KVGOV_KEYCHAIN``'s accepted values).
KEYCHAIN_CHOICES: tuple[str, ...] = get_args(KeyChainImpl)

__all__ = [
    "KEYCHAIN_CHOICES",
    "NATIVE_KEYCHAIN",
    "CacheKey",
    "KeyChainImpl",
    "KeyDeriver",
    "NamespaceRoot",
    "ScopeDigest",
    "continuation_root",
    "encode_extra_keys",
    "encode_field",
    "keychain_setting",
    "load_key_secret",
    "namespace_root",
    "pack_tokens",
    "scope_digest",
    "secret_key_id",
]

#: HMAC-SHA256 key of one full block (32 bytes).
CacheKey = NewType("CacheKey", bytes)
#: SHA-256 of a scope's length-prefixed fields, tenant excluded (32 bytes).
ScopeDigest = NewType("ScopeDigest", bytes)
#: SHA-256 naming a key namespace (a tenant or a share group); the first parent (32 bytes).
NamespaceRoot = NewType("NamespaceRoot", bytes)

_SCOPE_TAG = b"kvgov.scope.v1\x00"
_EXTRA_TAG = b"kvgov.extra.v1\x00"
_NAMESPACE_TAG = b"kvgov.namespace.v1\x00"
_CONTINUE_TAG = b"kvgov.continue.v1\x00"
#: Nesting of extra keys refused beyond this (vLLM nests two levels).
_MAX_EXTRA_DEPTH = 8
#: Every scope field but the tenant (which is the namespace), in scope order.
_DIGEST_FIELDS = tuple(name for name in SCOPE_FIELDS if name != "tenant")


def encode_field(value: str | None) -> bytes:
    """One length-prefixed scope field (``field(v)`` in the module docstring)."""
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return b"\x01" + len(raw).to_bytes(4, "big") + raw


def encode_extra_keys(extra: object) -> bytes:
    """Encode a block's extra keys (``ExtraKeys`` in the module docstring).

    Args:
        extra: None or an empty tuple for a block without extra keys, else a
            tuple (or list) of None, bool, int, str, bytes and nested tuples or
            lists, as a serving engine builds them.

    Returns:
        ``b""`` for no extra keys, else the tagged encoding.

    Raises:
        InvalidArgument: an element of another type (a float, an object), a string
            holding a lone surrogate, or an integer beyond Python's int-to-text limit:
            it has no canonical encoding, so it could not be keyed safely.
    """
    if extra is None or (isinstance(extra, tuple | list) and not extra):
        return b""
    out = bytearray(_EXTRA_TAG)
    _encode_item(extra, out, 0)
    return bytes(out)


def _encode_item(value: object, out: bytearray, depth: int) -> None:
    if depth > _MAX_EXTRA_DEPTH:
        raise InvalidArgument("extra_keys", "...", f"nested deeper than {_MAX_EXTRA_DEPTH}")
    if value is None:
        out += b"\x00"
    elif isinstance(value, bool):
        out += b"\x01\x01" if value else b"\x01\x00"
    elif isinstance(value, int):
        try:
            digits = str(int(value)).encode("ascii")
        except ValueError:  # beyond Python's int-to-text digit limit
            raise InvalidArgument("extra_keys", "<int>", "an integer too large to key") from None
        out += b"\x02" + len(digits).to_bytes(4, "big") + digits
    elif isinstance(value, str):
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (e.g. a client's cache_salt)
            raise InvalidArgument(
                "extra_keys", "<str>", "a string holding a lone surrogate has no UTF-8 form"
            ) from None
        out += b"\x03" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        out += b"\x04" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, tuple | list):
        out += b"\x05" + len(value).to_bytes(4, "big")
        for element in value:
            _encode_item(element, out, depth + 1)
    else:
        raise InvalidArgument(
            "extra_keys",
            type(value).__name__,
            "extra keys may hold None, bool, int, str, bytes and tuples of them only",
        )


def scope_digest(scope: CacheScope) -> ScopeDigest:
    """Digest every scope field but the tenant, length-prefixed (layout in the module docstring).

    Args:
        scope: the scope.

    Returns:
        32 bytes.
    """
    parts = [_SCOPE_TAG]
    parts.extend(encode_field(getattr(scope, name)) for name in _DIGEST_FIELDS)
    return ScopeDigest(hashlib.sha256(b"".join(parts)).digest())


def namespace_root(kind: str, name: str) -> NamespaceRoot:
    """Name a key namespace: ``("tenant", tenant)`` or ``("group", share_group)``.

    Args:
        kind: ``"tenant"`` or ``"group"``.
        name: the tenant or share-group name.

    Returns:
        32 bytes, the parent of a namespace's first block key.
    """
    return NamespaceRoot(
        hashlib.sha256(_NAMESPACE_TAG + encode_field(kind) + encode_field(name)).digest()
    )


def continuation_root(root: bytes, prefix_key: bytes) -> NamespaceRoot:
    """Parent of the first block after a public prefix (layout in the module docstring).

    Args:
        root: the namespace root of the sequence's own (non-prefix) blocks.
        prefix_key: the key of the prefix's last block.

    Returns:
        32 bytes.
    """
    return NamespaceRoot(hashlib.sha256(_CONTINUE_TAG + root + prefix_key).digest())


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Validate token ids and pack them as little-endian u32.

    Args:
        token_ids: non-negative ints below 2**32 (numpy or torch integer
            scalars are accepted through ``__index__``).

    Returns:
        ``4 * len(token_ids)`` bytes.

    Raises:
        InvalidTokens: not an ordered sequence (a str, bytes, set or dict is refused),
            or an element is not an int in range.
    """
    if (
        isinstance(token_ids, str | bytes | bytearray | AbstractSet | Mapping)
        or not hasattr(token_ids, "__len__")
        or not hasattr(token_ids, "__iter__")
    ):
        # a set or a dict has a length but no order: its "tokens" would be keyed in
        # whatever order it iterates
        raise InvalidTokens(
            f"expected a sequence of ints (a list, tuple, range or array), "
            f"got {type(token_ids).__name__}"
        )
    try:
        packed = array("I", token_ids)
    except OverflowError as exc:
        raise InvalidTokens(f"every token id must be in 0..2**32-1 ({exc})") from None
    except TypeError as exc:
        raise InvalidTokens(f"every token id must be an int ({exc})") from None
    if packed.itemsize != 4:  # pragma: no cover - every mainstream platform has 4-byte unsigned int
        raise InvalidTokens("this platform's C unsigned int is not 4 bytes")
    if sys.byteorder == "big":  # pragma: no cover - little-endian hosts only in CI
        packed.byteswap()
    return packed.tobytes()


class KeyDeriver:
    """Derives chained block keys with one secret, held here and nowhere global.

    The chains (:meth:`derive_chain`, :meth:`derive_chain_extras`) run in the compiled
    key chain (``kvgov.govern._keychain``, over OpenSSL's SHA-256) where it is
    installed, else in Python; both return the same keys byte for byte, and the
    Python code here is their specification.

    Args:
        secret: the HMAC key, at least 32 bytes.
        implementation: ``"auto"`` (the compiled chain where installed, else Python),
            ``"native"`` (the compiled chain or an error) or ``"python"``.

    Raises:
        KeySecretError: the secret is not bytes or is shorter than 32 bytes.
        InvalidArgument: ``implementation`` is not one of the three, or is
            ``"native"`` where the compiled chain is not installed.
    """

    __slots__ = ("_inner", "_native", "_outer", "_secret")

    def __init__(self, secret: bytes, *, implementation: KeyChainImpl = "auto") -> None:
        if implementation not in KEYCHAIN_CHOICES:
            raise InvalidArgument("implementation", repr(implementation), "auto, native or python")
        if implementation == "native" and _native_chain is None:
            raise InvalidArgument(
                "implementation",
                "native",
                "the compiled key chain is not installed (reinstall kvgov where a C "
                "compiler and OpenSSL's headers are present; docs/operations.md, Secrets)",
            )
        if not isinstance(secret, bytes | bytearray):
            raise KeySecretError(f"must be bytes, got {type(secret).__name__}")
        if len(secret) < MIN_KEY_SECRET_BYTES:
            raise KeySecretError(
                f"must be at least {MIN_KEY_SECRET_BYTES} bytes, got {len(secret)}; "
                'generate one with: python -c "import secrets; print(secrets.token_hex(32))"'
            )
        self._secret = bytes(secret)
        # HMAC (RFC 2104) spelled out: SHA-256(opad || SHA-256(ipad || message)), with
        # the two pads hashed once here and their SHA-256 states copied per key. That
        # is 1.2x faster per key than hashing the concatenated pads again, 1.6x faster
        # than copying an hmac.HMAC object and 1.8x faster than hmac.digest (OpenSSL
        # sets its key up on every call); measured on 16-token blocks, pinned to one
        # CPU. The output is HMAC-SHA256 byte for byte, pinned against hmac.digest by
        # the known-answer tests.
        block = self._secret
        if len(block) > 64:
            block = hashlib.sha256(block).digest()
        block = block.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
        use_native = _native_chain is not None and implementation != "python"
        self._native: Any = _native_chain(self._secret) if use_native else None

    @property
    def implementation(self) -> Literal["native", "python"]:
        """Which code derives this deriver's chains: ``"native"`` or ``"python"``."""
        return "python" if self._native is None else "native"

    def __repr__(self) -> str:
        return "KeyDeriver(secret=<hidden>)"

    @property
    def key_id(self) -> str:
        """The secret's public name (:func:`secret_key_id`); the secret stays hidden."""
        return secret_key_id(self._secret)

    def derive_key(
        self, parent: bytes, token_bytes: bytes, digest: ScopeDigest, extra: bytes = b""
    ) -> CacheKey:
        """One block key: ``HMAC-SHA256(secret, parent || digest || token_bytes || extra)``.

        Args:
            parent: the previous block's key, or the namespace root for block 0.
            token_bytes: the block's packed tokens (see :func:`pack_tokens`).
            digest: the scope digest.
            extra: the block's encoded extra keys (:func:`encode_extra_keys`);
                ``b""`` for none.

        Returns:
            The block's key.
        """
        inner = self._inner.copy()
        inner.update(parent)
        inner.update(digest)
        inner.update(token_bytes)
        if extra:
            inner.update(extra)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return CacheKey(outer.digest())

    def derive_chain(
        self,
        parent: bytes,
        packed: bytes,
        digest: ScopeDigest,
        block_size: int,
        count: int,
        *,
        first: int = 0,
    ) -> list[CacheKey]:
        """Keys of ``count`` consecutive full blocks starting at block ``first``.

        Args:
            parent: key of block ``first - 1`` (the namespace root when ``first`` is 0).
            packed: the sequence's packed tokens (at least ``first + count`` full blocks).
            digest: the scope digest.
            block_size: tokens per block.
            count: how many keys to derive.
            first: index of the first block to key.

        Returns:
            ``count`` keys in block order.

        Raises:
            InvalidArgument: ``packed`` holds fewer than ``first + count`` full blocks,
                or ``block_size``, ``count`` or ``first`` is out of range.
        """
        _check_range(packed, block_size, count, first)
        if self._native is not None:
            native: list[CacheKey] = self._native.derive_chain(
                parent, packed, digest, block_size, count, first
            )
            return native
        inner_state, outer_state = self._inner.copy, self._outer.copy
        step = 4 * block_size
        keys: list[bytes] = []
        append = keys.append
        start = first * step
        for offset in range(start, start + count * step, step):
            inner = inner_state()
            inner.update(parent)
            inner.update(digest)
            inner.update(packed[offset : offset + step])
            outer = outer_state()
            outer.update(inner.digest())
            parent = outer.digest()
            append(parent)
        return keys  # type: ignore[return-value]  # CacheKey is bytes; no per-key wrapper call

    def derive_chain_extras(
        self,
        parent: bytes,
        packed: bytes,
        digest: ScopeDigest,
        block_size: int,
        extras: Sequence[bytes],
        *,
        first: int = 0,
    ) -> list[CacheKey]:
        """Keys of ``len(extras)`` consecutive full blocks, each with its extra keys.

        Args:
            parent: key of block ``first - 1`` (the namespace root when ``first`` is 0).
            packed: the sequence's packed tokens (at least ``first + len(extras)`` blocks).
            digest: the scope digest.
            block_size: tokens per block.
            extras: per block, its encoded extra keys (:func:`encode_extra_keys`;
                ``b""`` keys that block exactly as :meth:`derive_chain` does).
            first: index of the first block to key.

        Returns:
            One key per entry of ``extras``, in block order.

        Raises:
            InvalidArgument: ``packed`` holds fewer than ``first + len(extras)`` full
                blocks, ``block_size`` or ``first`` is out of range, or an entry of
                ``extras`` is not bytes.
        """
        _check_range(packed, block_size, len(extras), first)
        if any(type(extra) is not bytes for extra in extras):
            raise InvalidArgument("extras", "...", "each block's extra keys must be bytes")
        if self._native is not None:
            native: list[CacheKey] = self._native.derive_chain_extras(
                parent, packed, digest, block_size, extras, first
            )
            return native
        step = 4 * block_size
        keys: list[CacheKey] = []
        offset = first * step
        for extra in extras:
            parent = self.derive_key(parent, packed[offset : offset + step], digest, extra)
            keys.append(CacheKey(parent))
            offset += step
        return keys


def _check_range(packed: bytes, block_size: int, count: int, first: int) -> None:
    """Refuse a chain past the packed tokens (a short slice would key a partial block).

    No keys (``count`` 0) is an empty chain wherever it starts.
    """
    if block_size <= 0 or count < 0 or first < 0:
        raise InvalidArgument(
            "block_size/count/first",
            f"{block_size}/{count}/{first}",
            "block_size must be positive, count and first not negative",
        )
    if count and (first + count) * 4 * block_size > len(packed):
        raise InvalidArgument(
            "packed",
            f"{len(packed) // (4 * block_size)} full blocks",
            f"fewer than first + count = {first + count} full blocks",
        )


def secret_key_id(secret: bytes) -> str:
    """Name a cache-key secret without revealing it: 16 hex digits of
    ``HMAC-SHA256(secret, "kvgov-key-id-1")`` (what ``kvgov fleet status`` shows per engine).

    Args:
        secret: the secret bytes.

    Returns:
        The key id.
    """
    return hmac.new(bytes(secret), b"kvgov-key-id-1", hashlib.sha256).hexdigest()[:16]


def keychain_setting(environ: Mapping[str, str]) -> KeyChainImpl:
    """The key chain's implementation ``KVGOV_KEYCHAIN`` asks for (``auto`` where unset).

    Args:
        environ: the environment to read (``os.environ``).

    Returns:
        ``"auto"``, ``"native"`` or ``"python"``.

    Raises:
        InvalidArgument: any other value (a typo never falls back to ``auto``).
    """
    value = environ.get(KEYCHAIN_ENV, "").strip() or "auto"
    if value not in KEYCHAIN_CHOICES:
        raise InvalidArgument(KEYCHAIN_ENV, value, "auto, native or python")
    return cast(KeyChainImpl, value)


def load_key_secret(key_secret: bytes | None, *, ephemeral: bool, environ: dict[str, str]) -> bytes:
    """Choose the cache-key secret: the argument, else ``KVGOV_KEY_SECRET``, else refuse.

    Args:
        key_secret: the secret given to the constructor, or None.
        ephemeral: with no secret anywhere, draw a random one that lives and
            dies with this process (cached blocks are then unreachable after a
            restart, which is safe).
        environ: the environment to read (``os.environ``).

    Returns:
        The secret bytes (not yet length-checked; :class:`KeyDeriver` does that).

    Raises:
        KeySecretError: no secret given, none in the environment, and not ephemeral.
    """
    if key_secret is not None:
        return key_secret
    from_env = environ.get(KEY_SECRET_ENV)
    if from_env:
        return from_env.encode("utf-8")
    if ephemeral:
        return secrets.token_bytes(MIN_KEY_SECRET_BYTES)
    raise KeySecretError(
        f"none given: pass key_secret=, set {KEY_SECRET_ENV} (at least "
        f"{MIN_KEY_SECRET_BYTES} bytes), or pass ephemeral_secret=True for a random "
        "secret that lives only as long as this process"
    )
