"""Every kvgov command shown in README.md and docs/ is a real command with real options."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import click
import pytest

from kvgov.cli.main import main

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            match = re.match(r"^\s*\$ (kvgov .*)$", line)
            if match:
                found.append((doc.name, match.group(1)))
    return found


def test_the_docs_show_commands() -> None:
    """The docs do show kvgov commands (so the test below checks something)."""
    assert len(_commands()) >= 10


@pytest.mark.parametrize(("doc", "command"), _commands(), ids=lambda v: str(v)[:60])
def test_documented_command_parses(doc: str, command: str) -> None:
    """Each documented command resolves to a command whose options all exist."""
    lexer = shlex.shlex(command.split(" #")[0], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    # the kvgov command ends where the shell takes over: a redirection, a pipe, a list
    ends = [i for i, t in enumerate(tokens) if set(t) <= set("<>|&;")]
    args = tokens[1 : ends[0] if ends else None]
    try:
        _resolve(doc, command, args)
    except click.BadParameter as exc:
        # an example input file of the docs (request.json, a key file) need not exist here;
        # every other bad parameter is a documentation error
        assert "does not exist" in str(exc), f"{doc}: `{command}`: {exc}"


def _resolve(doc: str, command: str, args: list[str]) -> None:
    ctx = main.make_context("kvgov", list(args), resilient_parsing=False)
    group: click.Command = main
    while isinstance(group, click.Group) and _remaining(ctx):
        with warnings.catch_warnings():  # click 8.2 deprecates protected_args, 9 drops it
            warnings.simplefilter("ignore", DeprecationWarning)
            name, *rest = ctx.protected_args + ctx.args
        sub = group.get_command(ctx, name)
        assert sub is not None, f"{doc}: unknown command {name!r} in `{command}`"
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        group = sub


def _remaining(ctx: click.Context) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return [*ctx.protected_args, *ctx.args]
