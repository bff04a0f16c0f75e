"""pytest plugin: run vLLM's own scheduler and prefix-cache tests with kvgov's classes in place.

Used by ``make test-vllm`` from the folder holding vLLM's ``tests/`` (from its sdist),
with this folder on ``PYTHONPATH``::

    python -m pytest tests/v1/core/test_scheduler.py -p kvgov_vllm_suite --noconftest

Before collection it runs kvgov's general plugin (as vLLM does in every process) and
replaces the names vLLM's tests build from: ``tests.v1.core.utils.Scheduler`` /
``AsyncScheduler`` (what ``create_scheduler`` builds) and
``vllm.v1.core.kv_cache_coordinator.BlockPool`` (what every ``KVCacheManager``
builds); after collection, the names ``Scheduler`` / ``AsyncScheduler`` /
``BlockPool`` the test modules imported themselves. vLLM's test requests carry no
kvgov scope, so the engine runs with a default one (``KVGOV_DEFAULT_*``) and an
ephemeral secret; the audit trail goes to a temporary SQLite file. vLLM's test
connectors are declared in ``connector_kinds`` (``KVGOV_CONNECTOR_KINDS``) as
``block_hashes`` connectors: ``MockKVConnector`` offers a fixed number of tokens
(it keys by nothing), ``ExampleConnector`` stands in for a connector the tests drive
through the scheduler; outside this suite ``ExampleConnector`` is refused (it ignores
``cache_salt``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

_DEFAULTS = {
    "KVGOV_DEFAULT_TENANT": "vllm-tests",
    "KVGOV_DEFAULT_CLASSIFICATION": "internal",
    "KVGOV_DEFAULT_TEMPLATE": "none",
    "KVGOV_EPHEMERAL_SECRET": "1",
    "KVGOV_CONNECTOR_KINDS": (
        '{"tests.v1.kv_connector.unit.utils.MockKVConnector": "block_hashes", '
        '"vllm.distributed.kv_transfer.kv_connector.v1.example_connector.ExampleConnector": '
        '"block_hashes"}'
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    audit_dir = tempfile.mkdtemp(prefix="kvgov-vllm-suite-")
    os.environ.setdefault("KVGOV_AUDIT_URL", f"sqlite:///{audit_dir}/audit.db")
    for name, value in _DEFAULTS.items():
        os.environ.setdefault(name, value)

    import vllm.v1.core.kv_cache_coordinator as coordinator

    import tests.v1.core.utils as utils
    from kvgov.govern.vllm import plugin
    from kvgov.govern.vllm.pool import GovernedBlockPool
    from kvgov.govern.vllm.scheduler import GovernedAsyncScheduler, GovernedScheduler

    plugin.register()
    utils.Scheduler = GovernedScheduler
    utils.AsyncScheduler = GovernedAsyncScheduler
    coordinator.BlockPool = GovernedBlockPool
    config._kvgov_classes = (GovernedScheduler, GovernedAsyncScheduler, GovernedBlockPool)  # type: ignore[attr-defined]


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    governed, governed_async, governed_pool = config._kvgov_classes  # type: ignore[attr-defined]
    swap: dict[Any, Any] = {
        Scheduler: governed,
        AsyncScheduler: governed_async,
        BlockPool: governed_pool,
    }
    seen: set[int] = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        for name in ("Scheduler", "AsyncScheduler", "BlockPool"):
            if getattr(module, name, None) in swap:
                setattr(module, name, swap[getattr(module, name)])


@pytest.hookimpl(trylast=True)
def pytest_report_header(config: pytest.Config) -> str:
    return (
        "kvgov_vllm_suite: kvgov's GovernedScheduler / GovernedAsyncScheduler / GovernedBlockPool"
    )
