"""One native engine process of the fleet proof (tests/fleet/test_fleet_proof.py).

A ``GovernedKVCache`` with a ``FleetAgent`` on the given audit database. It writes the
tenant ``acme``'s KV (unless --no-acme), then loops: each step is an admission of the
tenant ``blocked`` (the boundary where the agent runs its orders), recorded with the
policy revision it was decided under. Its state goes to STATE (JSON, replaced each
step): acme's blocks and whether they read back zero, the probes, the key id.
SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch

from kvgov.allocator import KVSpec
from kvgov.audit import load_public_key
from kvgov.exceptions import PolicyDenied
from kvgov.govern import CacheScope, GovernedKVCache
from kvgov.govern.fleet import FleetAgent, NativeTarget, trusted_keys

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype=torch.float32)


def scope(tenant: str) -> CacheScope:
    return CacheScope(tenant=tenant, classification="internal", model="m", model_revision="r1",
                      tokenizer="t", tokenizer_revision="v1", template_version="x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--engine-id", required=True)
    ap.add_argument("--operator-pub", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--no-acme", action="store_true")
    args = ap.parse_args()
    stop = False

    def _term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    cache = GovernedKVCache.create(spec=SPEC, num_blocks=64, audit_url=args.url,
                                   key_secret=b"k" * 32, worker_id=args.engine_id,
                                   verify_zeroization=True)  # fmt: skip
    agent = FleetAgent(args.url, args.engine_id, NativeTarget(cache),
                       trusted_keys([load_public_key(args.operator_pub)]),
                       poll_interval=0.5, heartbeat_interval=0.5).start()  # fmt: skip
    cache.add_boundary_hook(agent.drain)
    acme: list[int] = []
    if not args.no_acme:
        for i in range(3):
            adm = cache.admit(f"acme-{i}", scope("acme"), [i * 100 + t for t in range(1, 13)])
            for b in adm.block_ids:
                cache.block(b).fill_(1.0 + i)
            cache.release(f"acme-{i}")
            acme += adm.block_ids
    probes: list[dict[str, object]] = []
    n = 0
    while not stop:
        n += 1
        try:
            cache.admit(f"p{n}", scope("blocked"), [n % 7 + 1, 2, 3, 4])
            cache.release(f"p{n}")
            allowed = True
        except PolicyDenied:
            allowed = False
        probes.append({"allowed": allowed, "revision": cache.policy.bundle_revision})
        state = {
            "pid": os.getpid(),
            "registered": agent.registered,
            "acme_blocks": acme,
            "acme_zero": bool(acme) and cache.pool.read_back_zero(acme),
            "executed": agent.executed,
            "probes": probes[-400:],
            "key_id": cache.governor.deriver.key_id,
        }
        tmp = args.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        tmp.replace(args.state)
        time.sleep(0.1)
    agent.stop()
    cache.close()


if __name__ == "__main__":
    main()
