"""Each engine's internals stay behind its own fence, and the docs say which.

vLLM's behind ``kvgov/govern/vllm/fence.py``, SGLang's behind
``kvgov/govern/sglang/fence.py`` (:data:`ENGINES`). Runs without either engine
(``make test``): every module of the ``kvgov`` package is parsed with :mod:`ast`,
and any use of an engine's private name outside that engine's fence fails the
test with its file and line (a fence imports no other engine, so it cannot be
the place for another engine's internals):

* ``x._name`` where ``x`` is not ``self``/``cls``/``super()`` of a method (a name
  of :data:`ALLOWED_NAMES` excepted, each with its reason);
* in a class that subclasses an engine's class (directly, through another such
  class, or as a mixin beside one), ``self._name`` or ``def _name`` that is not
  kvgov's own (``_kvgov...``): the engine's private state, or an override of its
  private methods;
* an assignment to ``__class__`` (re-classing in place);
* an assignment to an attribute of an engine's module or class, or ``setattr`` /
  ``getattr`` / ``hasattr`` / ``delattr`` on one with a computed or private
  name (monkey-patches);
* ``getattr(x, "_name")`` and friends with a private constant name;
* vLLM's internals that have no underscore (:data:`INTERNAL_NAMES`).

Each engine's table "What kvgov touches in <engine>, and why" (docs/vllm.md,
docs/sglang.md) is compared with its fence's registry ``TOUCHED`` (read from its
source, so without the engine); with the engine installed, every registered name
must exist where the registry says.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import kvgov

REPO = Path(__file__).resolve().parents[3]
PACKAGE = Path(kvgov.__file__).parent


@dataclass(frozen=True)
class Engine:
    """An engine kvgov governs through its internals: its package, its fence, its docs."""

    package: str
    label: str
    fence: Path
    doc: Path

    @property
    def heading(self) -> str:
        return f"## What kvgov touches in {self.label}, and why"


#: Every engine with a fence.
ENGINES = (
    Engine("vllm", "vLLM", PACKAGE / "govern" / "vllm" / "fence.py", REPO / "docs" / "vllm.md"),
    Engine(
        "sglang", "SGLang", PACKAGE / "govern" / "sglang" / "fence.py", REPO / "docs" / "sglang.md"
    ),
)
LABELS = {e.package: e.label for e in ENGINES}
VLLM = ENGINES[0]
FENCE = VLLM.fence

#: Private names allowed on any object, and why.
ALLOWED_NAMES = {
    "_replace": "NamedTuple's public API (underscored so it cannot clash with a field)",
    "_asdict": "NamedTuple's public API (underscored so it cannot clash with a field)",
    "_check_invariants": "kvgov's own invariant checks, called by kvgov's owners of the object",
}

#: vLLM internals without an underscore: as private as the rest.
INTERNAL_NAMES = frozenset(
    {"fake_free_list_head", "fake_free_list_tail", "next_free_block", "prev_free_block"}
)

_REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call):
        return None
    return node.id if isinstance(node, ast.Name) else None


def _is_super(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


@dataclass
class _Scan(ast.NodeVisitor):
    """One module's violations (``line: what``)."""

    tree: ast.Module
    found: list[tuple[int, str]] = field(default_factory=list)
    # name imported from an engine -> the engine's package; class derived from one -> same
    vllm_names: dict[str, str] = field(default_factory=dict)
    vllm_classes: dict[str, str] = field(default_factory=dict)
    # the class whose instance ``self`` is, per enclosing function (None: not a method)
    owners: list[str | None] = field(default_factory=list)
    classes: list[tuple[str, set[int]]] = field(default_factory=list)  # name, ids of its body

    def run(self) -> list[tuple[int, str]]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LABELS:
                engine = (node.module or "").split(".")[0]
                self.vllm_names.update({a.asname or a.name: engine for a in node.names})
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in LABELS:
                        self.vllm_names[a.asname or a.name.split(".")[0]] = a.name.split(".")[0]
        defs = [n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)]
        names = {d.name for d in defs}
        changed = True
        while changed:  # engine-derived: an engine base, a derived base, or a mixin beside one
            changed = False
            known = {**self.vllm_names, **self.vllm_classes}
            for c in defs:
                bases = {_root(b) for b in c.bases}
                engines = [known[b] for b in bases if b in known]
                if not engines:
                    continue
                for name in ({c.name} | (bases & names)) - set(self.vllm_classes):
                    self.vllm_classes[name] = engines[0]
                    changed = True
        self.visit(self.tree)
        return sorted(set(self.found))

    def _flag(self, node: ast.AST, what: str) -> None:
        self.found.append((getattr(node, "lineno", 0), what))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append((node.name, {id(item) for item in node.body}))
        engine = self.vllm_classes.get(node.name)
        for item in node.body:
            if (
                engine is not None
                and isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and _private(item.name)
                and not item.name.startswith("_kvgov")
            ):
                self._flag(item, f"def {item.name}: overrides {LABELS[engine]}'s private method")
        self.generic_visit(node)
        self.classes.pop()

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        params = [a.arg for a in node.args.posonlyargs + node.args.args]
        method = (
            not isinstance(node, ast.Lambda)
            and bool(self.classes)
            and id(node) in self.classes[-1][1]
            and bool(params)
        )
        if method:
            owner: str | None = self.classes[-1][0]
        elif params and params[0] in ("self", "cls"):
            owner = None  # a function whose self is someone else's object (a patch)
        else:
            owner = self.owners[-1] if self.owners else None
        self.owners.append(owner)
        self.generic_visit(node)
        self.owners.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function
    visit_Lambda = _visit_function

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        if name in INTERNAL_NAMES:
            self._flag(node, f"{ast.unparse(node)}: vLLM's internal {name}")
        elif _private(name) and name not in ALLOWED_NAMES:
            value = node.value
            owner = self.owners[-1] if self.owners else None
            on_self = (isinstance(value, ast.Name) and value.id in ("self", "cls")) or _is_super(
                value
            )
            if not on_self or owner is None:
                self._flag(node, f"{ast.unparse(node)}: a private name of another object")
            elif owner in self.vllm_classes and not name.startswith("_kvgov"):
                label = LABELS[self.vllm_classes[owner]]
                self._flag(
                    node, f"{ast.unparse(node)}: {label}'s private {name} on a {label} subclass"
                )
        self.generic_visit(node)

    def _check_target(self, target: ast.expr) -> None:
        if isinstance(target, ast.Attribute):
            if target.attr == "__class__":
                self._flag(target, f"{ast.unparse(target)} = ...: re-classes an object in place")
            elif (engine := self.vllm_names.get(_root(target) or "")) is not None:
                self._flag(target, f"{ast.unparse(target)} = ...: patches {LABELS[engine]}")
        elif isinstance(target, ast.Tuple | ast.List):
            for t in target.elts:
                self._check_target(t)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _REFLECTION and len(node.args) >= 2:
            obj, attr = node.args[0], node.args[1]
            constant = isinstance(attr, ast.Constant) and isinstance(attr.value, str)
            engine = self.vllm_names.get(_root(obj) or "")
            if engine is not None and (
                func.id in ("setattr", "delattr") or not constant or _private(str(attr.value))
            ):
                self._flag(node, f"{ast.unparse(node)}: reflection on {LABELS[engine]}")
            elif (
                constant
                and _private(str(attr.value))
                and str(attr.value) not in ALLOWED_NAMES
                and not (isinstance(obj, ast.Name) and obj.id in ("self", "cls"))
            ):
                self._flag(node, f"{ast.unparse(node)}: a private name of another object")
        self.generic_visit(node)


