"""Options and output every ``kvgov audit`` / ``kvgov db`` command shares."""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvgov.defaults import AUDIT_URL, AUDIT_URL_ENV

__all__ = [
    "FORMATS",
    "allow_empty_option",
    "default_url",
    "emit_records",
    "format_options",
    "print_table",
    "url_option",
]


def default_url() -> str:
    """The audit database URL when ``--url`` is not given.

    Returns:
        ``$KVGOV_AUDIT_URL``, else :data:`kvgov.defaults.AUDIT_URL`.
    """
    return os.environ.get(AUDIT_URL_ENV) or AUDIT_URL


#: ``--url URL`` (default: ``$KVGOV_AUDIT_URL`` or ``sqlite:///kvgov-audit.db``).
url_option = click.option(
    "--url",
    default=None,
    metavar="URL",
    help=f"Audit database URL [default: ${AUDIT_URL_ENV} or {AUDIT_URL}].",
)

#: ``--allow-empty``: a trail with no events is a result, not an error (exit 1 otherwise).
allow_empty_option = click.option(
    "--allow-empty",
    is_flag=True,
    help="Accept a trail that holds no events (otherwise an error, exit 1). A database "
    "that does not exist is always an error: readers create none.",
)

#: The output formats of every command that prints records.
FORMATS: Final = ("text", "json", "jsonl", "csv")

Cell = str | Text


def format_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--format text|json|jsonl|csv`` (and ``--json`` / ``--csv`` as its shorthands).

    The command receives ``fmt``, one of :data:`FORMATS` (default ``text``).
    """

    @functools.wraps(f)
    def run(*args: Any, fmt: str | None, as_json: bool, as_csv: bool, **kwargs: Any) -> Any:
        chosen = {x for x, on in (("json", as_json), ("csv", as_csv)) if on}
        if fmt is not None:
            chosen.add(fmt)
        if len(chosen) > 1:
            raise click.UsageError("give one output format: --format, --json or --csv")
        return f(*args, fmt=chosen.pop() if chosen else "text", **kwargs)

    run = click.option("--csv", "as_csv", is_flag=True, help="Same as --format csv.")(run)
    run = click.option("--json", "as_json", is_flag=True, help="Same as --format json.")(run)
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default=None,
        help="text: a table on a terminal, else tab-separated lines with full values; "
        "json: an array; jsonl: one object a line; csv [default: text].",
    )(run)


def _plain(cell: Cell) -> str:
    text = cell.plain if isinstance(cell, Text) else cell
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Cell]],
    *,
    right: Sequence[str] = (),
    console: Console | None = None,
) -> None:
    """Print rows as a rich table on a terminal, else as full values, tab-separated.

    A rich table fits the terminal by cutting values short (``…``), which a script
    reading a pipe must never see: there, a header line and one line per row, cells
    separated by tabs (tabs, newlines and backslashes in values escaped as ``\\t``,
    ``\\n``, ``\\\\``), markup dropped.

    Args:
        title: the table's title (terminal only).
        columns: column names.
        rows: the cells; a plain ``str`` is shown as is (never read as markup), a
            rich ``Text`` keeps its style on a terminal.
        right: columns to right-align (terminal only).
        console: where to print (its file, and whether that is a terminal); None:
            standard output.
    """
    terminal = sys.stdout.isatty() if console is None else console.is_terminal
    if not terminal:
        for line in (columns, *rows):  # written as is: rich would expand the tabs
            text = "\t".join(_plain(c) for c in line)
            if console is None:
                click.echo(text)
            else:
                console.file.write(text + "\n")
        return
    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right" if c in right else "left")
    for row in rows:
        table.add_row(*(c if isinstance(c, Text) else Text(c) for c in row))
    (console or Console()).print(table)


def emit_records(
    fmt: str,
    records: Sequence[Mapping[str, Any]],
    title: str,
    columns: Sequence[str],
    cells: Callable[[int], Sequence[Cell]],
    *,
    csv_fields: Sequence[str] | None = None,
    csv_row: Callable[[int], Sequence[Any]] | None = None,
    right: Sequence[str] = (),
) -> None:
    """Print records in one of :data:`FORMATS`.

    Args:
        fmt: the format.
        records: the records as JSON-able dicts (``json``, ``jsonl``).
        title: the table title (``text`` on a terminal).
        columns: the columns of ``text`` (and of ``csv`` without ``csv_fields``).
        cells: the ``text`` cells of record ``i``.
        csv_fields: the ``csv`` header, when it differs from ``columns``.
        csv_row: the ``csv`` cells of record ``i`` (with ``csv_fields``).
        right: ``text`` columns to right-align on a terminal.
    """
    if fmt == "json":
        click.echo(json.dumps(list(records), indent=2))
    elif fmt == "jsonl":
        for r in records:
            click.echo(json.dumps(r))
    elif fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(csv_fields if csv_fields is not None else columns)
        for i in range(len(records)):
            row = csv_row(i) if csv_row is not None else cells(i)
            w.writerow([c.plain if isinstance(c, Text) else c for c in row])
        click.echo(out.getvalue(), nl=False)
    else:
        print_table(title, columns, (cells(i) for i in range(len(records))), right=right)
