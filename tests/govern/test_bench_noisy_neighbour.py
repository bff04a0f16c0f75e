"""benchmarks/bench_noisy_neighbour_e2e.py without an engine: its arguments, its workload,
the policy data it gives the governed servers, and its report.

The real engines run only when the benchmark itself runs (docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_noisy_neighbour_e2e as bench
from bench_vllm_e2e import Result
from vllm_cpu_env import BLOCK_SIZE

from kvgov.govern.quotas import resolve
from kvgov.policy import PolicyClient


def test_the_full_run_and_the_quick_run_are_sound_scenarios() -> None:
    _, full = bench.parse_args([])
    assert full.variants == ("stock", "cap", "floor") and full.rounds == 8
    assert bench.problems(full) == []
    _, quick = bench.parse_args(["--quick"])
    assert quick.variants == ("stock", "cap")
    assert (quick.rounds, quick.num_blocks, quick.flood_per_round, quick.flood_concurrency) == (
        2,
        64,
        5,
        1,
    )
    assert bench.problems(dataclasses.replace(quick, variants=bench.VARIANTS)) == []
    _, some = bench.parse_args(["--quick", "--variants", "stock,governed", "--rounds", "4"])
    assert some.variants == ("stock", "governed") and some.rounds == 4
    assert some.num_blocks == 64  # the quick run's, where no option says otherwise


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rounds", "1"], "rounds must be >= 2"),
        (["--flood-per-round", "2"], "nothing is flooded out"),
        (["--variants", "stock,lru"], "variants must be distinct"),
        (["--variants", "stock,stock"], "variants must be distinct"),
        (["--cap-blocks", "90"], "cap: the flooder's cap"),
        (["--floor-blocks", "12"], "do not hold the victim's 18"),
        (["--floor-blocks", "100"], "floor: the victim's floor"),
    ],
)
def test_a_scenario_that_cannot_show_a_flood_is_refused(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any engine starts: a flood smaller than the pool evicts nothing under
    stock, and quotas can only govern cached blocks, never the running ones."""
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_the_victim_reuses_one_prefix_a_phase_and_the_flooder_never_repeats() -> None:
    s = bench.Scenario()
    prefixes: dict[str, set[str]] = {}
    floods: list[str] = []
    for phase in bench.PHASES:
        for r in range(s.rounds):
            flood, victim = bench.round_requests(s, phase, r)
            assert len(flood) == (s.flood_per_round if phase == "flood" else 0)
            assert {t for t, _ in flood} <= {bench.FLOODER}
            assert [t for t, _ in victim] == [bench.VICTIM] * s.victim_prompts
            floods += [text for _, text in flood]
            for _, text in victim:
                words = text.split()
                assert len(words) == s.prefix_tokens + s.question_tokens
                prefixes.setdefault(phase, set()).add(" ".join(words[: s.prefix_tokens]))
            assert len({text for _, text in victim}) == s.victim_prompts
    # the same system prompts every round of a phase, other ones in the other phase
    assert all(len(p) == s.victim_prompts for p in prefixes.values())
    assert not prefixes["no flood"] & prefixes["flood"]
    # one-off flood prompts, none sharing even a first block with another or the victim's
    first = [" ".join(t.split()[:BLOCK_SIZE]) for t in floods]
    assert len(set(first)) == len(floods) == s.rounds * s.flood_per_round
    victims = {" ".join(p.split()[:BLOCK_SIZE]) for ps in prefixes.values() for p in ps}
    assert not victims & set(first)
    assert all(len(t.split()) == s.flood_tokens for t in floods)


@pytest.mark.parametrize(
    ("variant", "tenant", "floor", "cap"),
    [("cap", bench.FLOODER, 0, 16), ("floor", bench.VICTIM, 24, None)],
)
def test_the_policy_data_is_what_the_governor_enforces(
    variant: str, tenant: str, floor: int, cap: int | None
) -> None:
    """The governed servers' data, read by the bundle's eviction rule as the binding does."""
    s = bench.Scenario()
    client = PolicyClient.create(policy_data=bench.policy_data(variant, s), run_tests=False)
    try:
        rules = resolve(client.eviction(), s.num_blocks, "r")
    finally:
        client.close()
    assert set(rules.quotas) == {tenant}
    assert (rules.quotas[tenant].floor, rules.quotas[tenant].cap) == (floor, cap)
    assert bench.policy_data("stock", s) is None
    assert bench.policy_data("governed", s) == {"kvgov": {"config": {"tenants": {}}}}


def test_servers_share_one_small_pool_and_only_the_governed_carry_a_policy(
    tmp_path: Path,
) -> None:
    s = bench.Scenario()
    stale = [tmp_path / f"cap-audit.db{end}" for end in ("", "-wal", "-shm")]
    for f in stale:  # a previous run's trail: a new one starts empty
        f.write_bytes(b"old")
    servers = bench.build_servers(s, Path("/py"), Path("/model"), tmp_path, "k" * 64)
    assert not any(f.exists() for f in stale)
    assert [x.name for x in servers] == list(s.variants)
    for server in servers:
        cmd = server.command()
        assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == str(s.num_blocks)
        if server.name == "stock":
            assert not server.governed and "--additional-config" not in cmd
            continue
        config = json.loads(cmd[cmd.index("--additional-config") + 1])["kvgov"]
        assert config["policy_data"] == bench.policy_data(server.name, s)
        assert config["require_scope_token"] is True
        assert "KVGOV_SCOPE_TOKEN_KEY" in server.env


def _result(tenant: str, cached: int, prompt: int = 224) -> Result:
    return Result(tenant, 0.01, prompt, cached, 8)


def test_the_report_counts_the_victim_only_and_says_the_gap() -> None:
    s = bench.Scenario(rounds=2, variants=("stock", "cap"))
    rows = []
    for variant, flooded in (("stock", 0), ("cap", 192)):
        rows += [(variant, "no flood", _result(bench.VICTIM, c)) for c in (0, 192)]
        rows += [(variant, "flood", _result(bench.VICTIM, c)) for c in (0, flooded)]
        rows += [(variant, "flood", _result(bench.FLOODER, 0, 448)) for _ in range(10)]
    figures = bench.summarise(rows)
    assert figures[("stock", "flood")].requests == 2
    assert figures[("cap", "no flood")].hit_rate == pytest.approx(192 / 448)
    text = "\n".join(
        bench.report(s, figures, {"cap": {bench.FLOODER: {"cap": 30}, bench.VICTIM: {}}})
    )
    assert "RESULT victim_hit_noflood_stock=0.4286" in text
    assert "RESULT victim_hit_flood_stock=0.0000" in text
    assert "RESULT victim_gap_pts_stock=-42.9" in text
    assert "RESULT victim_gap_pts_cap=0.0" in text
    assert "RESULT victim_cached_flood_cap=192" in text
    assert "cap: the victim under flood is within 5 points of no flood: met" in text
    assert "cap evictions (audit, blocks by reason): victim: none; flooder: cap 30" in text
    assert "1.00x" in text  # the victim's TTFT under flood against stock's
    assert "n/a" in "\n".join(bench.report(s, {k: v for k, v in figures.items() if k[0] == "cap"}))
    assert f"{s.victim_ceiling:.1%}" in text
    assert "RESULT victim_ttft_p50_flood_vs_stock_cap=1.000" in text
