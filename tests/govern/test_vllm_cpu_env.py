"""benchmarks/vllm_cpu_env.py and bench_vllm_e2e.py without vLLM: the commands, the workload.

What make test-vllm-e2e, make vllm-demo and the real-engine benchmark start is checked here
cheaply; the engines themselves run in make test-vllm-e2e.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvgov.govern import GovernedKVCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_vllm_e2e
import vllm_cpu_env


def _server(governed: bool, **kwargs: object) -> vllm_cpu_env.Server:
    return vllm_cpu_env.Server(
        "s", Path("/py"), Path("/model"), Path("/log"), governed=governed, **kwargs
    )


def test_a_governed_server_names_the_governed_scheduler_and_its_settings() -> None:
    cmd = _server(True, kvgov={"audit_url": "sqlite:///a.db"}).command()
    assert cmd[cmd.index("--scheduler-cls") + 1] == "kvgov.govern.vllm.GovernedScheduler"
    config = json.loads(cmd[cmd.index("--additional-config") + 1])
    assert config == {"kvgov": {"audit_url": "sqlite:///a.db"}}
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details"):
        assert flag in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert "VLLM_PLUGINS" not in vllm_cpu_env.engine_env(True, {})


def test_a_stock_server_runs_without_kvgov() -> None:
    """The control must be stock vLLM: no governed scheduler, and kvgov's plugin excluded
    (it forces KV zeroing in every engine of its environment)."""
    cmd = _server(False).command()
    assert "--scheduler-cls" not in cmd and "--additional-config" not in cmd
    assert vllm_cpu_env.engine_env(False, {})["VLLM_PLUGINS"] == "none"


def test_the_kv_probe_needs_vllms_development_endpoints() -> None:
    server = _server(False, kv_probe=True)
    cmd = server.command()
    assert cmd[cmd.index("--worker-extension-cls") + 1] == "vllm_kv_probe.KvProbe"
    assert "--worker-extension-cls" not in _server(False).command()
    with pytest.raises(AssertionError, match="kv_probe=True"):
        _server(False).kv_state()


def test_prompts_are_reproducible_and_distinct() -> None:
    assert vllm_cpu_env.prompt("a", 50) == vllm_cpu_env.prompt("a", 50)
    assert vllm_cpu_env.prompt("a", 50) != vllm_cpu_env.prompt("b", 50)
    assert len(vllm_cpu_env.prompt("a", 50).split()) == 50


def test_the_benchmark_workload_shares_system_prompts_across_tenants() -> None:
    work = bench_vllm_e2e.workload(40)
    assert len(work) == 40
    assert {t for t, _ in work} == set(bench_vllm_e2e.TENANTS)
    systems = {s for _, p in work for s in bench_vllm_e2e.SYSTEM_PROMPTS if p.startswith(s)}
    assert systems == set(bench_vllm_e2e.SYSTEM_PROMPTS)
    for system in bench_vllm_e2e.SYSTEM_PROMPTS:  # each shared by every tenant
        assert {t for t, p in work if p.startswith(system)} == set(bench_vllm_e2e.TENANTS)
    assert len({p for _, p in work}) == 40, "every request its own question"


def test_each_part_is_preceded_by_a_burst_that_shares_nothing_with_the_workload() -> None:
    work = [p for _, p in bench_vllm_e2e.workload(400)]
    bursts = [bench_vllm_e2e.rewarm(part) for part in range(bench_vllm_e2e.TURNS)]
    for burst in bursts:  # one request a client, a tenant each
        assert len(burst) == bench_vllm_e2e.CONCURRENCY
        assert {t for t, _ in burst} == set(bench_vllm_e2e.TENANTS)
    prompts = [p for burst in bursts for _, p in burst]
    assert len(set(prompts)) == len(prompts), "no burst reuses another's prompt"
    # no common first word with the workload: no prefix block of it is cached or reused
    firsts = {p.split()[0] for p in work} | {s.split()[0] for s in bench_vllm_e2e.SYSTEM_PROMPTS}
    assert not {p.split()[0] for p in prompts} & firsts
    assert bench_vllm_e2e.rewarm(1) == bursts[1], "the same burst for the same part"


def test_the_report_computes_rates_and_hit_rates(capsys: pytest.CaptureFixture[str]) -> None:
    results = [
        bench_vllm_e2e.Result("bank", 0.1, 100, 50, 8),
        bench_vllm_e2e.Result("bank", 0.3, 100, 100, 8),
        bench_vllm_e2e.Result("clinic", 0.2, 100, 0, 8),
    ]
    figures = bench_vllm_e2e.report("x", 2.0, results)
    assert figures["rps"] == pytest.approx(1.5)
    assert figures["tok_s"] == pytest.approx(12.0)
    assert figures["ttft_p50_ms"] == pytest.approx(200.0)
    assert figures["ttft_p99_ms"] == pytest.approx(300.0)
    out = capsys.readouterr().out
    assert "bank 75%, clinic 0%" in out
    # the tail names its requests: the slowest first, with what was cached
    assert "slowest TTFT: 300 ms (part -1 #-1, bank, 100/100 cached)" in out


def test_the_tail_net_of_isolation_leaves_out_what_only_stock_reused() -> None:
    def r(tenant: str, ttft: float, cached: int, index: int) -> bench_vllm_e2e.Result:
        return bench_vllm_e2e.Result(tenant, ttft, 160, cached, 8, part=0, index=index)

    stock = [r("bank", 0.5, 0, 0), r("clinic", 0.2, 128, 1), r("bank", 0.1, 128, 2)]
    # governed: the clinic's first request cannot reuse the bank's prompt, so it is cold
    governed = [r("bank", 0.5, 0, 0), r("clinic", 0.9, 0, 1), r("bank", 0.1, 128, 2)]
    missed, net = bench_vllm_e2e.like_for_like(stock, governed)
    assert missed == 1
    assert net["governed"]["ttft_p99_ms"] == pytest.approx(500.0)  # the 0.9 s one left out
    assert net["stock"]["ttft_p99_ms"] == pytest.approx(500.0)
    assert net["governed"]["ttft_p50_ms"] == pytest.approx(300.0)


def test_every_part_runs_through_every_side_and_every_side_takes_every_place() -> None:
    parts = bench_vllm_e2e.TURNS
    order = bench_vllm_e2e.turn_order(parts)
    sides = len(bench_vllm_e2e.SIDES)
    assert len(order) == parts * sides
    for part in range(parts):
        assert sorted(i for j, i in order if j == part) == list(range(sides))
    for place in range(sides):  # each side first, second and third equally often
        at = [order[j * sides + place][1] for j in range(parts)]
        assert sorted(at) == sorted(list(range(sides)) * (parts // sides)), place
    assert [j for j, _ in order] == sorted(j for j, _ in order)  # a part ends before the next
    # no server runs two turns back to back: each starts every turn from idle
    assert all(a[1] != b[1] for a, b in itertools.pairwise(order))
    assert order[-1][1] != order[0][1]  # nor across a longer run's repetition


class _Stream:
    """What the openai client answers a streamed completion: one text chunk, then usage."""

    def __init__(self) -> None:
        self.kwargs: dict[str, object] = {}
        self.completions = self

    def create(self, **kwargs: object) -> list[object]:
        from types import SimpleNamespace as NS

        self.kwargs = kwargs
        usage = NS(prompt_tokens=160, completion_tokens=8, prompt_tokens_details=None)
        return [NS(choices=[NS(text="a")], usage=None), NS(choices=[], usage=usage)]


def test_the_salted_side_isolates_tenants_with_vllms_cache_salt() -> None:
    """stock-salted: a stock server, each tenant's requests salted with its name."""
    assert ("stock-salted", False, True) in bench_vllm_e2e.SIDES
    client = _Stream()
    result = bench_vllm_e2e._one(client, "bank", "text", b"k" * 32, salt="bank")
    body = client.kwargs["extra_body"]
    assert isinstance(body, dict) and body["cache_salt"] == "bank"
    assert (result.prompt_tokens, result.cached_tokens, result.output_tokens) == (160, 0, 8)
    bench_vllm_e2e._one(client, "bank", "text", b"k" * 32)
    body = client.kwargs["extra_body"]
    assert isinstance(body, dict) and "cache_salt" not in body  # stock and governed share


