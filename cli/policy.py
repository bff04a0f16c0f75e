"""`kvgov policy ...` commands: test the bundle on both engines, evaluate one rule,
compare two bundles, replay recorded decisions against a candidate.

``kvgov policy test [DIR] [--engine embedded|reference|both] [--coverage]
[--min-coverage PCT] [--format text|json] [--junit FILE]`` runs every ``test_``
rule of the bundle (the bundled one by default) on the embedded engine (regorus,
the default), on the reference engine (OPA itself) or on both, prints pass / fail
per test and a summary per engine (or one JSON object), with ``--coverage`` the
reference engine's line coverage of the policy modules, writes JUnit XML with
``--junit``, and exits 1 on any failure or coverage under ``--min-coverage`` (2
when the bundle does not load or the reference engine is not installed).

``kvgov policy eval RULE --input FILE|JSON [--data FILE] [--bundle DIR]
[--fail-on-deny]`` prints the decision as JSON and exits 0, or 1 when the decision
failed closed with an error, or with ``--fail-on-deny`` did not allow (2 when the
bundle does not load).

``kvgov policy diff OLD_DIR NEW_DIR`` and ``kvgov policy replay --candidate DIR
(--url URL | --decision-log FILE)`` print what would change (see
:mod:`kvgov.policy.review`); with ``--fail-on-change`` they exit 1 when anything
would.
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

from kvgov.exceptions import InternalError, PolicyError, PolicyLoadError
from kvgov.policy.client import PolicyClient
from kvgov.policy.diff import diff_bundles, generate_inputs
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.review import ReviewReport
from kvgov.policy.runner import run_tests
from kvgov.policy.testing import CoverageReport, RegoTestReport, junit_xml

__all__ = ["policy_group"]

policy_group = click.Group("policy", help="Test, evaluate, diff and replay the Rego policy bundle.")

_ENGINES = {
    "embedded": ("embedded",),
    "reference": ("reference",),
    "both": ("embedded", "reference"),
}
#: Console width when stdout is not a terminal: rows are never cut or wrapped.
_PIPE_WIDTH = 10_000
_ENGINE_TITLE = {"embedded": "embedded engine (regorus)", "reference": "reference engine (OPA)"}


def _print_tests(console: Console, report: RegoTestReport, quiet: bool) -> None:
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
    console.print(f"[{colour}]{passed} passed, {failed} failed[/] on the {report.engine} engine")


def _print_coverage(console: Console, coverage: CoverageReport) -> None:
    table = Table(title="coverage of the policy modules by their tests (OPA)", box=None)
    table.add_column("module")
    table.add_column("covered", justify="right")
    table.add_column("not covered", justify="right")
    table.add_column("%", justify="right")
    table.add_column("lines not covered")
    for f in coverage.files:
        lines = ", ".join(str(n) for n in sorted(f.not_covered))
        table.add_row(
            f.name, str(len(f.covered)), str(len(f.not_covered)), f"{f.percent:.1f}", lines
        )
    console.print(table)
    console.print(f"coverage: {coverage.percent:.1f}%")


@policy_group.command("test")
@click.argument(
    "directory", required=False, type=click.Path(file_okay=False, path_type=Path), default=None
)
@click.option("--quiet", "-q", is_flag=True, help="Print failures and the summary only.")
@click.option(
    "--engine",
    type=click.Choice(sorted(_ENGINES)),
    default="embedded",
    show_default=True,
    help="Run the tests on regorus (embedded), on OPA itself (reference), or on both.",
)
@click.option(
    "--coverage",
    is_flag=True,
    help="Print the line coverage of the policy modules (from the reference engine, "
    "which then runs too).",
)
@click.option(
    "--min-coverage",
    type=click.FloatRange(0, 100),
    default=None,
    metavar="PCT",
    help="Exit 1 when coverage is below PCT (implies --coverage).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object, a report per engine (see docs/policy.md).",
)
@click.option(
    "--junit",
    "junit",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write the results as JUnit XML (for CI) to FILE.",
)
def test_command(
    directory: Path | None,
    quiet: bool,
    engine: str,
    coverage: bool,
    min_coverage: float | None,
    fmt: str,
    junit: Path | None,
) -> None:
    """Run every test_ rule of the bundle in DIRECTORY (default: the bundled policy)."""
    as_text = fmt == "text"
    console = review_console()
    coverage = coverage or min_coverage is not None
    engines = _ENGINES[engine]
    if coverage and "reference" not in engines:
        engines = (*engines, "reference")
    ok = True
    reports: list[RegoTestReport] = []
    for name in engines:
        if as_text:
            console.print(f"[bold]== {_ENGINE_TITLE[name]}[/]")
        try:
            report = run_tests(directory, engine=name, coverage=coverage and name == "reference")
        except PolicyLoadError as exc:
            click.echo(f"bundle does not load: {exc}", err=not as_text)
            raise click.exceptions.Exit(2) from None
        except PolicyError as exc:
            click.echo(f"cannot run the {name} engine: {exc}", err=not as_text)
            raise click.exceptions.Exit(2) from None
        reports.append(report)
        if as_text:
            _print_tests(console, report, quiet)
        ok = ok and report.passed
        if report.coverage is not None:
            if as_text:
                _print_coverage(console, report.coverage)
            if min_coverage is not None and report.coverage.percent < min_coverage:
                if as_text:
                    console.print(f"[bold red]coverage is below {min_coverage:g}%[/]")
                ok = False
    if junit is not None:
        junit.write_text(junit_xml(reports), encoding="utf-8")
    if not as_text:
        out: dict[str, Any] = {"passed": ok, "min_coverage": min_coverage}
        out["engines"] = [r.to_dict() for r in reports]
        click.echo(json.dumps(out, indent=2))
    if not ok:
        raise click.exceptions.Exit(1)


def review_console() -> Console:
    """Rich output; in a pipe, wide enough that no name or detail is cut short."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=_PIPE_WIDTH, soft_wrap=True)


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
@click.option(
    "--fail-on-deny",
    is_flag=True,
    help="Exit 1 when the decision does not allow (a deny, an undefined rule).",
)
def eval_command(
    rule: str, input_: str, data_file: Path | None, bundle_dir: Path | None, fail_on_deny: bool
) -> None:
    """Evaluate RULE (e.g. kvgov/admission/decision) and print the decision as JSON.

    Exits 0 on any decision, allow or deny (1 when it failed closed with an error);
    with --fail-on-deny, exits 1 on a deny too.
    """
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
    if decision.error is not None or (fail_on_deny and not decision.allow):
        raise click.exceptions.Exit(1)


