"""The repository is self-contained: nothing in it names a folder beside the checkout.

Everything ``make test``, ``make demo``, the benchmarks and the docs need is in the
repository or installed by its own files: the Mooncake traces ship in ``data/mooncake/``,
the vLLM venvs' recipes in ``benchmarks/``. ``.ci/run`` makes the same check first (with
``git grep``), before anything is installed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "data" / "mooncake"

# Built from parts, so that this file does not name what it looks for.
_UP, _SIBLING = re.escape(".."), "shared"
#: the sibling folder by any path: up one level then its name, or its name after `.parent /`
OUTSIDE = re.compile(
    rf"{_UP}/{_SIBLING}\b"
    rf"|\.parents?(?:\[\d+\])?\s*/\s*[\"']{_SIBLING}[\"']"
    rf"|[\"']{_UP}[\"']\s*/\s*[\"']{_SIBLING}[\"']"
)


def _tracked_files() -> list[Path]:
    """The files git tracks (a checkout), or every file under the root outside the ignored."""
    if (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        return [ROOT / name for name in out.decode().split("\0") if name]
    skip = {".git", ".venv", ".bench", "__pycache__", "build", ".mypy_cache", ".ruff_cache"}
    return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def offenders(files: list[Path]) -> list[str]:
    """``path:line: text`` for every line of ``files`` that names the sibling folder."""
    found: list[str] = []
    for path in files:
        if path.is_symlink() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file names no path
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_the_pattern_finds_every_spelling_of_the_sibling_folder() -> None:
    """The check is not vacuous: each way a path reaches the sibling folder is caught."""
    sibling = _SIBLING
    lines = [
        f"kvgov replay ../{sibling}/data/trace.jsonl",
        f'TRACE = REPO.parent / "{sibling}" / "data"',
        f"TRACE = Path(__file__).parents[2] / '..' / '{sibling}' / 'data'",
        f"BENCH = Path(__file__).resolve().parents[1] / '{sibling}'",
    ]
    for line in lines:
        assert OUTSIDE.search(line), line
    for fine in ("a shared prompt", 'prefix="fleet:{shared}"', 'tmp_path / "shared"'):
        assert not OUTSIDE.search(fine), fine


def test_no_tracked_file_names_a_folder_beside_the_checkout() -> None:
    """A fresh clone with nothing beside it has everything: no file reaches outside."""
    files = _tracked_files()
    assert len(files) > 100, "the repository's files were not found"
    assert offenders(files) == []


def test_the_mooncake_traces_ship_with_their_license() -> None:
    """The traces the replay tests, benchmarks and docs use are here, attributed."""
    for name in ("mooncake_conversation_trace.jsonl", "mooncake_synthetic_trace.jsonl"):
        assert (MOONCAKE / name).stat().st_size > 1_000_000, name
    readme = (MOONCAKE / "README.md").read_text(encoding="utf-8")
    assert "kvcache-ai/Mooncake" in readme and "FAST25-release/traces" in readme
    license_text = (MOONCAKE / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
