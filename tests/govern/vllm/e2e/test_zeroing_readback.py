"""Zeroization read back from a real worker's KV tensors: ``LLM(...)`` in-process, on the CPU.

Two engines on the tiny model, started once for the module: stock (kvgov's plugin
excluded) and governed. After requests finish, after eviction, after ``purge_tenant``
and after a retention expiry, ``LLM.collective_rpc`` reads every KV block of the worker
(``benchmarks/vllm_kv_probe.py``, a worker extension): every block holding a non-zero
byte must be one a request holds or one in the prefix cache (the pool's view, from the
engine core). A block that left its owner (the partial tail of a finished request, an
evicted, purged or expired block) is all zero, so the next scope's request scheduled onto
it reads nothing of the last. Each phase ends with vLLM's own ``reset_prefix_cache`` on
both engines, after which no block has an owner: governed, every block reads zero (a check
that asks kvgov nothing); stock, the remnants show (the control)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_cpu_env import (
    prompt,
)

from tests.conftest import PG_HOST, PG_PORT, PG_USER

from . import conftest
from .conftest import engine_pair, start_llm

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

KVGOV_CLI = str(Path(sys.executable).with_name("kvgov"))
NUM_BLOCKS = 61  # small: a few distinct prompts evict
TTL = 2  # seconds: tenant "brief"'s retention
POLICY_DATA = {
    "kvgov": {"config": {"tenants": {"brief": {"retention_seconds": {"internal": TTL}}}}}
}


def _start(model: Path, governed: bool, audit_url: str) -> Any:
    kvgov = {"audit_url": audit_url, "model_revision": "r1", "policy_data": POLICY_DATA}
    return start_llm(model, governed, kvgov, num_gpu_blocks_override=NUM_BLOCKS)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVGOV_CLI, *args], capture_output=True, text=True, check=False)


class Engines(conftest.Engines):
    def __init__(self, stock: Any, governed: Any, audit_url: str) -> None:
        super().__init__(stock, governed)
        self.audit_url = audit_url


@pytest.fixture(scope="module")
def audit_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The governed engine's audit database: a fresh PostgreSQL database where 127.0.0.1:5432
    answers (CI has one), else SQLite (``test_the_trail_verifies`` says which it checked)."""
    from tests.conftest import _pg_admin_connect, _pg_unavailable_reason

    reason = _pg_unavailable_reason()
    if reason is not None:
        print(f"\n{reason}: the governed engine audits to SQLite")
        yield f"sqlite:///{tmp_path_factory.mktemp('zeroing') / 'audit.db'}"
        return
    name = f"kvgov_e2e_{uuid.uuid4().hex[:12]}"
    with _pg_admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    try:
        upgrade = cli("db", "upgrade", url)
        assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
        yield url
    finally:
        with _pg_admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def engines(tiny_model: Path, audit_url: str) -> Iterator[Engines]:
    with engine_pair(lambda governed: _start(tiny_model, governed, audit_url)) as pair:
        for llm in pair:
            (state,) = llm.collective_rpc("kvgov_kv_state")
            assert state["num_blocks"] == NUM_BLOCKS, state
        yield Engines(*pair, audit_url)


def test_finished_requests_leave_no_kv_in_freed_blocks(engines: Engines) -> None:
    """Three requests of two tenants finish: governed, their partial tail blocks (freed
    without a hash) read zero while the full blocks stay cached; stock keeps the KV."""
    text = prompt("finish", 170)  # 5 full blocks and a partial tail
    hits = {}
    for name in ("stock", "governed"):
        hits[name] = [
            engines.generate(name, text, "acme"),
            engines.generate(name, text, "globex"),
            engines.generate(name, text, "acme"),
        ]
    print(f"\ncached tokens {hits}")
    assert hits["stock"][1] > 0 and hits["governed"][1] == 0
    assert hits["governed"][2] > 0
    assert engines.pool()["cached"], "governed keeps the full blocks cached"
    assert engines.remnants() == []
    engines.check_reset()