def scan_source(source: str) -> list[tuple[int, str]]:
    """The fence violations of one module's source, as ``(line, what)``."""
    return _Scan(ast.parse(source)).run()


def package_modules() -> list[Path]:
    """Every module of the ``kvgov`` package, through its layer symlinks."""
    found = []
    for folder, dirs, files in os.walk(PACKAGE, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(folder) / f for f in sorted(files) if f.endswith(".py")]
    return found


def test_the_scanner_flags_every_kind_of_access() -> None:
    """Each rule catches what it is for, and leaves kvgov's own names alone."""
    source = """
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.engine.core import EngineCore

class Mixin:
    def _kvgov_own(self):
        return self._kvgov_state

    def _get_new_block_ids_to_zero(self):
        return self._free_request(None)

class Pool(Mixin, BlockPool):
    pass

class Own:
    def __init__(self, other):
        self._mine = other._theirs
        self._ok = other._replace(a=1)

def read(block, request):
    request.__class__ = Pool
    EngineCore.preprocess_add_request = read
    setattr(EngineCore, "kvgov_call", read)
    getattr(request, "_kvgov", None)
    head = block.fake_free_list_head

    def patch(self):
        return self._finish_request(None)
    return block._block_hash
"""
    whats = [what for _, what in scan_source(source)]
    expected = [
        "def _get_new_block_ids_to_zero: overrides vLLM's private method",
        "self._free_request: vLLM's private _free_request on a vLLM subclass",
        "other._theirs: a private name of another object",
        "request.__class__ = ...: re-classes an object in place",
        "EngineCore.preprocess_add_request = ...: patches vLLM",
        "setattr(EngineCore, 'kvgov_call', read): reflection on vLLM",
        "getattr(request, '_kvgov', None): a private name of another object",
        "block.fake_free_list_head: vLLM's internal fake_free_list_head",
        "self._finish_request: a private name of another object",
        "block._block_hash: a private name of another object",
    ]
    assert sorted(whats) == sorted(expected)


