"""Whether this machine could have built kvgov's compiled key chain (govern/_keychain.c)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

from kvgov.govern.keys import NATIVE_KEYCHAIN


def native_keychain_unbuildable() -> str | None:
    """Why this machine could not have built the compiled key chain, or None if it could.

    setup.py builds it where a C compiler, Python's headers and OpenSSL's headers are
    present; there its absence is a broken install, and the tests that need it fail
    instead of skipping.
    """
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler}) to build kvgov.govern._keychain"
    python_h = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not python_h.is_file():
        return f"no Python headers ({python_h}) to build kvgov.govern._keychain"
    include = Path(sysconfig.get_config_var("INCLUDEDIR") or "/usr/include")
    if not any((d / "openssl" / "sha.h").is_file() for d in (include, Path("/usr/include"))):
        return "no OpenSSL headers (openssl/sha.h) to build kvgov.govern._keychain"
    return None


def native_keychain_skip() -> str | None:
    """Why the tests of the compiled key chain skip here (None: they run): it is not
    installed because this machine could not build it."""
    return None if NATIVE_KEYCHAIN else native_keychain_unbuildable()
