"""The governor's structure (issue 26): one ledger, two pool protocols, no helper given it whole.

Checked on the source, as ``tests/test_layers.py`` checks the layers: every import
counts, those under ``TYPE_CHECKING`` and inside functions included.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from kvgov.govern import GovernedKVCache, Ledger
from kvgov.govern.protocol import DrivenPool, ObservedPool, QuotaPool

from .conftest import make_scope

GOVERN = Path(__file__).parents[2] / "govern"


def _module(path: Path) -> str:
    rel = path.relative_to(GOVERN).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["kvgov", "govern", *parts])


def _builds_a_governor(cls: ast.ClassDef) -> bool:
    """Whether a class constructs its own ``Governor(...)`` (in one of its methods)."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Governor"
        for n in ast.walk(cls)
    )


def _takers(tree: ast.Module, module: str) -> list[str]:
    """``module.function(param)`` for each parameter typed with ``Governor``, owners excepted.

    A binding owns its governor: the class that builds one (``VllmGovernance.open``,
    ``SglangGovernance.open``) may take it whole in its own ``__init__``; nothing
    else may, whatever package it is in.
    """
    owners = {
        id(item)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef) and _builds_a_governor(cls)
        for item in cls.body
        if isinstance(item, ast.FunctionDef) and item.name == "__init__"
    }
    takers = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and id(node) not in owners:
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            takers.extend(
                f"{module}.{node.name}({arg.arg})"
                for arg in args
                if arg.annotation is not None and "Governor" in ast.unparse(arg.annotation)
            )
    return takers


def test_no_helper_takes_the_whole_governor() -> None:
    """Only the governor's module names ``Governor`` in a parameter: helpers take the ledger."""
    takers = []
    for path in GOVERN.rglob("*.py"):
        if path.name != "governor.py":
            takers += _takers(ast.parse(path.read_text(encoding="utf-8")), _module(path))
    assert takers == []


def test_the_governor_rule_tells_a_binding_from_a_helper() -> None:
    """The exemption is the owning binding's ``__init__``, not a package or a name."""
    source = """
class Binding:
    def __init__(self, governor: Governor) -> None: ...
    @classmethod
    def open(cls) -> "Binding":
        return cls(governor=Governor(pool=None))
    def step(self, other: Governor) -> None: ...

class Helper:
    def __init__(self, governor: Governor) -> None: ...

def helper(gov: Governor | None) -> None: ...
"""
    assert sorted(_takers(ast.parse(source), "m")) == [
        "m.__init__(governor)",
        "m.helper(gov)",
        "m.step(other)",
    ]


def _members(protocol: type) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")}


def test_the_vllm_adapter_is_an_observed_pool_and_nothing_more() -> None:
    """vLLM's pool adapter has every ObservedPool call and none of a DrivenPool's; it
    takes the policy's quotas (QuotaPool), which vLLM's free queue enforces."""
    tree = ast.parse((GOVERN / "vllm" / "pool.py").read_text(encoding="utf-8"))
    adapter = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VllmPoolAdapter"
    )
    methods = {
        n.name
        for n in adapter.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")
    }
    assert methods == _members(ObservedPool) | _members(QuotaPool)
    assert _members(DrivenPool) == {"allocate", "free", "lookup", "set_keys"}


def test_the_ledger_holds_the_governors_state(
    make_cache: Callable[..., GovernedKVCache],
) -> None:
    """An admission shows in the governor's one ledger: owner, counters; a release, its deadline."""
    cache = make_cache(num_blocks=8)
    ledger = cache.governor.ledger
    assert isinstance(ledger, Ledger)
    adm = cache.admit("s", make_scope(), list(range(10)))
    assert ledger.owners.of_tenant("acme") == sorted(adm.block_ids)
    assert ledger.counters["acme"].requests == 1
    cache.release("s")
    assert ledger.deadlines.next_due() < float("inf")