def test_the_scanner_names_each_engine() -> None:
    """SGLang's classes, overrides and patches are flagged as SGLang's."""
    source = """
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
import sglang.srt.mem_cache.allocator as alloc

class Cache(UnifiedRadixCache):
    def _kvgov_key(self):
        return self._apply_eviction_result(None)

    def _evict(self):
        pass

def govern(allocator, cls):
    allocator.__class__ = cls
    alloc.PagedTokenToKVPoolAllocator.alloc = govern
    return super(type(allocator), allocator)._release_page_ids()
"""
    whats = [what for _, what in scan_source(source)]
    expected = [
        "self._apply_eviction_result: SGLang's private _apply_eviction_result on a SGLang subclass",
        "def _evict: overrides SGLang's private method",
        "allocator.__class__ = ...: re-classes an object in place",
        "alloc.PagedTokenToKVPoolAllocator.alloc = ...: patches SGLang",
        "super(type(allocator), allocator)._release_page_ids: a private name of another object",
    ]
    assert sorted(whats) == sorted(expected)


def _engines_imported(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found & set(LABELS)


def test_no_engine_private_name_outside_its_fence() -> None:
    """Only an engine's fence touches its private names (kvgov's own names on its objects too).

    The other modules have no violation at all; a fence imports no other engine,
    so each engine's private names are reached in that engine's fence only.
    """
    modules = package_modules()
    fences = {e.fence: e for e in ENGINES}
    assert set(fences) <= set(modules) and len(modules) > 50
    violations = []
    for path in modules:
        source = path.read_text()
        engine = fences.get(path)
        if engine is not None:
            others = _engines_imported(source) - {engine.package}
            violations += [f"{path.relative_to(PACKAGE.parent)}: imports {o}" for o in others]
            continue
        for line, what in scan_source(source):
            violations.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
    assert violations == [], "use the accessors of the engine's fence.py:\n" + "\n".join(violations)


# ---------------------------------------------------------------------- the registry and the docs


def registry(engine: Engine = VLLM) -> list[tuple[str, ...]]:
    """The fence's ``TOUCHED``, read from its source (the engine need not be installed)."""
    tree = ast.parse(engine.fence.read_text())
    constants: dict[str, str] = {}
    entries: ast.expr | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if not isinstance(target, ast.Name) or node.value is None:
                continue
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                constants[target.id] = node.value.value
            elif target.id == "TOUCHED":
                entries = node.value
    assert isinstance(entries, ast.Tuple), "fence.py has no TOUCHED = (...)"
    rows = []
    for call in entries.elts:
        assert isinstance(call, ast.Call) and not call.keywords
        rows.append(
            tuple(
                constants[a.id] if isinstance(a, ast.Name) else ast.literal_eval(a)
                for a in call.args
            )
        )
    return rows


def render(row: tuple[str, ...]) -> str:
    """A registry entry as its docs table row."""
    name, kind, where, why, versions = row
    return f"| `{name}` | {kind} | `{where}` | {why} | {versions} |"


def doc_rows(engine: Engine = VLLM) -> list[str]:
    """The rows of the docs' table (after its header and separator)."""
    lines = engine.doc.read_text().splitlines()
    assert engine.heading in lines, f"{engine.doc.name} has no section {engine.heading!r}"
    rows: list[str] = []
    for line in lines[lines.index(engine.heading) + 1 :]:
        if line.startswith("|"):
            rows.append(line)
        elif rows or line.startswith("#"):
            break
    return rows[2:]


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.package)
def test_the_docs_table_is_the_fence_registry(engine: Engine) -> None:
    """The engine's docs list exactly what its fence touches, in the registry's order."""
    expected = [render(r) for r in registry(engine)]
    assert doc_rows(engine) == expected, f"{engine.doc.name}'s table should read:\n" + "\n".join(
        expected
    )


