"""The local-disk tier: one file per sealed block, written atomically, LRU within a byte capacity.

Layout under the tier's root directory (created with mode 0700)::

    objects/<aa>/<sha256(block_key) hex>.kvo     one encoded object (kvgov.offload.objects)
    tmp/<sha256 hex>.<random>.tmp                a write in progress

A put writes the encoded object to a temporary file, ``fsync``s it, renames it over
the final name (``os.replace``, atomic on POSIX) and ``fsync``s the directory, so a
reader (or a crash) sees the old object or the new one, never a torn one. The file
name is a hash of the block key, so names have a fixed length whatever the key; the
block key inside the file is checked against the one asked for on every read.

The index (which block keys are here, LRU order, sizes, deadlines) lives in memory:
the tier is this process's cache. On construction it deletes the ``.kvo`` and
``.tmp`` files a previous process left under its root (ciphertext, but unaccounted
for), and nothing else.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from kvgov.exceptions import InvalidOffloadArgument, TierUnavailable

from .objects import ObjectInfo, SealedBlock, decode, encode
from .tier import LruIndex, TierUsage, check_capacity, check_tier_name

__all__ = ["DiskTier"]

_SUFFIX = ".kvo"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskTier:
    """Sealed blocks in files under one directory; least recently used evicted first.

    Thread-safe: one lock serializes the index and the file operations.

    Args:
        root: the directory (created if missing).
        capacity_bytes: most bytes held (the sum of the object files' sizes).
        name: the tier's name, bound into every object's AAD.
        fsync: ``fsync`` each object and its directory before it counts as stored.

    Raises:
        InvalidOffloadArgument: a bad capacity or name, or ``root`` is not a directory.
    """

    #: ``put`` writes the object's bytes to a file and keeps nothing of it (see ``Tier``).
    put_copies = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        capacity_bytes: int,
        *,
        name: str = "disk",
        fsync: bool = True,
    ) -> None:
        self._name = check_tier_name(name)
        self._index: LruIndex[Path] = LruIndex(name, check_capacity(capacity_bytes))
        self._root = Path(root)
        self._objects = self._root / "objects"
        self._tmp = self._root / "tmp"
        self._fsync = fsync
        self._lock = threading.Lock()
        try:
            for d in (self._root, self._objects, self._tmp):
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise InvalidOffloadArgument("root", str(root), "must be a directory") from None
        for leftover in (*self._objects.glob(f"*/*{_SUFFIX}"), *self._tmp.glob("*.tmp")):
            leftover.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"DiskTier(root={str(self._root)!r}, name={self._name!r})"

    @property
    def name(self) -> str:
        """The tier's name."""
        return self._name

    @property
    def capacity_bytes(self) -> int:
        """Most bytes held."""
        return self._index.capacity_bytes

    @property
    def root(self) -> Path:
        """The tier's directory."""
        return self._root

    def path_of(self, block_key: bytes) -> Path:
        """Where the object for ``block_key`` is (or would be) stored."""
        digest = hashlib.sha256(block_key).hexdigest()
        return self._objects / digest[:2] / f"{digest}{_SUFFIX}"

    def put(self, obj: SealedBlock, now_us: int) -> list[ObjectInfo]:
        """Write ``obj`` atomically, evicting LRU objects to fit; returns the evicted ones.

        Raises:
            TierUnavailable: the file could not be written (disk full, permissions).
        """
        info = obj.info()
        data = encode(obj)
        path = self.path_of(obj.block_key)
        with self._lock:
            removed = self._index.make_room(obj.block_key, info.nbytes)
            for _info, old in removed:
                old.unlink(missing_ok=True)
            tmp = self._tmp / f"{path.stem}.{secrets.token_hex(4)}.tmp"
            try:
                path.parent.mkdir(mode=0o700, exist_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if self._fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
                if self._fsync:
                    _fsync_dir(path.parent)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise TierUnavailable(self._name, f"cannot write {path}: {exc}") from None
            self._index.add(info, path)
        return [i for i, _p in removed if i.block_key != obj.block_key]

    def get(self, block_key: bytes) -> SealedBlock | None:
        """Read the object for ``block_key`` (now most recently used), or None.

        Raises:
            ObjectCorrupt: the file does not parse (truncated, padded, not an object).
            TierUnavailable: the file exists but cannot be read.
        """
        with self._lock:
            path = self._index.get(block_key)
            if path is None:
                return None
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # removed behind our back: a miss
                self._index.pop(block_key)
                return None
            except OSError as exc:
                raise TierUnavailable(self._name, f"cannot read {path}: {exc}") from None
        return decode(data, tier=self._name, block_key=block_key)

    def delete(self, block_key: bytes) -> ObjectInfo | None:
        """Delete the object for ``block_key``; returns its info, or None."""
        with self._lock:
            entry = self._index.pop(block_key)
            if entry is None:
                return None
            entry[1].unlink(missing_ok=True)
            return entry[0]

    def delete_by_tenant(self, tenant: str) -> list[ObjectInfo]:
        """Delete every object of ``tenant``."""
        return self.delete_where(lambda info: info.tenant == tenant)

    def delete_where(self, predicate: Callable[[ObjectInfo], bool]) -> list[ObjectInfo]:
        """Delete every object whose info satisfies ``predicate``."""
        with self._lock:
            removed = self._index.pop_where(predicate)
            for _info, path in removed:
                path.unlink(missing_ok=True)
        return [info for info, _p in removed]

    def list_expired(self, now_us: int) -> list[ObjectInfo]:
        """Objects whose deadline is at or before ``now_us``."""
        with self._lock:
            return self._index.expired(now_us)

    def usage(self) -> TierUsage:
        """Bytes and objects held."""
        with self._lock:
            return TierUsage(self._index.used_bytes, len(self._index))

    def close(self) -> None:
        """Delete every object file (the tier is a cache of this process)."""
        with self._lock:
            for _info, path in self._index.clear():
                path.unlink(missing_ok=True)

    def _check_invariants(self) -> None:
        """Raise InternalError if the accounting drifted (tests call it)."""
        with self._lock:
            self._index._check_invariants()