def read_policy_data(data_file: Path | None) -> dict[str, Any] | None:
    """The JSON object of ``--data`` (None without one); a bad file is a usage error."""
    data = _json_argument(str(data_file), "--data") if data_file is not None else None
    if data is not None and not isinstance(data, dict):
        raise click.BadParameter("the data must be a JSON object", param_hint="--data")
    return data


def open_policy_engine(
    directory: Path, data: dict[str, Any] | None, engine: str
) -> EmbeddedEngine | Any:
    """An engine over a bundle (tests not run: a review compares, it does not gate)."""
    try:
        if engine == "reference":
            from kvgov.policy.reference import ReferenceEngine

            return ReferenceEngine(directory, data, run_tests=False)
        return EmbeddedEngine(directory, data, run_tests=False)
    except PolicyLoadError as exc:
        click.echo(f"bundle {directory} does not load: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    except PolicyError as exc:
        click.echo(f"cannot run the {engine} engine: {exc}", err=True)
        raise click.exceptions.Exit(2) from None


def _brief(fields: Any) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in dict(fields).items())


def print_review(console: Console, report: ReviewReport, heading: str) -> None:
    """The counts of a review, its changes by kind, tenant and class, and a few examples."""
    colour = "bold red" if report.changed else "green"
    console.print(heading)
    console.print(
        f"[{colour}]{report.evaluated} decisions evaluated, {report.changed} would change[/]"
    )
    for reason, n in sorted(report.skipped.items()):
        console.print(f"skipped {n}: {reason}")
    if not report.changed:
        return
    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("change", "tenant", "classification"):
        table.add_column(column)
    table.add_column("count", justify="right")
    for row in report.to_dict()["counts"]:
        table.add_row(row["kind"], row["tenant"], row["classification"], str(row["count"]))
    console.print(table)
    for kind, changes in report.examples.items():
        console.print(f"[bold]{kind}[/], e.g.:")
        for c in changes:
            where = " ".join(x for x in (c.timestamp, c.decision_id) if x)
            console.print(
                f"  {where + ' ' if where else ''}{c.tenant or '?'} / {c.classification or '?'}: "
                f"{_brief(c.before.fields)} -> {_brief(c.after.fields)} ({c.after.reason})"
            )


def finish_review(report: ReviewReport, fail_on_change: bool) -> None:
    """Exit 1 when ``--fail-on-change`` is set and a decision would change."""
    if fail_on_change and report.changed:
        raise click.exceptions.Exit(1)


_engine_option = click.option(
    "--engine",
    type=click.Choice(["embedded", "reference"]),
    default="embedded",
    show_default=True,
    help="The engine evaluating the bundles.",
)
_data_option = click.option(
    "--data",
    "data_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A JSON file deep-merged over the data.json of every bundle (your policy_data).",
)


def review_options(f: Any) -> Any:
    """The options every review command takes (``diff``, ``replay``)."""
    f = click.option(
        "--fail-on-change", is_flag=True, help="Exit 1 when any decision would change."
    )(f)
    f = click.option(
        "--examples", type=click.IntRange(0), default=3, show_default=True,
        help="Changes shown per kind.",
    )(f)  # fmt: skip
    f = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")(f)
    return _data_option(_engine_option(f))


@policy_group.command("diff")
@click.argument("old_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("new_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@review_options
def diff_command(
    old_dir: Path,
    new_dir: Path,
    engine: str,
    data_file: Path | None,
    as_json: bool,
    examples: int,
    fail_on_change: bool,
) -> None:
    """Evaluate OLD_DIR and NEW_DIR on inputs generated from their configured tenants and
    classifications, and print the decisions that differ."""
    data = read_policy_data(data_file)
    old, new = open_policy_engine(old_dir, data, engine), open_policy_engine(new_dir, data, engine)
    try:
        if old.bundle is None or new.bundle is None:
            raise InternalError("an engine just opened has no bundle")
        inputs = generate_inputs(old.bundle.data, new.bundle.data)
        report = diff_bundles(PolicyClient(old), PolicyClient(new), inputs, max_examples=examples)
        revisions = {"old_revision": old.bundle_revision, "new_revision": new.bundle_revision}
    finally:
        old.close()
        new.close()
    if as_json:
        click.echo(json.dumps({**revisions, **report.to_dict()}, indent=2))
    else:
        heading = f"old {revisions['old_revision']} -> new {revisions['new_revision']}"
        print_review(review_console(), report, heading)
    finish_review(report, fail_on_change)
