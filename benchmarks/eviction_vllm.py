"""vLLM's pool rows of bench_eviction_policy.py: run in the vLLM venv (``.bench/vllm-venv``).

Drives vLLM 0.33's ``BlockPool`` directly (no scheduler, no model), stock and governed
(kvgov's :class:`~kvgov.govern.vllm.pool.GovernedBlockPool` with the binding's keyed
hook), through the same request streams as kvgov's own pool: a request looks up its
chain of block hashes, touches the hit, takes new blocks (evicting), caches them and
frees everything. Prints JSON lines the parent prints side by side.

    .bench/vllm-venv/bin/python benchmarks/eviction_vllm.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's kvgov, not an installed one
sys.path.insert(0, str(REPO / "benchmarks"))

from eviction_streams import (  # noqa: E402
    NOISY_BLOCKS,
    NOISY_QUOTAS,
    Request,
    durable_streams,
    noisy_stream,
)
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_utils import BlockHash  # noqa: E402

from kvgov.allocator import Quota  # noqa: E402
from kvgov.allocator.quota import check_quotas  # noqa: E402
from kvgov.govern.vllm.pool import GovernedBlockPool  # noqa: E402

BS = 16


class Driver:
    """One vLLM pool, stock or governed, and the request loop over it."""

    def __init__(self, mode: str, num_blocks: int, quotas: dict[str, Quota] | None = None) -> None:
        self.mode = mode
        self.governed = mode != "vllm stock"
        cls = GovernedBlockPool if self.governed else BlockPool
        self.pool: Any = cls(num_blocks, True, BS)
        self.owners: list[Any] = [None] * num_blocks
        self.queue: Any = None
        self.scopes: dict[str, Any] = {}
        if self.governed:
            pool = self.pool
            pool.kvgov_owner_table = self.owners
            pool.kvgov_keyed = self._keyed
            if quotas:
                pool.kvgov_set_quotas(check_quotas(quotas, num_blocks))
            self.queue = pool.kvgov_governed
        self.current: tuple[str, int] = ("", 50)

    def _keyed(self, request: Any, ids: list[int], first: int = 0) -> None:
        """The binding's hook (VllmGovernance._keyed, without retention)."""
        tenant, priority = self.current
        queue = self.queue
        if queue is None:
            if priority == 50:
                return
            queue = self.queue = self.pool.kvgov_queue()
        queue.kvgov_keyed(ids, priority, queue.kvgov_group(tenant), None)

    def run(self, req: Request) -> int:
        """One request; returns its blocks hit."""
        pool = self.pool
        hashes = [BlockHash(h) for h in req.hashes]
        hit: list[Any] = []
        for h in hashes:
            found = pool.get_cached_block(h, [0])
            if not found:
                break
            hit.append(found[0])
        if hit:
            pool.touch(hit)
        self.current = (req.tenant, req.priority)
        queue = self.queue
        if queue is not None and queue.kvgov_quotas:
            queue.kvgov_allocating = queue.kvgov_group(req.tenant)
        new = pool.get_new_blocks(len(hashes) - len(hit))
        if queue is not None:
            queue.kvgov_allocating = 0
        if self.governed:
            scope = self.scopes.get(req.tenant)
            if scope is None:
                scope = self.scopes[req.tenant] = SimpleNamespace(tenant=req.tenant)
            for b in new:
                self.owners[b.block_id] = scope
        blocks = hit + new
        r = SimpleNamespace(block_hashes=hashes, all_token_ids=(), lora_request=None)
        pool.cache_full_blocks(r, blocks, len(hit), len(blocks), BS, 0)
        pool.free_blocks(blocks[::-1])
        if self.governed:  # what the binding's drain and the next step take
            pool.kvgov_events.clear()
            pool.kvgov_zero.clear()
            pool.kvgov_zero_owners.clear()
            pool.kvgov_open_free = None
        return len(hit)