@pytest.mark.parametrize(
    ("salting", "salts"),
    [("tenant", ["bank", "clinic"]), ("one", ["one-salt", "one-salt"]), ("none", [None, None])],
)
def test_the_third_servers_salting_is_per_tenant_one_for_all_or_none(
    salting: str, salts: list[str | None]
) -> None:
    """The third server's controls: a salt per tenant (isolation), one salt for every
    tenant (``--one-salt-control``: the field, nothing isolated), none (A/A)."""
    clients = bench_vllm_e2e.Clients(_server(False), b"k" * 32, salting=salting)
    try:
        stream = _Stream()
        clients.local.client = stream
        sent = []
        for item in bench_vllm_e2e.workload(2):
            clients._send(item)
            body = stream.kwargs["extra_body"]
            assert isinstance(body, dict)
            sent.append(body.get("cache_salt"))
        assert sent == salts
    finally:
        clients.close()


def test_an_unknown_salting_is_refused() -> None:
    with pytest.raises(ValueError, match="salting 'tenants'"):
        bench_vllm_e2e.Clients(_server(False), b"k" * 32, salting="tenants")


def test_the_sharing_options_share_group_lets_every_tenant_reuse_public_blocks_only(
    make_cache: Callable[..., GovernedKVCache],
) -> None:
    """``--sharing``'s policy data: a public prompt one tenant cached is reused by every
    other tenant of the benchmark; an internal one by none. With ``prefix``, the system
    prompt's public blocks only."""
    from .conftest import fill, make_scope

    cache = make_cache(policy_data=bench_vllm_e2e.SHARE_GROUP)
    tokens = list(range(100, 117))  # 4 full blocks of 4, and one token
    for label in ("public", "internal"):
        first, *others = bench_vllm_e2e.TENANTS
        adm = cache.admit(f"{label}-0", make_scope(tenant=first, classification=label), tokens)
        fill(cache, adm.block_ids)
        cache.release(f"{label}-0")
        for i, tenant in enumerate(others, 1):
            scope = make_scope(tenant=tenant, classification=label)
            adm = cache.admit(f"{label}-{i}", scope, tokens)
            assert adm.cached_tokens == (16 if label == "public" else 0), (label, tenant)
            fill(cache, adm.block_ids)
            cache.release(f"{label}-{i}")
    # --sharing prefix: internal requests whose first 8 tokens (2 blocks) are public
    first, *others = bench_vllm_e2e.TENANTS
    scope = make_scope(tenant=first)
    adm = cache.admit("prefix-0", scope, tokens, public_prefix_tokens=8)
    fill(cache, adm.block_ids)
    cache.release("prefix-0")
    for i, tenant in enumerate(others, 1):
        scope = make_scope(tenant=tenant)
        adm = cache.admit(f"prefix-{i}", scope, tokens, public_prefix_tokens=8)
        assert adm.cached_tokens == 8, tenant
        fill(cache, adm.block_ids)
        cache.release(f"prefix-{i}")


