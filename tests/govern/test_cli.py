"""The kvgov command: capacity planning and error handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.cli.main import main


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_capacity_from_flags() -> None:
    """Bytes per token and blocks follow from the layout; fp8 halves bytes and doubles blocks."""
    code, out = _run(
        "capacity",
        "--layers",
        "32",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--memory",
        "40GiB",
        "--context",
        "4096",
        "--json",
    )
    assert code == 0, out
    rows = {r["variant"]: r for r in json.loads(out)["rows"]}
    given = rows["as given"]
    assert given["bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    assert given["blocks"] == 40 * 2**30 // (given["bytes_per_token"] * 16)
    assert given["concurrent_sequences"] == given["blocks"] // 256
    assert rows["fp8 KV"]["blocks"] == 2 * given["blocks"]
    assert rows["block 32"]["tokens"] == given["tokens"]


def test_capacity_from_hf_config(tmp_path: Path) -> None:
    """A Hugging Face config.json gives the same answer as the equivalent flags."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
                "torch_dtype": "bfloat16",
            }
        )
    )
    code, out = _run(
        "capacity", "--config", str(config), "--memory", "40GiB", "--context", "4096", "--json"
    )
    assert code == 0, out
    assert json.loads(out)["rows"][0]["bytes_per_token"] == 131072


@pytest.mark.parametrize(
    "args",
    [
        ["--layers", "0", "--kv-heads", "8", "--head-dim", "128", "--memory", "1GiB"],
        ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--memory", "-1GiB"],
        ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--memory", "lots"],
        [
            "--layers",
            "32",
            "--kv-heads",
            "8",
            "--head-dim",
            "128",
            "--memory",
            "1GiB",
            "--dtype",
            "float7",
        ],
        ["--layers", "32", "--memory", "1GiB"],
    ],
    ids=["zero-layers", "negative-memory", "bad-memory", "bad-dtype", "missing-dims"],
)
def test_capacity_refuses_nonsense(args: list[str]) -> None:
    """Nonsense inputs exit non-zero with a message, never a traceback."""
    result = CliRunner().invoke(main, ["capacity", *args, "--context", "4096"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.output.strip()


def test_capacity_refuses_zero_context() -> None:
    """A mean context of zero tokens is refused."""
    code, out = _run(
        "capacity",
        "--layers",
        "1",
        "--kv-heads",
        "1",
        "--head-dim",
        "8",
        "--memory",
        "1MiB",
        "--context",
        "0",
    )
    assert code != 0 and "mean_context" in out


def test_every_subcommand_has_help() -> None:
    """The command tree loads: every group and command answers --help."""
    for args in (
        ["--help"],
        ["demo", "--help"],
        ["replay", "--help"],
        ["capacity", "--help"],
        ["policy", "--help"],
        ["audit", "--help"],
        ["db", "--help"],
    ):
        code, out = _run(*args)
        assert code == 0 and "Usage" in out


def test_capacity_in_a_pipe_prints_full_values_and_takes_format() -> None:
    """Not a terminal: tab-separated lines, no value cut with `…`; --format csv and jsonl."""
    flags = ["capacity", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
             "--memory", "40GiB", "--context", "4096"]  # fmt: skip
    code, out = _run(*flags)
    assert code == 0 and "…" not in out
    header, first = out.splitlines()[:2]
    assert header.split("\t")[:3] == ["variant", "dtype", "block"]
    assert first.split("\t") == ["as given", "float16", "16", "131,072", "2,097,152",
                                 "20,480", "327,680", "80"]  # fmt: skip
    code, out = _run(*flags, "--format", "csv")
    assert code == 0 and out.splitlines()[1] == "as given,float16,16,131072,2097152,20480,327680,80"
    code, out = _run(*flags, "--format", "jsonl")
    assert code == 0 and json.loads(out.splitlines()[0])["bytes_per_block"] == 2_097_152
