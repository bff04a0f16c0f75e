"""A PostgreSQL audit database behind a freezable proxy (fault and audit tests)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvgov.audit import upgrade
from kvgov.audit.store import normalize_url
from tests.faults.proxy import FreezableProxy


@dataclass(frozen=True)
class ProxiedPg:
    """A PostgreSQL audit database behind a :class:`FreezableProxy`.

    Attributes:
        url: the URL through the proxy (what the code under test uses).
        direct: the URL of the same database without the proxy (what the test checks).
        proxy: the proxy, to freeze, thaw, kill and start.
    """

    url: str
    direct: str
    proxy: FreezableProxy


@pytest.fixture()
def pg_proxy(pg_url: str) -> Iterator[ProxiedPg]:
    """A fresh PostgreSQL audit database at head, reached through a freezable proxy."""
    from tests.conftest import PG_HOST, PG_PORT

    upgrade(pg_url)
    proxy = FreezableProxy((PG_HOST, PG_PORT))
    proxy.start()
    url = normalize_url(pg_url).set(port=proxy.port).render_as_string(hide_password=False)
    try:
        yield ProxiedPg(url, pg_url, proxy)
    finally:
        proxy.kill()
