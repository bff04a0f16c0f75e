"""Data flows one way: govern imports the lower layers, and they import none of each other.

The rule of docs/architecture.md, checked on the source: ``kvgov.allocator``, ``kvgov.policy``,
``kvgov.audit`` and ``kvgov.offload`` import only themselves and the shared modules of
``kvgov`` (exceptions, defaults, schema, retry, canonical, secrecy); only ``kvgov.govern`` may
import the other layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SHARED = {
    "kvgov",
    "kvgov.exceptions",
    "kvgov.defaults",
    "kvgov.schema",
    "kvgov.retry",
    "kvgov.canonical",
    "kvgov.secrecy",
}
LOWER = ("allocator", "policy", "audit", "offload")


def _kvgov_imports(path: Path, package: str) -> set[str]:
    """The kvgov modules a file imports (relative imports resolved against its package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "kvgov")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module and node.module.split(".")[0] == "kvgov":
                found.add(node.module)
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and module not in SHARED else None


@pytest.mark.parametrize("layer", LOWER)
def test_a_lower_layer_imports_only_itself_and_the_shared_modules(layer: str) -> None:
    """allocator, policy, audit and offload never import govern or each other."""
    offenders = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        package = "kvgov." + ".".join(path.relative_to(ROOT).parent.parts)
        for module in _kvgov_imports(path, package):
            if module in SHARED or _layer(module) == layer:
                continue
            offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The rule's own check finds an absolute and a relative import of another layer."""
    bad = tmp_path / "probe.py"
    bad.write_text("from kvgov.govern import Governor\nfrom ..allocator import KVSpec\n")
    found = _kvgov_imports(bad, "kvgov.audit")
    assert {_layer(m) for m in found} == {"govern", "allocator"}
