"""Loading a Rego bundle: files, data, revision, syntax and compile checks.

A bundle is a directory (default :data:`BUNDLE_DIR`, the package's ``rego/``) of
``*.rego`` modules, ``*_test.rego`` test modules and one ``data.json`` at its top.
Loading reads them all, deep-merges the caller's ``policy_data`` over data.json,
parses and compiles every module with regorus (a syntax or compile error raises
:class:`~kvgov.exceptions.PolicyLoadError` naming file, line and column):
:func:`read_bundle`. Running the bundle's own ``test_`` rules builds on this module:
:func:`kvgov.policy.testing.load_bundle` reads a bundle and refuses it if a test
fails (:class:`~kvgov.exceptions.PolicyTestFailure`).

The bundle revision (byte layout of what is hashed)::

    sha256( for each .rego file, sorted by path relative to the bundle dir:
                relpath UTF-8 || 0x00 || source UTF-8 || 0x00
            || "data.json" || 0x00 || canonical JSON of the merged data )

shown as ``sha256:`` + the first 16 hex digits. Canonical JSON is RFC 8785
(:func:`kvgov.canonical.canonical_json`; for the bundled data.json the same bytes as
the ``json.dumps`` with sorted keys and compact separators used before it). Where the
merged data has a top-level string ``revision`` (set it in data.json or
policy_data), the revision is ``<revision>+sha256:<16 hex>``: the declared name is
kept for people, the hash still changes whenever the content does, so a decision
cache keyed by revision can never serve a decision of other content.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regorus

from kvgov.canonical import CanonicalizationError
from kvgov.canonical import canonical_json as jcs
from kvgov.exceptions import PolicyLoadError

__all__ = [
    "BUNDLE_DIR",
    "Bundle",
    "PolicyFile",
    "canonical_json",
    "deep_merge",
    "read_bundle",
    "regorus_error",
]

#: The bundled policy directory (``policy/rego``).
BUNDLE_DIR = Path(__file__).resolve().parent / "rego"

_LOCATION = re.compile(r"-->\s*(?P<file>.+?):(?P<line>\d+):(?P<col>\d+)")
_MESSAGE = re.compile(r"^error:\s*(?P<msg>.+)$", re.M)


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """One Rego module of a bundle.

    Attributes:
        name: path relative to the bundle directory, ``/``-separated.
        path: the file's full path (used in error messages and by regorus).
        source: the module's text.
    """

    name: str
    path: str
    source: str


@dataclass(frozen=True, slots=True)
class Bundle:
    """A loaded, compiled bundle; immutable once built (do not mutate ``data``).

    Attributes:
        directory: the bundle directory.
        policies: the modules that decide (every ``.rego`` but ``*_test.rego``).
        tests: the ``*_test.rego`` modules.
        base_data: data.json as read (what the bundle's tests run against).
        data: data.json with ``policy_data`` deep-merged over it (what decides).
        data_json: canonical JSON of ``data``.
        revision: the bundle revision (see the module docstring).
    """

    directory: Path
    policies: tuple[PolicyFile, ...]
    tests: tuple[PolicyFile, ...]
    base_data: Mapping[str, Any]
    data: Mapping[str, Any]
    data_json: str
    revision: str

    def new_engine(self, *, with_tests: bool = False) -> Any:
        """Build a fresh regorus Engine holding this bundle (for the calling thread).

        Args:
            with_tests: also load the test modules, with ``base_data`` instead of the
                merged data (as ``opa test`` runs them).

        Returns:
            A ``regorus.Engine``. It is bound to the calling thread (pyo3
            ``unsendable``): use and drop it on that thread only.

        Raises:
            PolicyLoadError: a module does not parse (file, line and column set).
        """
        engine = regorus.Engine()
        files = self.policies + self.tests if with_tests else self.policies
        for f in files:
            try:
                engine.add_policy(f.path, f.source)
            except Exception as exc:
                raise regorus_error(exc, default_file=f.path) from None
        if with_tests:
            engine.add_data_json(canonical_json(self.base_data))
        else:
            engine.add_data_json(self.data_json)
        return engine


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value``: RFC 8785 (:mod:`kvgov.canonical`).

    Args:
        value: a JSON-shaped value.

    Returns:
        The text.

    Raises:
        TypeError: a value is not JSON-serialisable.
        ValueError: a float is NaN or infinite.
    """
    try:
        return jcs(value)
    except CanonicalizationError:
        # RFC 8785 has no form for integers beyond +-(2**53 - 1); policy data and inputs
        # may hold them (OPA takes them), and a revision or a cache key needs only a
        # deterministic text: such values keep the sorted compact json.dumps form.
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``over`` into a copy of ``base``: objects merge key by key, recursively;
    any other value in ``over`` (lists included) replaces the one in ``base``.

    Args:
        base: the data underneath (data.json).
        over: the data on top (policy_data).

    Returns:
        A new dict; neither argument is changed.
    """
    # Kept rather than deepmerge.Merger([(dict, ["merge"])], ["override"], ["override"]):
    # deepmerge merges only dicts (it refuses a Mapping strategy), so policy_data given
    # as another Mapping (a MappingProxyType, a frozen config) would silently replace a
    # whole subtree of data.json instead of merging into it; and it changes its first
    # argument in place, so every load would deep-copy data.json first. These ten
    # lines do exactly the documented merge.
    out: dict[str, Any] = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = deep_merge(below, value)
        else:
            out[key] = value
    return out


def regorus_error(exc: BaseException, *, default_file: str | None = None) -> PolicyLoadError:
    """Turn a regorus error into a :class:`PolicyLoadError` with file, line, column.

    regorus reports ``--> FILE:LINE:COL`` followed by a source excerpt and an
    ``error: MESSAGE`` line (and, depending on the build, a Rust stack backtrace,
    which is dropped).

    Args:
        exc: the exception regorus raised.
        default_file: the file to name when the text carries no location.

    Returns:
        The error to raise.
    """
    text = str(exc).split("Stack backtrace:")[0].strip()
    loc = _LOCATION.search(text)
    msg = _MESSAGE.search(text)
    message = msg.group("msg").strip() if msg else (text or type(exc).__name__)
    if loc is None:
        return PolicyLoadError(message, file=default_file)
    return PolicyLoadError(
        message, file=loc.group("file"), line=int(loc.group("line")), column=int(loc.group("col"))
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyLoadError(f"cannot read: {exc}", file=str(path)) from None


def _read_data(directory: Path) -> dict[str, Any]:
    path = directory / "data.json"
    if not path.exists():
        return {}
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyLoadError(
            f"invalid JSON: {exc.msg}", file=str(path), line=exc.lineno, column=exc.colno
        ) from None
    if not isinstance(data, dict):
        raise PolicyLoadError(
            f"data.json must hold a JSON object, not {type(data).__name__}", file=str(path)
        )
    return data


def _revision(files: tuple[PolicyFile, ...], data: Mapping[str, Any], data_json: str) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        h.update(f.name.encode() + b"\x00" + f.source.encode() + b"\x00")
    h.update(b"data.json\x00" + data_json.encode())
    digest = "sha256:" + h.hexdigest()[:16]
    declared = data.get("revision")
    if isinstance(declared, str) and declared:
        return f"{declared}+{digest}"
    return digest


def _compile_check(bundle: Bundle) -> None:
    """Evaluate every package once so compile errors (unknown functions, conflicting
    rules) surface now, not at the first decision."""
    engine = bundle.new_engine()
    engine.set_input({})
    for package in engine.get_packages():
        try:
            engine.eval_query(str(package))
        except Exception as exc:
            raise regorus_error(exc) from None


def read_bundle(
    policy_dir: str | Path | None = None,
    policy_data: Mapping[str, Any] | None = None,
) -> Bundle:
    """Load and compile a bundle, without running its tests.

    :func:`kvgov.policy.testing.load_bundle` also runs the bundle's tests and refuses
    it if one fails: use that one to activate a bundle.

    Args:
        policy_dir: the bundle directory; None for :data:`BUNDLE_DIR`. Every
            ``*.rego`` below it is loaded (sorted, hidden entries skipped); data
            comes from its top-level ``data.json`` (absent: empty data).
        policy_data: JSON-shaped data deep-merged over data.json (see
            :func:`deep_merge`).

    Returns:
        The bundle.

    Raises:
        PolicyLoadError: a file is unreadable, a module does not parse or compile
            (file, line, column set), data.json is not a JSON object, or
            policy_data is not a JSON-shaped mapping.
    """
    directory = Path(policy_dir) if policy_dir is not None else BUNDLE_DIR
    if not directory.is_dir():
        raise PolicyLoadError(f"policy directory {directory} does not exist")
    policies: list[PolicyFile] = []
    tests: list[PolicyFile] = []
    for path in sorted(directory.rglob("*.rego")):
        rel = path.relative_to(directory)
        if any(part.startswith(".") for part in rel.parts):
            continue
        f = PolicyFile(name=rel.as_posix(), path=str(path), source=_read_text(path))
        (tests if path.name.endswith("_test.rego") else policies).append(f)
    if not policies:
        raise PolicyLoadError(f"no .rego policies in {directory}")
    base = _read_data(directory)
    if policy_data is None:
        merged = base
    elif isinstance(policy_data, Mapping):
        merged = deep_merge(base, policy_data)
    else:
        raise PolicyLoadError(f"policy_data must be a mapping, not {type(policy_data).__name__}")
    try:
        data_json = canonical_json(merged)
    except (TypeError, ValueError) as exc:
        raise PolicyLoadError(f"policy data is not JSON-serialisable: {exc}") from None
    bundle = Bundle(
        directory=directory,
        policies=tuple(policies),
        tests=tuple(tests),
        base_data=base,
        data=merged,
        data_json=data_json,
        revision=_revision(tuple(policies + tests), merged, data_json),
    )
    _compile_check(bundle)
    return bundle
