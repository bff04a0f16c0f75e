"""Every command and code sample in README.md and docs/*.md runs, as written.

Convention (also in docs/index.md, "Code blocks"):

* ``bash`` / ``sh`` / ``shell`` blocks run as scripts (``bash -euo pipefail``);
  ``console`` blocks run their ``$ `` lines, each of which must exit 0 (the other
  lines are output, shown and not compared); ``python`` blocks run in one namespace per
  document, in order, so a later block builds on the names an earlier one made.
* All the blocks of one document run in order in one fresh temporary directory, with
  the venv's ``bin`` (``kvgov``, ``python``) first on ``PATH``, no ``KVGOV_*`` variable
  set unless a block sets it, on SQLite and the embedded policy engine (``server``
  blocks: on the stand-ins, below). ``data`` there is a link to the repository's
  ``data/``, so a command naming ``data/mooncake/...`` runs as from a checkout's root.
* ``text``, ``json``, ``jsonc``, ``sql``, ``yaml`` and ``rego`` blocks are shown, not
  run; a fence without a language fails the test.
* A block that needs what CI lacks carries ``<!-- docs-test: KIND reason -->`` on the
  line right before its fence; KIND is one of :data:`tests.docs.blocks.KINDS`.
  ``server`` blocks (a deployment's PostgreSQL, Redis or OPA) run against local
  stand-ins (:mod:`tests.docs.standins`: the substitution table, the roles and
  databases made for the session, a deployment's trail); they are skipped only where
  127.0.0.1's PostgreSQL or Redis is absent, and fail then under ``CI=true``. ``gpu``
  blocks run where CUDA is present; ``vllm`` and ``ci`` blocks never run here. A skip
  prints KIND and the reason (``-ra``).

A block that no longer runs fails the build; the test names it as ``file:line``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .blocks import (
    DOCS,
    KINDS,
    PYTHON,
    ROOT,
    SHELL,
    Block,
    DocFormatError,
    console_commands,
    inside,
    parse,
    reader_env,
)
from .standins import SUBSTITUTIONS, Standins

#: The repository's data (the Mooncake traces), linked as ``data`` into each document's
#: working directory: the docs name it as a reader at a checkout's root does.
DATA = ROOT / "data"
#: Seconds one shell block may take (the slowest is `kvgov demo --quick`).
BLOCK_TIMEOUT = 240


def _all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in parse(doc)]


def _parsable_blocks() -> list[Block]:
    """The blocks of every document that parses (the others fail the format test)."""
    out: list[Block] = []
    for doc in DOCS:
        with contextlib.suppress(DocFormatError):
            out.extend(parse(doc))
    return out


def _skip_reason(block: Block, standins: Standins) -> str | None:
    """Why this block does not run here, or None when it runs."""
    kind = block.marker
    if kind is None:
        return None
    why = f"docs-test: {kind} ({KINDS[kind]}): {block.reason}"
    if kind == "server":
        missing = standins.missing(block.code, block.doc.stem)
        return None if missing is None else f"{why}: {missing}"
    if kind == "gpu":
        import torch

        return None if torch.cuda.is_available() else why
    return why  # vllm, ci


class _DocRun:
    """The blocks of one document, run in order in one directory and namespace."""

    def __init__(self, doc: Path, base: Path, standins: Standins) -> None:
        self.blocks = parse(doc)
        self.page = doc.stem
        self.standins = standins
        self.work = base / "work"
        self.work.mkdir(parents=True)
        (self.work / "data").symlink_to(DATA, target_is_directory=True)
        self.namespace: dict[str, Any] = {"__name__": f"docs_{doc.stem}"}
        # what a reader's shell holds: a block's `export`s are there for the next blocks
        self.env = reader_env()
        self._env_file = base / "env"
        self.done = 0  # blocks before this index have been handled
        self.failed: str | None = None

    def run_through(self, index: int) -> None:
        """Run every runnable block up to and including ``index``; fail on the first error."""
        while self.done <= index:
            block = self.blocks[self.done]
            self.done += 1
            if not block.runnable or _skip_reason(block, self.standins) is not None:
                continue
            try:
                self._run(block)
            except AssertionError as exc:
                self.failed = f"{block.name} failed: {exc}"
                raise
        if self.failed is not None:
            pytest.fail(f"an earlier block failed ({self.failed})", pytrace=False)

    def _run(self, block: Block) -> None:
        """Run one block; a server block on the stand-ins, with the deployment's secrets."""
        if block.marker != "server":
            self._run_code(block, block.code, self.env)
            return
        self.standins.prepare(self.page, self.work, self.env)
        rewritten = self.standins.rewrite(block.code, self.page, self.work.parent)
        before = self.env
        secrets = self.standins.deployment_env()
        try:
            self._run_code(block, rewritten.code, {**before, **secrets})
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{rewritten.report()}") from exc
        for name, value in secrets.items():  # the deployment's, not the reader's shell's
            if name not in before and self.env.get(name) == value:
                del self.env[name]

    def _run_code(self, block: Block, code: str, env: dict[str, str]) -> None:
        if block.lang == PYTHON:
            compiled = compile("\n" * block.line + code, str(block.doc), "exec")
            with inside(self.work, env) as after:
                try:
                    exec(compiled, self.namespace)
                except Exception as exc:
                    raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
            self.env = after
            return
        script = code if block.lang in SHELL else "\n".join(console_commands(code))
        assert script.strip(), f"{block.name}: a console block without a `$ ` command"
        keep_env = f'\nenv -0 > "{self._env_file}"\n'
        try:
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script + keep_env],
                cwd=self.work,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"ran past {BLOCK_TIMEOUT} s") from exc
        if proc.returncode != 0:
            raise AssertionError(
                f"exit {proc.returncode}\n--- script\n{script}\n--- stdout\n"
                f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
            )
        pairs = self._env_file.read_bytes().decode().split("\0")
        self.env = dict(p.split("=", 1) for p in pairs if "=" in p)
        for shell_own in ("_", "SHLVL", "PWD", "OLDPWD"):
            self.env.pop(shell_own, None)


