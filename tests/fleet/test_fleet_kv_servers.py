"""A fleet's KV cache, governed: two real vLLM servers sharing kvgov's Redis tier.

Two governed OpenAI servers (vllm-cpu 0.32, the tiny model) on 127.0.0.1 with
``GovernedKVConnector``, one Redis (a prefix of this run's own, deleted after), one
PostgreSQL database (created and dropped here: both servers' audit streams, the shared
wrapped-key store, the fleet's orders); and the control: two stock servers with vLLM's
``ExampleConnector`` on one shared folder. The four start side by side, once.

(a) tenant A's long prompt on server 1, then on server 2: server 2 serves it from the
    tier (vLLM's external hit tokens, the connector's audit events); the time to first
    token is printed beside recomputing it on server 2 with the tier off (a
    ``restricted`` request, which the tier neither loads nor saves), not asserted;
(b) tenant B, the same prompt, on server 2: 0 external hit tokens, audited as a miss
    in B's scope;
(c) ``kvgov fleet purge --tenant A`` (server 1's fleet agent runs ``purge_tenant``):
    no object in Redis decrypts as A's, and a copy of A's objects taken before the purge
    and put back (a Redis backup) is refused by server 2 as ``key_destroyed`` and
    recomputed;
(d) control: stock servers whose connector keys by the token ids: tenant B, with its own
    ``cache_salt``, is served A's KV on the other server (the test sees the leak).

Run in the vllm-cpu venv (``make test-fleet``, or
``.bench/vllm-cpu-venv/bin/python -m pytest -m fleet tests/fleet/test_fleet_kv_servers.py``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

if importlib.util.find_spec("vllm") is None:  # not imported here: the servers import it
    pytest.skip("needs vLLM (the vllm-cpu venv: make test-fleet)", allow_module_level=True)

from fleet_kv_env import (  # noqa: E402
    KEK_HEX,
    KEY_SECRET,
    TIER_NAME,
    cached_tokens,
    control_pair,
    governed_pair,
    metric,
    reset_prefix_cache,
    scope,
    ttft,
)
from vllm_cpu_env import Server, prompt, start_all  # noqa: E402

from tests.conftest import _pg_admin_connect, _pg_unavailable_reason  # noqa: E402

pytestmark = [pytest.mark.fleet, pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(900)]

REDIS_URL = "redis://127.0.0.1:6379/0"
CONNECTOR = "kvgov.govern.vllm.kv_connector.GovernedKVConnector"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
#: tenant A's long prompt: the tiny model's longest (max_model_len 512, one token per word)
LONG = prompt("fleet-kv tenant A", 480)


@dataclass
class Fleet:
    one: Server
    two: Server
    stock_one: Server
    stock_two: Server
    db_url: str
    prefix: str
    operator_key: Path
    seen: dict[str, Any] = field(default_factory=dict)


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def _redis_reason() -> str | None:
    try:
        _redis().ping()
        return None
    except Exception as exc:  # any failure to connect means "absent" here
        return f"Redis not reachable at {REDIS_URL}: {exc}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    import vllm_cpu_tiny_model

    from kvgov.audit import upgrade
    from kvgov.audit.signing import generate_key_files

    for reason in (_pg_unavailable_reason(), _redis_reason()):
        if reason is not None:
            if os.environ.get("CI"):
                pytest.fail(f"{reason} (CI has it: this must not be skipped)")
            pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("fleet-kv")
    model = tmp / "tiny"
    vllm_cpu_tiny_model.write(str(model))
    name = f"kvgov_fleetkv_{uuid.uuid4().hex[:12]}"
    with _pg_admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    prefix = f"kvgov-test-fleetkv:{uuid.uuid4().hex}"
    servers: list[Server] = []
    try:
        upgrade(db_url)
        operator = generate_key_files(tmp / "keys" / "operator.pem")
        python = Path(sys.executable)
        one, two = governed_pair(
            python, model, tmp, db_url=db_url, redis_url=REDIS_URL, prefix=prefix,
            operator_keys=operator.public,
            # the tier is used whatever a loaded host's figures say (the rule has its
            # unit tests): every step below must take the tier's path
            cost_rule=False,
        )  # fmt: skip
        shared = tmp / "shared-kv"
        shared.mkdir()
        stock_one, stock_two = control_pair(python, model, tmp, shared)
        servers = [one, two, stock_one, stock_two]
        took = start_all(servers, timeout=600)
        starts = ", ".join(f"{k} {v:.0f} s" for k, v in took.items())
        print(f"\nserver starts (side by side): {starts}")
        yield Fleet(one, two, stock_one, stock_two, db_url, prefix, operator.private)
    finally:
        for s in servers:
            s.stop()
        client = _redis()
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        with _pg_admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def events(
    fleet: Fleet, match: Callable[[dict[str, Any]], bool], wait: float = 15.0
) -> list[dict[str, Any]]:
    """The audit events ``match`` accepts (the servers' writers are asynchronous: wait for one)."""
    from kvgov.audit import AuditQueries

    deadline = time.monotonic() + wait
    while True:
        with AuditQueries(fleet.db_url) as q:
            rows = [d for d in (e.to_dict() for e in q.events()) if match(d)]
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def _connector(row: dict[str, Any]) -> bool:
    return str(row["details"].get("connector", "")).endswith("GovernedKVConnector")


def keyed_tenant(tenant: str) -> str:
    """The tenant's name in the tier and the key store (an HMAC under the fleet's secret)."""
    from kvgov.govern.fleet_kv import FleetNames
    from kvgov.govern.keys import KeyDeriver

    return FleetNames(KeyDeriver(KEY_SECRET.encode())).tenant(tenant)


def decrypting(fleet: Fleet) -> dict[str, int]:
    """Every object in the tier, opened as its own header says (block key, keyed scope,
    keyed tenant): how many open, by keyed tenant name, and how many are refused, by reason."""
    from kvgov.audit import SqlWrappedKeyStore
    from kvgov.govern.fleet_kv import FleetStore
    from kvgov.offload import LocalKEK, RedisTier
    from kvgov.offload.objects import decode

    tier = RedisTier(REDIS_URL, 1 << 30, name=TIER_NAME, prefix=fleet.prefix, timeout=5.0)
    store = FleetStore(tier, SqlWrappedKeyStore(fleet.db_url), LocalKEK.from_hex(KEK_HEX),
                       key_recheck_s=0.0)  # fmt: skip
    client = _redis()
    seen: dict[str, int] = {}
    try:
        for key in client.scan_iter(match=f"{tier.prefix}:o:*"):
            block_key = bytes.fromhex(key.decode().rsplit(":", 1)[1])
            blob = client.get(key)
            if blob is None:
                continue
            obj = decode(blob, tier=TIER_NAME, block_key=block_key)
            got = store.load(block_key, obj.scope_digest, obj.tenant)
            what = (
                f"opens:{obj.tenant}"
                if got.hit
                else f"refused:{getattr(got.reason, 'value', got.reason)}"
            )
            seen[what] = seen.get(what, 0) + 1
    finally:
        store.close()
    return seen


def test_a_tenants_prefix_computed_on_one_server_is_served_to_it_by_another(fleet: Fleet) -> None:
    """(a) A's 480-token prompt on server 1 (computed, saved sealed), then on server 2:
    loaded from the tier. Its TTFT there is printed beside recomputing on server 2 with
    the tier off (a ``restricted`` request: neither loaded nor saved)."""
    one, two = fleet.one, fleet.two
    before = metric(two, EXTERNAL_HITS)
    t_one, u_one = ttft(one, LONG, scope("A"))
    assert cached_tokens(u_one) == 0, "a fresh prompt: nothing cached on server 1"
    saves = events(fleet, lambda r: r["type"] == "offload" and _connector(r)
                   and r["stream"] == "vllm-1" and r["tenant"] == "A")  # fmt: skip
    assert saves and {r["details"]["outcome"] for r in saves} == {"save_stored"}, saves
    saved_blocks = sum(len(r["block_ids"]) for r in saves)
    assert saved_blocks >= 14, f"A's full blocks saved by server 1: {saved_blocks}"

    t_two, u_two = ttft(two, LONG, scope("A"))
    external = metric(two, EXTERNAL_HITS) - before
    t_off, u_off = ttft(two, LONG, scope("A", "restricted"))  # recomputed, tier off
    fleet.seen["a"] = {"server 1 (computed, saved)": t_one, "server 2 (from the tier)": t_two,
                       "server 2 (tier off, recomputed)": t_off}  # fmt: skip
    print(f"\n(a) TTFT of A's {u_two.get('prompt_tokens')}-token prompt: server 1 "
          f"{t_one * 1e3:.0f} ms (computed, saved); server 2 {t_two * 1e3:.0f} ms from the "
          f"tier ({external:.0f} external hit tokens) vs {t_off * 1e3:.0f} ms recomputed with "
          f"the tier off ({t_off / t_two:.1f}x)")  # fmt: skip
    assert external >= 14 * 32, f"server 2 loaded A's blocks from the tier: {external}"
    assert cached_tokens(u_two) >= 14 * 32, u_two
    assert cached_tokens(u_off) == 0, "the restricted request is served nothing cached"
    hits = events(fleet, lambda r: r["type"] == "offload_restore" and _connector(r)
                  and r["stream"] == "vllm-2" and (r["reused_tokens"] or 0) > 0)  # fmt: skip
    assert [(r["tenant"], r["requester_tenant"]) for r in hits] == [("A", "A")], hits
    assert hits[0]["reused_tokens"] == external
    restricted = events(fleet, lambda r: r["stream"] == "vllm-2" and _connector(r)
                        and r["classification"] == "restricted", wait=0)  # fmt: skip
    assert not restricted, "the tier neither loads nor saves a restricted request's KV"


def test_another_tenant_with_the_same_prompt_gets_nothing_from_the_tier(fleet: Fleet) -> None:
    """(b) B sends A's prompt to server 2: 0 external hit tokens, a miss audited in B's scope."""
    two = fleet.two
    before = metric(two, EXTERNAL_HITS)
    _t, usage = ttft(two, LONG, scope("B"))
    assert metric(two, EXTERNAL_HITS) - before == 0, "B loads nothing of A's from the tier"
    assert cached_tokens(usage) == 0, usage
    misses = events(fleet, lambda r: r["stream"] == "vllm-2" and _connector(r)
                    and r["tenant"] == "B" and r["details"].get("outcome") == "miss")  # fmt: skip
    assert misses, "B's lookup is audited"
    assert {(r["type"], r["requester_tenant"], r["reused_tokens"], r["details"]["reason"])
            for r in misses} == {("offload_restore", "B", 0, "absent")}  # fmt: skip
    assert not events(fleet, lambda r: r["type"] in ("offload_restore", "reuse",
                      "cross_tenant_reuse") and r["requester_tenant"] == "B"
                      and r["tenant"] != "B", wait=0)  # fmt: skip


def test_a_purge_on_server_1_leaves_nothing_of_the_tenant_that_decrypts(fleet: Fleet) -> None:
    """(c) ``kvgov fleet purge --tenant A``, run by server 1's fleet agent: A's data key is
    destroyed in the shared key store; no object in Redis opens as A's; a copy taken before
    the purge, put back, is refused by server 2 (``key_destroyed``) and recomputed."""
    client = _redis()
    a, b = f"opens:{keyed_tenant('A')}", f"opens:{keyed_tenant('B')}"
    before = decrypting(fleet)
    assert before.get(a, 0) >= 14 and before.get(b, 0) >= 14 and len(before) == 2, before
    backup = {k: client.get(k) for k in client.scan_iter(match=f"{fleet.prefix}:*:o:*")}

    kvgov = [sys.executable, "-c", "from kvgov.cli.main import main; main()"]
    order = subprocess.run(
        [*kvgov, "fleet", "purge", "--tenant", "A", "--key", str(fleet.operator_key),
         "--url", fleet.db_url], capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert order.returncode == 0, order.stdout + order.stderr
    order_id = order.stdout.strip()
    done = subprocess.run(
        [*kvgov, "fleet", "wait", order_id, "--timeout", "120", "--url", fleet.db_url],
        capture_output=True, text=True, cwd=ROOT, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vllm-1: live, completed" in done.stdout, done.stdout
    (erasure,) = events(fleet, lambda r: r["type"] == "erasure"
                        and r["details"].get("order_id") == order_id)  # fmt: skip
    assert erasure["stream"] == "vllm-1" and erasure["tenant"] == "A"
    assert erasure["details"]["offload"]["destroyed_key_ids"], erasure["details"]

    after = decrypting(fleet)
    print(f"\n(c) objects in Redis by what opens them: before the purge {before}, after {after}")
    assert after == {b: before[b]}, "A's objects are gone; B's still open (the check sees them)"

    # a backup of Redis taken before the purge, restored: nothing of A's in it opens
    time.sleep(1.5)  # past key_recheck_s: server 2 re-reads A's key's state
    for key, blob in backup.items():
        client.set(key, blob)
    restored = decrypting(fleet)
    assert restored == {b: before[b], "refused:key_destroyed": before[a]}, restored
    for key, blob in backup.items():
        client.set(key, blob)
    reset_prefix_cache(fleet.two)  # server 2's own device copy of A's blocks: gone
    _t, usage = ttft(fleet.two, LONG, scope("A"))
    assert usage.get("completion_tokens") == 1, "A is served, its KV recomputed"
    refused = events(fleet, lambda r: r["type"] == "offload_refused" and r["stream"] == "vllm-2")
    seen = events(fleet, lambda r: r["stream"] == "vllm-2" and r["tenant"] == "A", wait=0)
    assert refused, f"server 2 refused A's copies (cached {cached_tokens(usage)}); saw {seen}"
    assert {r["details"]["reason"] for r in refused} == {"key_destroyed"}, refused
    assert {r["tenant"] for r in refused} == {"A"}
    failed = events(fleet, lambda r: r["stream"] == "vllm-2" and _connector(r)
                    and r["details"].get("outcome") == "load_failed")  # fmt: skip
    assert failed and {r["details"]["reason"] for r in failed} == {"key_destroyed"}, failed


def test_control_a_connector_keyed_by_token_ids_shares_a_tenants_kv_across_servers(
    fleet: Fleet,
) -> None:
    """(d) The same two-server deployment with vLLM's ExampleConnector (stock vLLM, one
    shared folder): B's request on server 2, even with B's own cache_salt, is served the
    KV A's request computed on server 1. The test can see the leak it proves absent above."""
    one, two = fleet.stock_one, fleet.stock_two
    text = prompt("fleet-kv control", 480)
    _t, first = ttft(one, text, {"cache_salt": "tenant-A"})
    assert cached_tokens(first) == 0
    before = metric(two, EXTERNAL_HITS)
    _t, stolen = ttft(two, text, {"cache_salt": "tenant-B"})
    leaked = metric(two, EXTERNAL_HITS) - before
    print(f"\n(d) control: B on stock server 2 was served {leaked:.0f} tokens of A's KV "
          f"(cached_tokens {cached_tokens(stolen)})")  # fmt: skip
    assert leaked >= 14 * 32, "control: the token-keyed connector serves B A's KV"
    assert cached_tokens(stolen) >= 14 * 32