def hit_rate(mode: str, stream: list[Request], num_blocks: int, prio: bool) -> float:
    quotas = {"flood": Quota(cap=num_blocks // 4)} if mode == "kvgov cap" else None
    d = Driver(mode, num_blocks, quotas)
    hits = total = 0
    for req in stream:
        if not prio:
            req = Request(req.tenant, 50, req.hashes, req.counted)
        h = d.run(req)
        if req.counted:
            hits += h
            total += len(req.hashes)
    return hits / total if total else 0.0


#: the noisy neighbour on vLLM's pool: (label, driver mode, A floods, quotas)
NOISY_MODES = (
    ("no flood (stock)", "vllm stock", False, False),
    ("A floods, stock", "vllm stock", True, False),
    ("A floods, governed LRU", "kvgov", True, False),
    ("A floods, quotas", "kvgov", True, True),
)


def noisy_neighbour(steps: int) -> list[dict[str, object]]:
    """B's hit rate and blocks hit on vLLM's pool, stock and governed (NOISY_QUOTAS)."""
    rows: list[dict[str, object]] = []
    for label, mode, flood, quotas in NOISY_MODES:
        q = {t: Quota(floor=f, cap=c) for t, (f, c) in NOISY_QUOTAS.items()} if quotas else None
        d = Driver(mode, NOISY_BLOCKS, q)
        hits = total = 0
        for req in noisy_stream(steps, flood):
            h = d.run(req)
            if req.counted:
                hits += h
                total += len(req.hashes)
        rows.append({"section": "noisy", "mode": label, "hit_rate": hits / total, "hits": hits})
    return rows


COST_MODES = ("stock", "lru", "priority", "quotas")


def cost_driver(mode: str, n: int, ops: int) -> tuple[Driver, list[Request]]:
    """A full pool of ``n`` blocks (every later request evicts 8) and ``ops`` requests."""
    quotas = {f"t{t}": Quota(floor=64, cap=2048) for t in range(8)} if mode == "quotas" else None
    d = Driver("vllm stock" if mode == "stock" else "kvgov", n, quotas)
    prios = (50,) if mode in ("stock", "lru") else (10, 50, 90)
    fill = n // 8 + 64
    reqs = [
        Request(f"t{i % 8}", prios[i % len(prios)], [f"k{i}-{j}".encode() for j in range(8)], True)
        for i in range(fill + ops)
    ]
    for r in reqs[:fill]:
        d.run(r)
    return d, reqs[fill:]


def cost(ops: int, rounds: int) -> dict[str, list[float]]:
    """CPU µs per request of 8 new blocks on a full pool (each evicts 8), cache and free,
    per mode, measured in interleaved rounds (pairs: a slow spell slows every mode of
    its round). CPU time of this process, so other processes' load does not count."""
    per = ops // rounds
    drivers = {m: cost_driver(m, 4096, per * rounds) for m in COST_MODES}
    out: dict[str, list[float]] = {m: [] for m in COST_MODES}
    for r in range(rounds):
        order = COST_MODES if r % 2 == 0 else COST_MODES[::-1]
        for m in order:
            d, reqs = drivers[m]
            chunk = reqs[r * per : (r + 1) * per]
            start = time.process_time()
            for q in chunk:
                d.run(q)
            out[m].append((time.process_time() - start) / per * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import vllm

    print(json.dumps({"vllm": vllm.__version__}), flush=True)
    for name, (stream, blocks) in durable_streams(args.quick).items():
        for mode, prio in (
            ("vllm stock", False),
            ("kvgov lru", False),
            ("kvgov priority", True),
            ("kvgov cap", False),
        ):
            rate = hit_rate(mode if mode != "kvgov lru" else "kvgov", stream, blocks, prio)
            row = {"section": "durable", "stream": name, "mode": mode, "hit_rate": rate}
            print(json.dumps(row), flush=True)
    for row in noisy_neighbour(200 if args.quick else 1000):
        print(json.dumps(row), flush=True)
    rounds = 10 if args.quick else 30
    times = cost(200 * rounds, rounds)
    print(json.dumps({"section": "cost", "times": times}), flush=True)


if __name__ == "__main__":
    main()