_RUNS: dict[Path, _DocRun] = {}


@pytest.fixture(scope="session")
def standins() -> Iterator[Standins]:
    """The session's stand-ins for the deployment server blocks name; removed at the end."""
    made = Standins()
    yield made
    made.close()


@pytest.fixture()
def doc_run(tmp_path_factory: pytest.TempPathFactory, standins: Standins) -> Any:
    def get(doc: Path) -> _DocRun:
        if doc not in _RUNS:
            base = tmp_path_factory.mktemp(f"docs-{doc.stem}")
            _RUNS[doc] = _DocRun(doc, base, standins)
        return _RUNS[doc]

    return get


def _params() -> list[Any]:
    out = []
    for block in _parsable_blocks():
        if not block.runnable:
            continue
        marks = [pytest.mark.gpu] if block.marker == "gpu" else []
        out.append(pytest.param(block, id=block.name, marks=marks))
    return out


def test_every_block_declares_what_it_is() -> None:
    """Every fence names a known language, every marker is known and sits on a runnable block."""
    blocks = _all_blocks()  # raises DocFormatError naming file:line
    assert sum(b.runnable for b in blocks) >= 30, "the docs lost their commands"
    assert all(b.marker is None or b.reason for b in blocks), "a marker without a reason"


def test_server_blocks_name_what_a_standin_replaces() -> None:
    """A ``server`` marker sits only on a block that names a deployment the stand-ins
    replace, and every ``*.internal`` host a runnable block names is under one."""
    for block in _parsable_blocks():
        named = [s.what for s in SUBSTITUTIONS if s.service and s.pattern.search(block.code)]
        if block.marker == "server":
            assert named, f"{block.name}: a server marker on a block that names no server"
        elif block.runnable and block.marker is None:
            assert ".internal" not in block.code, f"{block.name}: names a host, no marker"


@pytest.mark.parametrize("block", _params())
def test_block_runs(block: Block, doc_run: Any, standins: Standins) -> None:
    """The block (and every block before it in its document) runs without error."""
    reason = _skip_reason(block, standins)
    if reason is not None:
        if block.marker == "server" and os.environ.get("CI"):
            pytest.fail(f"{reason} (CI has PostgreSQL and Redis: this must not be skipped)")
        pytest.skip(reason)
    run = doc_run(block.doc)
    run.run_through(run.blocks.index(block))