def test_the_prefix_option_signs_the_system_prompts_whole_blocks() -> None:
    """What ``--sharing prefix`` declares public is whole blocks of the system prompt."""
    assert bench_vllm_e2e.SYSTEM_PROMPT_BLOCKS_TOKENS % vllm_cpu_env.BLOCK_SIZE == 0
    for system in bench_vllm_e2e.SYSTEM_PROMPTS:  # one token a word (the tiny tokenizer)
        assert len(system.split()) >= bench_vllm_e2e.SYSTEM_PROMPT_BLOCKS_TOKENS


def test_the_prefix_option_declares_the_system_prompt_of_workload_requests_only() -> None:
    """``--sharing prefix``: a workload request's token signs its system prompt's public
    prefix; the warm-up and burst prompts (no system prompt) declare none."""
    clients = bench_vllm_e2e.Clients(
        _server(True), b"k" * 32, public_prefix=bench_vllm_e2e.SYSTEM_PROMPT_BLOCKS_TOKENS
    )
    try:
        stream = _Stream()
        clients.local.client = stream
        work = bench_vllm_e2e.workload(2)[0]
        for item, prefix in ((work, 128), (bench_vllm_e2e.rewarm(0)[0], None)):
            clients._send(item)
            body = stream.kwargs["extra_body"]
            assert isinstance(body, dict)
            xargs = body["vllm_xargs"]
            assert xargs.get("kvgov_public_prefix_tokens") == prefix
            assert xargs["kvgov_scope_token"].startswith("v2." if prefix else "v1.")
    finally:
        clients.close()


def test_a_servers_cpu_is_summed_over_its_process_tree_by_name() -> None:
    """``proc_cpu.tree_cpu``: a parent and the child it spawned, each counted; the tree's
    CPU grows while the child spins; a process gone reads as nothing."""
    import subprocess
    import time

    import proc_cpu

    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(proc_cpu._children(parent.pid)) < 1:
            time.sleep(0.02)
        assert len(proc_cpu._children(parent.pid)) == 1, "the child started"
        before = proc_cpu.tree_cpu(parent.pid)
        grown = 0.0
        while time.monotonic() < deadline and grown < 0.2:
            time.sleep(0.05)
            grown = sum(proc_cpu.cpu_delta(before, proc_cpu.tree_cpu(parent.pid)).values())
        assert grown >= 0.2, before
        child = proc_cpu._children(parent.pid)[0]
        assert proc_cpu.process_cpu(child) >= 0.2 - proc_cpu.process_cpu(parent.pid)
    finally:
        import os
        import signal

        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert proc_cpu.tree_cpu(parent.pid) == {}  # gone: nothing to read
    assert proc_cpu.process_cpu(None) == 0.0
    assert proc_cpu.cpu_delta({"a": 1.0}, {"a": 1.5, "b": 0.25}) == {"a": 0.5, "b": 0.25}
