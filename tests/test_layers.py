"""Data flows one way: cli on top, then govern, then the lower layers, apart from each other.

The rule of docs/architecture.md, checked on the source: ``kvgov.allocator``, ``kvgov.policy``,
``kvgov.audit`` and ``kvgov.offload`` import only themselves and the shared modules of
``kvgov`` (exceptions, defaults, schema, retry, canonical, secrecy); ``kvgov.govern`` may import
the lower layers; ``kvgov.cli`` (the ``kvgov`` command) is the top layer, which may
import every layer and which no layer imports. Beside the layers: no import cycle among
kvgov's modules, and no module imports another module's private (``_``) names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
    "kvgov.lazy",
}
LOWER = ("allocator", "policy", "audit", "offload")
#: Every root folder reached as kvgov.<folder>; cli is the top, govern the one below.
LAYERS = (*LOWER, "govern", "migrations", "cli")


def _module_name(path: Path) -> str:
    """The dotted name of a source file under the checkout (kvgov/<layer> is ../<layer>)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "kvgov":
        parts.insert(0, "kvgov")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(path: Path) -> str:
    """The package a file's relative imports resolve against."""
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _sources() -> list[Path]:
    """Every Python file of the kvgov package, once (the layers at the root, not via kvgov/)."""
    files = [
        p
        for p in sorted((ROOT / "kvgov").glob("**/*.py"))
        if p.relative_to(ROOT / "kvgov").parts[0] not in LAYERS
    ]
    for layer in LAYERS:
        files.extend(sorted((ROOT / layer).rglob("*.py")))
    return files


def _imports(path: Path, package: str) -> Iterator[tuple[ast.ImportFrom | ast.Import, str]]:
    """Every import statement of a file (at any depth: functions, ``if TYPE_CHECKING:``),
    with the absolute module it names (relative imports resolved against ``package``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield node, f"{base}.{node.module}" if node.module else base
            elif node.module:
                yield node, node.module


def _kvgov_imports(path: Path, package: str) -> set[str]:
    """The kvgov modules a file imports (relative imports resolved against its package)."""
    return {m for _, m in _imports(path, package) if m.split(".")[0] == "kvgov"}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and module not in SHARED else None


def _offenders(layer: str, allowed: set[str | None]) -> list[str]:
    found = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for module in sorted(_kvgov_imports(path, _package(path))):
            if module not in SHARED and _layer(module) not in allowed:
                found.append(f"{path.relative_to(ROOT)} imports {module}")
    return found


@pytest.mark.parametrize("layer", LOWER)
def test_a_lower_layer_imports_only_itself_and_the_shared_modules(layer: str) -> None:
    """allocator, policy, audit and offload never import govern, cli or each other."""
    assert _offenders(layer, {layer}) == []


def test_govern_imports_the_lower_layers_and_never_the_cli() -> None:
    """govern sits on the lower layers; the command line sits on govern, not the reverse."""
    assert _offenders("govern", {"govern", *LOWER}) == []


@pytest.mark.parametrize("layer", [name for name in LAYERS if name != "cli"])
def test_no_layer_imports_the_cli(layer: str) -> None:
    """kvgov.cli is the top layer: nothing below imports it."""
    assert [o for o in _offenders(layer, {layer, *LOWER, "govern", "migrations"})] == []


def test_the_cli_is_a_layer_that_imports_the_others() -> None:
    """The commands live in kvgov.cli and reach every layer they drive."""
    imported = set()
    for path in (ROOT / "cli").rglob("*.py"):
        imported |= {_layer(m) for m in _kvgov_imports(path, _package(path))}
    assert {"audit", "policy", "govern"} <= imported


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The rule's own check finds an absolute and a relative import of another layer."""
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from kvgov.govern import Governor\nfrom ..allocator import KVSpec\n"
        "def f():\n    from kvgov.cli.main import main\n"
    )
    found = _kvgov_imports(bad, "kvgov.audit")
    assert {_layer(m) for m in found} == {"govern", "allocator", "cli"}


# -- import cycles -----------------------------------------------------------------------


def _graph() -> dict[str, set[str]]:
    """kvgov module -> the kvgov modules it imports anywhere in its source.

    ``from kvgov.x import y`` is an edge to ``kvgov.x.y`` where that is a module, else to
    ``kvgov.x`` (its ``__init__``); importing a submodule is not counted as importing its
    parent packages (that is Python's mechanics, not the module's dependency).
    """
    sources = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, path in sources.items():
        for node, module in _imports(path, _package(path)):
            if module.split(".")[0] != "kvgov":
                continue
            targets = {module}
            if isinstance(node, ast.ImportFrom):
                subs = {f"{module}.{a.name}" for a in node.names} & sources.keys()
                named_only = len(subs) < len(node.names)
                targets = subs | ({module} if named_only else set())
            graph[name] |= {t for t in targets if t in sources and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycle_among_kvgov_modules() -> None:
    """No two kvgov modules import each other, even through others, even lazily.

    Imports inside functions and under ``if TYPE_CHECKING:`` count: a cycle hidden that
    way is still two modules that cannot be understood, tested or moved apart.
    """
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_a_lazy_and_a_type_only_cycle() -> None:
    """A -> B -> C -> A is one component; D -> A is not part of it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"x": {"y"}, "y": set()}) == []


def test_the_graph_counts_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    """The import walk sees imports at any depth."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kvgov.govern.cache import GovernedKVCache\n"
        "def f():\n    from .sizes import parse_size\n"
    )
    assert _kvgov_imports(probe, "kvgov.govern") == {"kvgov.govern.cache", "kvgov.govern.sizes"}


# -- private names -----------------------------------------------------------------------


def _private_imports(path: Path, package: str) -> list[str]:
    """``from x import _y`` in a file: a private name taken from another module."""
    found = []
    for node, module in _imports(path, package):
        if not isinstance(node, ast.ImportFrom) or module == "__future__":
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{where}:{node.lineno} imports {name} from {module}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    """A leading underscore means "this module's own": no other module may import it."""
    offenders = [o for p in _sources() for o in _private_imports(p, _package(p))]
    assert offenders == [], "\n".join(offenders)


def test_the_private_name_check_sees_one_and_spares_dunders(tmp_path: Path) -> None:
    """``_y`` is private; ``__version__`` and ``from __future__`` are not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from __future__ import annotations\nfrom kvgov import __version__\n"
        "def f():\n    from .policy import _open_engine as open_engine\n"
    )
    found = _private_imports(probe, "kvgov.cli")
    assert [f.split(" imports ")[1] for f in found] == ["_open_engine from kvgov.cli.policy"]
