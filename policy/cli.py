"""`kvgov policy ...` commands: run the bundle's Rego tests, evaluate one rule.

``kvgov policy test [DIR]`` runs every ``test_`` rule of the bundle (the bundled
one by default), prints pass / fail per test and a summary, and exits 1 on any
failure (2 when the bundle does not load).

``kvgov policy eval RULE --input FILE|JSON [--data FILE] [--bundle DIR]`` prints
the decision as JSON and exits 0, or 1 when the decision failed closed with an
error (2 when the bundle does not load).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvgov.exceptions import PolicyLoadError
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.testing import run_tests

__all__ = ["policy_group"]

policy_group = click.Group("policy", help="Test and evaluate the Rego policy bundle.")


@policy_group.command("test")
@click.argument(
    "directory", required=False, type=click.Path(file_okay=False, path_type=Path), default=None
)
@click.option("--quiet", "-q", is_flag=True, help="Print failures and the summary only.")
def test_command(directory: Path | None, quiet: bool) -> None:
    """Run every test_ rule of the bundle in DIRECTORY (default: the bundled policy)."""
    console = Console(highlight=False)
    try:
        report = run_tests(directory)
    except PolicyLoadError as exc:
        console.print(f"[bold red]bundle does not load:[/] {exc}")
        raise click.exceptions.Exit(2) from None
    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("result")
    table.add_column("test")
    table.add_column("detail")
    table.add_column("µs", justify="right")
    for r in report.results:
        if quiet and r.passed:
            continue
        mark = "[green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
        table.add_row(mark, r.qualified_name, r.detail, f"{r.seconds * 1e6:.0f}")
    if table.row_count:
        console.print(table)
    failed = len(report.failures)
    passed = len(report.results) - failed
    if not report.results:
        console.print("[bold red]no test_ rules found[/] (a bundle must test itself)")
    colour = "green" if report.passed else "bold red"
    console.print(f"[{colour}]{passed} passed, {failed} failed[/]")
    if not report.passed:
        raise click.exceptions.Exit(1)


def _json_argument(value: str, what: str) -> Any:
    """Parse ``value`` as a path to a JSON file, ``-`` for stdin, or inline JSON."""
    text = value
    if value == "-":
        text = sys.stdin.read()
    else:
        path = Path(value)
        if not value.lstrip().startswith(("{", "[")) and path.is_file():
            text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        message = f"not a JSON file nor inline JSON: {exc}"
        raise click.BadParameter(message, param_hint=what) from None


@policy_group.command("eval")
@click.argument("rule")
@click.option(
    "--input", "input_", required=True, help="Policy input: a JSON file, inline JSON, or '-'."
)
@click.option(
    "--data",
    "data_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A JSON file deep-merged over the bundle's data.json.",
)
@click.option(
    "--bundle",
    "bundle_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The bundle directory (default: the bundled policy).",
)
def eval_command(rule: str, input_: str, data_file: Path | None, bundle_dir: Path | None) -> None:
    """Evaluate RULE (e.g. kvgov/admission/decision) and print the decision as JSON."""
    policy_input = _json_argument(input_, "--input")
    if not isinstance(policy_input, dict):
        raise click.BadParameter("the input must be a JSON object", param_hint="--input")
    data = _json_argument(str(data_file), "--data") if data_file is not None else None
    if data is not None and not isinstance(data, dict):
        raise click.BadParameter("the data must be a JSON object", param_hint="--data")
    try:
        engine = EmbeddedEngine(bundle_dir, data, run_tests=False)
    except PolicyLoadError as exc:
        click.echo(f"bundle does not load: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    try:
        decision = engine.evaluate(rule, policy_input)
    finally:
        engine.close()
    click.echo(json.dumps(dataclasses.asdict(decision), indent=2, sort_keys=True))
    if decision.error is not None:
        raise click.exceptions.Exit(1)
