"""One concept per module in the allocator layer, checked on the source.

A class lives whole in one module: no class is assembled by inheriting from a
class of another kvgov module (a mixin, or a base that only exists to split a
file), and no module reaches into another for a private (``_``) name: what is
shared is public, in the module that owns it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
LAYER = ROOT / "allocator"


def _modules() -> list[Path]:
    return sorted(LAYER.rglob("*.py"))


def _kvgov_names(tree: ast.Module) -> dict[str, str]:
    """The names a module imports from other kvgov modules, each with its module."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module.split(".")[0] == "kvgov":
                for alias in node.names:
                    names[alias.asname or alias.name] = module
    return names


def test_the_allocator_modules_exist() -> None:
    """The checks below read real files (a wrong ROOT would make them pass vacuously)."""
    assert {p.name for p in _modules()} >= {"__init__.py", "pool.py", "metadata.py"}


def test_no_allocator_module_imports_a_private_name() -> None:
    offenders = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, module in _kvgov_names(tree).items():
            if name.startswith("_"):
                offenders.append(f"{path.relative_to(ROOT)} imports {name} from {module}")
    assert offenders == []


def test_no_allocator_class_inherits_from_another_kvgov_module() -> None:
    """BlockPool (and every other class) is written in one place, not a chain of bases."""
    offenders = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _kvgov_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id in imported:
                        offenders.append(
                            f"{path.relative_to(ROOT)}: {node.name}({base.id}) "
                            f"from {imported[base.id]}"
                        )
    assert offenders == []
