"""The distribution installs one import package, ``kvgov``, and the code imports only it.

``allocator``, ``audit``, ``policy``, ``govern`` and ``migrations`` are other projects'
names on the package index; a wheel that installed them as top-level packages would
break, or be broken by, any environment that has one of those projects.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.native import native_unbuildable

ROOT = Path(__file__).parents[1]
LAYERS = ("allocator", "audit", "govern", "offload", "policy", "migrations", "cli")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")
#: What building the wheel printed on stderr (pip relays the build backend's warnings).
_BUILD_STDERR: list[str] = []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy, so setuptools' build/ and egg-info never land in the checkout
    src = tmp_path_factory.mktemp("src")
    for name in ("kvgov", *LAYERS):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=_IGNORE)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _BUILD_STDERR.append(proc.stderr)
    (built,) = out.glob("kvgov-*.whl")
    return built


def test_the_wheel_holds_exactly_one_top_level_package(wheel: Path) -> None:
    """Every file of the wheel but its metadata lies under kvgov/."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert tops == {"kvgov"}


def test_the_wheel_maps_every_layer_into_kvgov(wheel: Path) -> None:
    """Each root folder arrives as kvgov.<layer> with its modules and data files."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for layer in LAYERS:
        assert f"kvgov/{layer}/__init__.py" in names, layer
    assert "kvgov/govern/cache.py" in names
    assert "kvgov/cli/main.py" in names
    assert "kvgov/cli/py.typed" in names
    assert "kvgov/policy/rego/admission.rego" in names
    assert "kvgov/policy/rego/data.json" in names
    assert "kvgov/migrations/script.py.mako" in names
    assert any(n.startswith("kvgov/migrations/versions/") for n in names)
    with zipfile.ZipFile(wheel) as zf:
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "kvgov = kvgov.cli.main:main" in zf.read(entry_points).decode()


@pytest.mark.parametrize(
    "module", ["kvgov/govern/_keychain", "kvgov/audit/_seal"], ids=["keychain", "seal"]
)
def test_the_wheel_holds_the_compiled_extensions(wheel: Path, module: str) -> None:
    """setup.py's optional extensions are built into the wheel where this machine can build
    them (their tests: tests/govern/test_keychain_native.py, tests/audit/test_seal_native.py)."""
    why = native_unbuildable(module.replace("/", "."))
    if why is not None:
        pytest.skip(why)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert [n for n in names if n.startswith(f"{module}.") and n.endswith(".so")]
    assert not [n for n in names if n.endswith(".c")]  # the sources stay in the sdist


def test_building_the_wheel_warns_of_nothing(wheel: Path) -> None:
    """No setuptools warning (license table, package data such as policy/rego/*.rego)."""
    assert wheel.exists()
    # pip's own notes about this machine's index configuration are not the project's
    lines = [
        line
        for line in _BUILD_STDERR[0].splitlines()
        if line.strip() and not line.startswith("WARNING: Location ")
    ]
    assert lines == []


def test_the_metadata_has_an_spdx_license(wheel: Path) -> None:
    """project.license is an SPDX expression (the table form is deprecated)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    assert "License-Expression: Apache-2.0" in text


_BARE = re.compile(rf"^\s*(?:from|import)\s+({'|'.join(LAYERS)})\b", re.MULTILINE)


def test_no_code_imports_a_layer_by_its_bare_name() -> None:
    """Code imports kvgov.<layer>, never <layer>: the bare names exist only in a checkout."""
    offenders = []
    for folder in (*LAYERS, "kvgov", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if p != ROOT):
                continue
            for match in _BARE.finditer(path.read_text(encoding="utf-8")):
                offenders.append(f"{path.relative_to(ROOT)}: {match.group(0).strip()}")
    assert offenders == []


def test_the_public_api_is_reexported_from_kvgov() -> None:
    """``from kvgov import GovernedKVCache, CacheScope, KVSpec`` works and is the same object."""
    import kvgov
    from kvgov.allocator import KVSpec
    from kvgov.govern import CacheScope, GovernedKVCache

    assert kvgov.GovernedKVCache is GovernedKVCache
    assert kvgov.CacheScope is CacheScope
    assert kvgov.KVSpec is KVSpec
    assert sorted(kvgov.__all__) == kvgov.__all__
    for name in kvgov.__all__:
        assert getattr(kvgov, name) is not None, name
    with pytest.raises(AttributeError):
        kvgov.not_a_name  # noqa: B018
