"""The replay floor: an old object put back under a block key is refused.

Authentication proves an object was sealed by the fleet for this block key, scope,
tenant and tier, but not that it is the *latest* such object: someone who can write
to a tier could put back an object read earlier, after it was replaced or deleted
(to resurrect an invalidated block, say). Every object carries ``written_us``, bound
into its AAD and strictly increasing per store, so a store keeps, per (tier, block
key), the oldest write time it still accepts:

* sealing an object raises the floor to its ``written_us``;
* restoring one raises it to that object's ``written_us`` (so a worker that read a
  newer object refuses an older one afterwards);
* deleting one on purpose (invalidation, ``delete``) raises it above the deletion time.

Eviction does not raise the floor: an evicted object was current, and bringing it back
restores exactly what was there. A floor is forgotten once the latest deadline of the
objects it was raised for has passed: an older object's deadline is no later (retention
is a TTL counted from the write, so it is earlier unless the retention policy was
lengthened meanwhile), and the deadline check refuses it from then on (``prune``, run
by the store's ``sweep``). The map is also capped (``REPLAY_FLOOR_ENTRIES``, least
recently raised dropped first): a dropped floor only means replays of that key are
no longer caught by this store, as for a key it never touched.

What this cannot catch: a replay into a shared tier of an object the reading worker
never saw replaced or deleted (another worker did); see docs/offload.md.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from kvgov.defaults import REPLAY_FLOOR_ENTRIES
from kvgov.exceptions import ObjectReplayed

__all__ = ["ReplayFloor"]


@dataclass(slots=True)
class _Floor:
    #: Objects written before this (microseconds) are refused.
    min_written_us: int
    #: The latest deadline of the objects the floor was raised for; forgotten after it.
    keep_until_us: int


class ReplayFloor:
    """Per (tier, block key) oldest acceptable write time. Thread-safe.

    Why an ``OrderedDict``: raising a floor moves it to the end in O(1), so the cap
    drops the floor raised longest ago.

    Args:
        max_entries: most floors kept.
    """

    def __init__(self, max_entries: int = REPLAY_FLOOR_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._max = max_entries
        self._floors: OrderedDict[tuple[str, bytes], _Floor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._floors)

    def raise_to(self, tier: str, block_key: bytes, written_us: int, keep_until_us: int) -> None:
        """Refuse objects for ``(tier, block_key)`` written before ``written_us`` from now on.

        Args:
            tier: the tier.
            block_key: the block key.
            written_us: the new floor (it only ever rises).
            keep_until_us: the deadline of the object it is raised for.
        """
        key = (tier, block_key)
        with self._lock:
            floor = self._floors.get(key)
            if floor is None:
                self._floors[key] = _Floor(written_us, keep_until_us)
                if len(self._floors) > self._max:
                    self._floors.popitem(last=False)
                return
            self._floors.move_to_end(key)
            floor.min_written_us = max(floor.min_written_us, written_us)
            floor.keep_until_us = max(floor.keep_until_us, keep_until_us)

    def check(self, tier: str, block_key: bytes, written_us: int) -> None:
        """Refuse an object written before the floor.

        Raises:
            ObjectReplayed: ``written_us`` is below the floor.
        """
        with self._lock:
            floor = self._floors.get((tier, block_key))
            if floor is None or written_us >= floor.min_written_us:
                return
            at = floor.min_written_us
        raise ObjectReplayed(
            tier,
            block_key,
            f"it was written at {written_us} us, before the newest object this store wrote, "
            f"read or deleted for the key ({at} us): an old copy was put back",
        )

    def prune(self, now_us: int) -> int:
        """Forget floors whose latest deadline is at or before ``now_us``; returns how many."""
        with self._lock:
            stale = [k for k, f in self._floors.items() if f.keep_until_us <= now_us]
            for k in stale:
                del self._floors[k]
            return len(stale)
