"""The fenced code blocks of README.md and docs/*.md, and what the docs test does with each.

A block's language says what it is. ``bash``, ``sh`` and ``shell`` blocks are scripts,
``console`` blocks are ``$ command`` lines (the other lines are the output shown, not
checked; a line ending in ``\\`` continues the command), ``python`` blocks are code: all
of these run. ``text`` (diagrams, formulas, synopses, output), ``json``, ``jsonc``,
``sql``, ``yaml`` and ``rego`` blocks are shown, not run. A fence without a language is an
error: every block says whether it is a command or an illustration.

A block that cannot run on a bare CI host carries a marker, an HTML comment on the line
right before its fence (invisible on GitHub)::

    <!-- docs-test: KIND reason -->

with KIND one of :data:`KINDS`. The reason is printed with the skip.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

SHELL = frozenset({"bash", "sh", "shell"})
CONSOLE = "console"
PYTHON = "python"
RUNNABLE = SHELL | {CONSOLE, PYTHON}
SHOWN = frozenset({"text", "json", "jsonc", "sql", "yaml", "rego"})

#: Marker kinds: what the block needs, and when it runs.
KINDS = {
    "server": "a deployment's PostgreSQL, Redis or OPA (db.internal, kv-cache.internal, "
    "opa.internal); runs against local stand-ins (tests/docs/standins.py), skipped only "
    "where 127.0.0.1's PostgreSQL or Redis is absent",
    "gpu": "a CUDA device; runs where torch sees one",
    "vllm": "a vLLM engine on a GPU host, or a server that runs until stopped; never run "
    "by the docs test (make test-vllm-e2e runs the same calls on a tiny model on the CPU, "
    "and the blocks whose reason names tests/govern/vllm/e2e/test_docs_blocks.py as written)",
    "sglang": "an SGLang server serving a model: no SGLang engine runs on a CPU-only "
    "machine (make test-sglang runs the radix caches and pools the block configures, "
    "with kvgov's backend, in SGLang's own venv); never run by the docs test",
    "ci": "a make target or installer that CI runs itself; never run from the docs test",
}

_FENCE = re.compile(r"^(\s*)```(.*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(\S+)\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a document."""

    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # a KINDS key, or None
    reason: str

    @property
    def name(self) -> str:
        """``file:line``, for test ids and messages."""
        return f"{self.doc.name}:{self.line}"

    @property
    def runnable(self) -> bool:
        """Whether the block is a command or code (it runs, unless a marker says otherwise)."""
        return self.lang in RUNNABLE


class DocFormatError(ValueError):
    """A fence without a language, an unknown language or marker, an unclosed fence."""


def parse(doc: Path) -> list[Block]:
    """Every fenced block of ``doc`` in order.

    Raises:
        DocFormatError: a block without a known language, an unknown or misplaced
            marker, or a fence left open.
    """
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if _MARKER.match(lines[i]) and not (i + 1 < len(lines) and _FENCE.match(lines[i + 1])):
                raise DocFormatError(f"{doc.name}:{i + 1}: a docs-test marker not before a fence")
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).strip()
        where = f"{doc.name}:{i + 1}"
        if not lang:
            raise DocFormatError(
                f"{where}: a fence without a language (use one of "
                f"{sorted(RUNNABLE | SHOWN)}: ```text for output and diagrams)"
            )
        if lang not in RUNNABLE | SHOWN:
            raise DocFormatError(f"{where}: unknown block language {lang!r}")
        marker, reason = None, ""
        mm = _MARKER.match(lines[i - 1]) if i > 0 else None
        if mm:
            marker, reason = mm.group(1), mm.group(2)
            if marker not in KINDS:
                raise DocFormatError(f"{where}: unknown docs-test marker {marker!r}")
            if lang not in RUNNABLE:
                raise DocFormatError(f"{where}: a docs-test marker on a {lang} block")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^{indent}```\s*$", lines[j]):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise DocFormatError(f"{where}: fence never closed")
        blocks.append(Block(doc, i + 1, lang, "\n".join(body) + "\n", marker, reason))
        i = j + 1
    return blocks


def console_commands(code: str) -> list[str]:
    """The ``$ `` commands of a console block (continuation lines joined)."""
    commands: list[str] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
            commands.append(cmd)
        i += 1
    return commands


def reader_env() -> dict[str, str]:
    """A document's environment at its start: no KVGOV_* variable, the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGOV_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"
    return env


@contextlib.contextmanager
def inside(tmp: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Run a Python block in directory ``tmp`` with environment ``env`` (then restore both).

    Yields the environment: what the block set in ``os.environ`` is in it afterwards.
    """
    cwd = os.getcwd()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(tmp)
    after: dict[str, str] = {}
    try:
        yield after
    finally:
        after.update(os.environ)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