def test_evicted_blocks_read_zero(engines: Engines) -> None:
    """Distinct prompts need more than the 61 blocks, so vLLM evicts cached ones: on governed,
    every block that left an owner reads zero (or holds its new owner's KV)."""
    for i in range(12):  # 12 prompts of 7 full blocks and a tail: 84 blocks > 60
        for name in engines.by_name:
            engines.generate(name, prompt(f"evict {i}", 230), "initech")
    evictions = engines.core.call_utility("kvgov_call", "stats")["total"]["evictions"]
    print(f"\ngoverned evictions {evictions}")
    assert evictions.get("capacity", 0) > 0, "the prompts evicted cached blocks"
    assert engines.remnants() == []
    engines.check_reset()


def test_purged_tenant_blocks_read_zero(engines: Engines) -> None:
    """``purge_tenant`` drops the tenant's cached blocks and orders them zeroed; the idle
    engine's next step zeroes them in the worker."""
    text = prompt("purge", 200)
    before = set(engines.pool()["cached"])
    engines.generate("governed", text, "initech")
    cached = set(engines.pool()["cached"]) - before  # initech's blocks of this prompt
    assert cached
    report = engines.core.call_utility("kvgov_call", "purge_tenant", "initech")
    assert report["blocks_zeroized"] >= len(cached), report
    assert engines.remnants() == []
    pool = engines.pool()
    assert not cached & (set(pool["cached"]) | set(pool["owned"])), "purged from the cache"
    assert not cached & engines.nonzero("governed"), "purged blocks read zero"
    assert engines.generate("governed", text, "initech") == 0, "nothing of initech is left"


def test_expired_blocks_read_zero_before_another_scope_runs(engines: Engines) -> None:
    """Tenant "brief" keeps its KV for 2 s. After that, the next step (another tenant's
    request) sweeps the expired blocks and zeroes them before its forward pass; stock
    (the control) still serves brief's prompt from cache."""
    text = prompt("retention", 200)
    before = set(engines.pool()["cached"])
    for name in engines.by_name:
        engines.generate(name, text, "brief")
    briefs = set(engines.pool()["cached"]) - before
    assert briefs
    time.sleep(TTL + 1.5)
    for name in engines.by_name:
        engines.generate(name, prompt("after expiry", 100), "acme")
    stats = engines.core.call_utility("kvgov_call", "stats")
    assert stats["tenants"]["brief"]["evictions"].get("expired", 0) >= len(briefs), stats
    pool = engines.pool()
    left = (briefs - set(pool["owned"]) - set(pool["cached"])) & engines.nonzero("governed")
    assert not left, f"expired blocks read zero: {left}"
    assert engines.remnants() == []
    assert engines.generate("stock", text, "brief") > 0, "control: stock still serves it"
    assert engines.generate("governed", text, "brief") == 0, "governed: expired"
    engines.check_reset()


def test_the_trail_verifies_with_the_erasure_and_expiry(engines: Engines) -> None:
    """Last in the module (it shuts the governed engine down, which flushes its trail):
    ``kvgov audit verify`` passes on what the engine wrote (PostgreSQL in CI), the purge is
    the erasure evidence of initech, the expiry a sweep of brief's blocks, and the
    zeroizations name the owners whose blocks they cleared."""
    engines.core.shutdown()
    url = engines.audit_url
    print(f"\naudit database: {url.split('://')[0]}")
    verify = cli("audit", "verify", "--url", url, "--no-progress")
    assert verify.returncode == 0, verify.stdout + verify.stderr

    events = cli("audit", "events", "--url", url, "--json")
    assert events.returncode == 0, events.stderr
    rows = json.loads(events.stdout)
    erasure = [r for r in rows if r["type"] == "erasure" and r["tenant"] == "initech"]
    assert erasure and erasure[0]["details"]["blocks_zeroized"] > 0, erasure
    expired = [r for r in rows if r["type"] == "eviction" and r["tenant"] == "brief"]
    assert any("expired" in json.dumps(r["details"]) for r in expired), expired
    zero = [r for r in rows if r["type"] == "zeroization"]
    owners = {r["tenant"] for r in zero if r["details"].get("state") == "ordered"}
    assert {"acme", "initech", "brief"} <= owners, owners
    assert {"ordered", "done"} <= {r["details"].get("state") for r in zero}
