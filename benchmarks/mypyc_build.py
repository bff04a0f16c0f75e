"""Compile kvgov's hot modules with mypyc in place (an experiment for #28), or remove them.

Run: .venv/bin/python benchmarks/mypyc_build.py [--clean] [--list] [MODULE.py ...]

The extension modules land next to their sources (``govern/keys.cpython-311-*.so``
beside ``govern/keys.py``), plus one shared library of the group at the checkout's
root (``kvgov__mypyc.*.so``); Python imports an extension before a ``.py`` of the
same name, so the compiled module is chosen where it exists and the pure-Python one
everywhere else. ``--clean`` removes every such file. ``*.so`` is git-ignored.

The modules compiled by default are the ones on the vLLM binding's scheduler thread
that compile and run under mypyc. Measured for #28 on 2026-11-29 (the 2-core machine,
load average 1-3): in one process, pure / compiled, ``KeyDeriver.derive_chain`` over 64
blocks 51-54 / 48 us, ``pack_tokens`` of 1,024 tokens 7.1-7.3 / 7.0, ``Deadlines.keyed``
1.0 / 0.6, ``Deadlines.cached`` 4.0-4.5 / 3.7-4.1, ``Owners.assign`` 0.84 / 0.49,
``Owners.group`` 1.1 / 1.1 (64 blocks): 5-7 us a request, against a governed excess of
70-80 us on the scheduler thread. ``bench_vllm_binding.py --rounds 5`` at 1,024 tokens,
pure and compiled runs alternating (7 + 7, load average 1-2), engine-core ratio medians
pure -> compiled: distinct 1.32 -> 1.31, shared 1.29 -> 1.30, 8 tenants 1.41 -> 1.40,
hybrid 1.36 -> 1.40 and 1.31 -> 1.31; governed scheduler thread 434 -> 439, 395 -> 379,
413 -> 431 us a request (the four modules without the binding's, 3 + 3 runs: 1.33 ->
1.30, 1.21 -> 1.26, 1.46 -> 1.41): no gain above the runs' spread (+-0.05 to 0.1).
The hashing is hashlib's, and the rest is calls into vLLM's objects and dicts, which
compiled code makes through the same C API as the interpreter.

What breaks, compiled:

* ``govern/vllm/pool.py``, ``govern/vllm/manager.py``: vLLM is not importable where
  mypy runs (kvgov's venv), so their vLLM bases are ``Any`` and the compiled classes
  lose them (``GovernedKVCacheManager`` has no ``reset_prefix_cache``; ``reclass``:
  "object layout differs from 'BlockPool'");
* ``govern/vllm/fence.py``, ``govern/vllm/scheduler.py``: ``fence.SchedulerOverrides``
  and ``GovernedSchedulerMixin`` are mixed into vLLM's interpreted ``Scheduler``:
  "interpreted classes cannot inherit from compiled"; as a plain (non-native) class
  its compiled methods still refuse the scheduler as ``self``;
* ``audit/events.py``: ``trusted_event`` writes ``AuditEvent``'s slots through the
  dataclass's slot descriptors (``AuditEvent.__dict__[name].__set__``), which a
  native class does not have (mypyc: "Cannot access instance attribute "__dict__"
  through class object");
* compiled functions check their annotations at the call: ``Deadlines.keyed`` with
  ``ttl="1"`` raises ``TypeError`` instead of ``InvalidArgument``, and ``ttl=True`` is
  taken as 1.0 (``tests/govern/test_retention.py::test_a_bad_ttl_is_refused``);
* a native class's methods and class attributes cannot be patched: the tests that
  monkeypatch ``VllmGovernance`` (``fold_own_reuse``, ``judge_hit``) fail against a
  compiled ``binding.py`` (``test_event_layout``, ``test_trusted_call_sites``,
  ``test_groups``, ``test_mamba``: 4 of 330 in ``tests/govern/vllm``).

The compiled build must be made by the interpreter (major.minor and ABI) that
imports it, and needs mypy (which brings mypyc) and a C compiler; mypyc's runtime
support is compiled into the group library, nothing else is needed at import.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: paths as the package sees them (``kvgov/govern`` is a link to ``govern``): mypyc
#: names each module from its path, so these must be the ``kvgov`` ones
MODULES = (
    "kvgov/govern/keys.py",
    "kvgov/govern/retention.py",
    "kvgov/govern/ownership.py",
    "kvgov/govern/ledger.py",
    "kvgov/govern/vllm/requests.py",
    "kvgov/govern/vllm/groups.py",
    "kvgov/govern/vllm/binding.py",
)
GROUP = "kvgov"  # the shared library: kvgov__mypyc.<abi>.so at the checkout's root


def compiled_files() -> list[Path]:
    """Every extension module mypyc left in the checkout (kvgov's, and the group library)."""
    found = {p.resolve() for p in REPO.glob(f"{GROUP}__mypyc*.so")}
    for top in ("kvgov", *(p.name for p in (REPO / "kvgov").iterdir() if p.is_symlink())):
        base = REPO / top
        if base.is_dir():
            found.update(p.resolve() for p in base.rglob("*.so"))
    return sorted(found)


def build(modules: list[str]) -> int:
    """Compile ``modules`` in place; returns the exit status."""
    try:
        from mypyc.build import mypycify
        from setuptools import setup  # type: ignore[import-untyped]
    except ImportError as exc:
        print(f"mypyc_build: cannot compile here ({exc}); the pure-Python modules stay in use")
        return 1
    os.chdir(REPO)
    setup(
        name="kvgov-mypyc",
        script_args=["build_ext", "--inplace"],
        ext_modules=mypycify(modules, opt_level="3", group_name=GROUP),
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove every compiled module")
    parser.add_argument("--list", action="store_true", help="list the compiled modules present")
    parser.add_argument("modules", nargs="*", help="kvgov/... module paths (default: the hot set)")
    args = parser.parse_args(argv)
    if args.list:
        for path in compiled_files():
            print(path.relative_to(REPO.resolve()))
        return 0
    if args.clean:
        for path in compiled_files():
            path.unlink()
            print(f"removed {path.relative_to(REPO.resolve())}")
        return 0
    return build(args.modules or list(MODULES))


if __name__ == "__main__":
    sys.exit(main())