def _accessors(engine: Engine) -> str:
    """The fence's code after its ``TOUCHED`` registry (the accessors)."""
    source = engine.fence.read_text()
    tree = ast.parse(source)
    end = next(
        n.end_lineno
        for n in tree.body
        if isinstance(n, ast.AnnAssign | ast.Assign)
        and "TOUCHED" in ast.unparse(n.target if isinstance(n, ast.AnnAssign) else n.targets[0])
    )
    return "\n".join(source.splitlines()[end:])


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.package)
def test_the_registry_names_what_the_fence_touches(engine: Engine) -> None:
    """Every private name the fence reaches is registered, and every registered one is reached."""
    code = _accessors(engine)
    assert code.strip()
    reached = set(re.findall(r"\.(_[a-z]\w*)", code)) | set(re.findall(r'"(_[a-z]\w*)"', code))
    reached |= {n for n in INTERNAL_NAMES if re.search(rf"\.{n}\b", code)}
    registered = {r[0].rpartition(".")[2] for r in registry(engine) if "." in r[0]}
    assert reached - registered == set()
    assert {n for n in registered if not re.search(rf"\b{n}\b", code)} == set()


@pytest.mark.vllm
def test_every_registered_name_exists_in_the_installed_vllm() -> None:
    """Each name is where the registry says, in the vLLM installed (0.32 or 0.33)."""
    missing = _missing(VLLM)
    assert missing == []


def _missing(engine: Engine) -> list[str]:
    missing = []
    for name, kind, where, _, versions in registry(engine):
        cls_name, _, attr = name.partition(".")
        module = importlib.import_module(where)
        cls = getattr(module, cls_name, None)
        if cls is None:
            missing.append(f"{where}.{cls_name}")
            continue
        if not attr or attr.startswith(("kvgov", "_kvgov")):
            continue  # a re-class, or kvgov's own name on a vLLM object
        if not hasattr(cls, attr) and not re.search(rf"\b{attr}\b", inspect.getsource(cls)):
            missing.append(f"{where}.{name} ({kind}; {versions})")
    return missing


@pytest.mark.sglang
def test_every_registered_name_exists_in_the_installed_sglang() -> None:
    """Each name is where the registry says, in the SGLang installed (0.5.23)."""
    pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")
    assert _missing(ENGINES[1]) == []
