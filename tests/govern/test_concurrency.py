"""Long work happens outside the governor's lock, and what races it stays consistent."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kvgov.govern import GovernedKVCache, KeyDeriver

from .conftest import make_scope

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))


class _Deriver:
    """A KeyDeriver stand-in that runs a hook inside derive_chain."""

    def __init__(self, inner: KeyDeriver, hook: Callable[[], None]) -> None:
        self._inner = inner
        self._hook = hook

    def derive_chain(self, *args: Any, **kwargs: Any) -> Any:
        self._hook()
        return self._inner.derive_chain(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # the rest (a rotation reads .implementation)
        return getattr(self._inner, name)


def test_key_derivation_does_not_hold_the_lock(make_cache: Factory) -> None:
    """While one admission derives its keys, another thread's locked call completes."""
    cache = make_cache()
    gov = cache.governor
    done = threading.Event()

    def other_thread_gets_the_lock() -> None:
        t = threading.Thread(target=lambda: (cache.stats(), done.set()))
        t.start()
        t.join(timeout=10)

    gov.deriver = _Deriver(gov.deriver, other_thread_gets_the_lock)  # type: ignore[assignment]
    cache.admit("s", make_scope(), PROMPT)
    assert done.is_set(), "stats() waited for the admission's key derivation"


def test_a_rotation_during_key_derivation_rekeys_the_admission(make_cache: Factory) -> None:
    """Keys derived with a secret rotated before the lock are derived again with the new one."""
    cache = make_cache()
    gov = cache.governor
    new_secret = b"n" * 32
    rotated: list[int] = []

    def rotate_once() -> None:
        if not rotated:
            rotated.append(cache.rotate_secret(new_secret))

    gov.deriver = _Deriver(gov.deriver, rotate_once)  # type: ignore[assignment]
    adm = cache.admit("s", make_scope(), PROMPT)
    assert rotated
    keys = [cache.pool.key(b) for b in adm.block_ids[:3]]
    expected = KeyDeriver(new_secret).derive_chain(
        gov.ledger.views.namespaces(gov.ledger.views.view(make_scope()))[0],
        b"".join(t.to_bytes(4, "little") for t in PROMPT),
        gov.ledger.views.view(make_scope()).digest,
        4,
        3,
    )
    assert keys == expected
