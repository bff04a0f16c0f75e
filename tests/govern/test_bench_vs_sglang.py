"""benchmarks/bench_vs_sglang.py without SGLang: its rounds, its ratios, its arguments.

The caches themselves run when the benchmark runs (``make test-sglang``, in SGLang's venv).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_vs_sglang as bench


def test_every_round_runs_every_side_once_and_the_order_reverses_every_other_round() -> None:
    orders = bench.round_order(5)
    assert len(orders) == 5
    for r, order in enumerate(orders):
        assert sorted(order) == sorted(bench.SIDES)
        assert order == (list(bench.SIDES) if r % 2 == 0 else list(reversed(bench.SIDES)))
    assert bench.ROUNDS == 5


def test_the_ratio_is_taken_within_each_round() -> None:
    rounds = [
        {"governed": {"us_per_page": 6.0}, "unified": {"us_per_page": 3.0}},
        {"governed": {"us_per_page": 9.0}, "unified": {"us_per_page": 6.0}},
    ]
    assert bench.paired(rounds, "governed", "unified", "us_per_page") == [2.0, 1.5]


@pytest.mark.parametrize("argv", [["--requests", "0"], ["--rounds", "0"]])
def test_no_requests_or_no_rounds_is_refused(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_vs_sglang.py", *argv])
    with pytest.raises(SystemExit) as exc:
        bench.main()
    assert exc.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
